//! `train mf --data-parallel`: the baseline without a schedule. Each worker runs SGD over
//! its own share of the ratings (every W-th, in a seeded shuffled order) in minibatches:
//! it pulls the minibatch's user and item rows, makes one pass, and pushes the change, with
//! no round and no barrier until the epoch ends (Downpour SGD on the same model and
//! tables). Two workers may change the same rows at once; the servers add both changes, so
//! nothing is lost, but each was computed from values the other was changing.

use super::sgd::{sgd, RatingIdx, Snapshot, Step};
use super::{Timing, ITEMS, ITEM_BIAS, USERS, USER_BIAS};
use anyhow::Result;
use downpour_core::init::SplitMix;
use downpour_core::keys::scramble;
use downpour_data::ratings::Ratings;
use downpour_worker::WorkerSession;
use std::time::Instant;

/// One minibatch: its ratings as indices into its distinct users and items (sorted keys).
struct Batch {
    ratings: RatingIdx,
    users: Vec<u64>,
    items: Vec<u64>,
    /// `0..users.len()` and `0..items.len()`: every row of the batch is pushed.
    user_idx: Vec<u32>,
    item_idx: Vec<u32>,
}

/// A worker's share, cut into minibatches, and the rows of the one being worked on.
pub(super) struct Share {
    batches: Vec<Batch>,
    step: Step,
    slow: f64,
    rows: [Vec<f32>; 4],
    snaps: [Snapshot; 4],
}

impl Share {
    pub fn new(r: &Ratings, rank: usize, workers: usize, batch: usize, seed: u64, step: Step, slow: f64) -> Share {
        let mut mine: Vec<usize> = (rank..r.len()).step_by(workers).collect();
        let mut rng = SplitMix::new(seed ^ 0xDA7A ^ rank as u64);
        for i in (1..mine.len()).rev() {
            mine.swap(i, rng.below(i as u64 + 1) as usize);
        }
        let batches = mine
            .chunks(batch.max(1))
            .map(|c| {
                let keys = |ids: &[u64]| {
                    let mut v: Vec<u64> = c.iter().map(|&i| scramble(ids[i])).collect();
                    v.sort_unstable();
                    v.dedup();
                    v
                };
                let (users, items) = (keys(&r.users), keys(&r.items));
                let mut ratings = RatingIdx::default();
                for &i in c {
                    let u = users.binary_search(&scramble(r.users[i])).unwrap_or(0) as u32;
                    let v = items.binary_search(&scramble(r.items[i])).unwrap_or(0) as u32;
                    ratings.push(u, v, r.values[i]);
                }
                Batch { ratings, user_idx: (0..users.len() as u32).collect(), item_idx: (0..items.len() as u32).collect(), users, items }
            })
            .collect();
        Share { batches, step, slow, rows: Default::default(), snaps: Default::default() }
    }

    /// One pass over the share.
    pub fn epoch(&mut self, s: &mut WorkerSession, t: &mut Timing) -> Result<()> {
        let k = self.step.k;
        for b in &self.batches {
            let tc = Instant::now();
            // the four reads go out together
            let tickets = [
                s.kv.pull(USERS, &b.users)?,
                s.kv.pull(USER_BIAS, &b.users)?,
                s.kv.pull(ITEMS, &b.items)?,
                s.kv.pull(ITEM_BIAS, &b.items)?,
            ];
            for (rows, x) in self.rows.iter_mut().zip(tickets) {
                *rows = s.kv.wait_values(x)?;
            }
            let [p, bu, q, bi] = &mut self.rows;
            t.comm += tc.elapsed();
            let ts = Instant::now();
            let [sp, sbu, sq, sbi] = &mut self.snaps;
            sp.take(p, &b.user_idx, k);
            sbu.take(bu, &b.user_idx, 1);
            sq.take(q, &b.item_idx, k);
            sbi.take(bi, &b.item_idx, 1);
            sgd(&b.ratings, self.step, p, bu, q, bi);
            let mut sum = 0f64;
            let (dp, dbu) = (sp.delta(p, &b.user_idx, k, &mut sum), sbu.delta(bu, &b.user_idx, 1, &mut sum));
            let (dq, dbi) = (sq.delta(q, &b.item_idx, k, &mut sum), sbi.delta(bi, &b.item_idx, 1, &mut sum));
            t.straggle(ts.elapsed(), self.slow);
            let tc = Instant::now();
            let tickets = [
                s.kv.push(USERS, &b.users, dp)?,
                s.kv.push(USER_BIAS, &b.users, dbu)?,
                s.kv.push(ITEMS, &b.items, dq)?,
                s.kv.push(ITEM_BIAS, &b.items, dbi)?,
            ];
            for x in tickets {
                s.kv.wait(x)?;
            }
            t.comm += tc.elapsed();
        }
        Ok(())
    }
}
