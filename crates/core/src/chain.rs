//! Chain replication with exactly-once updates, as plain data (issue 6; the paper's §4.3 in
//! `../shared/REFERENCE.md` §1). A replicated key range has a chain of servers (from
//! [`crate::ring`]), head first. A worker sends an update, tagged with its id and a
//! per-worker sequence number, to the head; every replica applies it once and forwards it to
//! its successor; the tail acknowledges to the worker. So an acknowledged update is on every
//! replica of the chain.
//!
//! * **Exactly once.** Each replica keeps, per worker, the highest sequence number it applied
//!   (its entry of the vector clock). A worker has one update of a range outstanding at a
//!   time and retries it unchanged (same sequence number) after a timeout or a stale-epoch
//!   answer; a replica that has it already does not apply it again but still forwards it,
//!   so a replica further down that missed it (a lost forward) catches up, and the tail
//!   acknowledges.
//! * **Fencing.** Every message carries the configuration epoch it was sent under; a replica
//!   refuses anything from another epoch. A head that was removed from the chain (declared
//!   dead but only cut off) keeps the old epoch: its forwards are refused by the live
//!   replicas, so it can never get an update acknowledged.
//! * **Fail-over and new replicas.** The coordinator removes a dead server in a new epoch: the
//!   next server becomes head; a new server joins as the tail with a copy of the current
//!   tail's state (values and vector clock), which has every acknowledged update. Updates in
//!   flight under the old epoch are refused and retried by their workers.
//!
//! `Replica` is the per-range state and the rules above; the tests drive a seeded
//! simulation of servers, workers and a lossy, duplicating, reordering network through them.

/// One update of a replicated range: `delta` added at `offset` (an index into the range).
#[derive(Clone, Debug, PartialEq)]
pub struct Update {
    /// Worker id (index into the vector clock).
    pub worker: u32,
    /// The worker's sequence number for this range, from 1, consecutive.
    pub seq: u64,
    /// First element updated.
    pub offset: usize,
    /// Values added from `offset`.
    pub delta: Vec<f32>,
}

/// What a replica did with an update.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Outcome {
    /// Applied now: forward it (or acknowledge it at the tail).
    Applied,
    /// Applied before: forward it anyway (or acknowledge it at the tail).
    Duplicate,
    /// An earlier update of the same worker is missing here: refused, the worker retries
    /// from `expected`.
    Gap {
        /// The sequence number this replica applies next for the worker.
        expected: u64,
    },
    /// Sent under another configuration epoch: refused (fencing).
    StaleEpoch {
        /// This replica's epoch.
        current: u64,
    },
    /// Outside the range: refused.
    OutOfRange,
}

impl Outcome {
    /// True when the update is (now or already) in this replica and goes on down the chain.
    pub fn passes(self) -> bool {
        matches!(self, Outcome::Applied | Outcome::Duplicate)
    }
}

/// One replica of one range: its values, its vector clock and its epoch.
#[derive(Clone, Debug, PartialEq)]
pub struct Replica {
    epoch: u64,
    values: Vec<f32>,
    /// Per worker: the highest sequence number applied.
    clock: Vec<u64>,
}

impl Replica {
    /// A fresh replica of a range of `len` values (zeros) for `workers` workers at `epoch`.
    pub fn new(len: usize, workers: usize, epoch: u64) -> Replica {
        Replica { epoch, values: vec![0.0; len], clock: vec![0; workers] }
    }

    /// The configuration epoch this replica serves.
    pub fn epoch(&self) -> u64 {
        self.epoch
    }

    /// Moves to a newer configuration epoch (older ones are ignored).
    pub fn set_epoch(&mut self, epoch: u64) {
        self.epoch = self.epoch.max(epoch);
    }

    /// The values.
    pub fn values(&self) -> &[f32] {
        &self.values
    }

    /// The vector clock: per worker, the highest sequence number applied.
    pub fn clock(&self) -> &[u64] {
        &self.clock
    }

    /// A copy for a new replica joining the chain at `epoch` (values and vector clock).
    pub fn copy_for(&self, epoch: u64) -> Replica {
        Replica { epoch, values: self.values.clone(), clock: self.clock.clone() }
    }

    /// Applies `u`, sent under `epoch`, unless it is stale, a duplicate, out of order or out
    /// of range (see [`Outcome`]). Changes nothing unless the outcome is `Applied`.
    pub fn apply(&mut self, epoch: u64, u: &Update) -> Outcome {
        if epoch != self.epoch {
            return Outcome::StaleEpoch { current: self.epoch };
        }
        let w = u.worker as usize;
        if w >= self.clock.len() {
            self.clock.resize(w + 1, 0);
        }
        let Some(end) = u.offset.checked_add(u.delta.len()).filter(|&e| e <= self.values.len()) else {
            return Outcome::OutOfRange;
        };
        let have = self.clock[w];
        if u.seq <= have {
            return Outcome::Duplicate;
        }
        if u.seq != have + 1 {
            return Outcome::Gap { expected: have + 1 };
        }
        for (v, d) in self.values[u.offset..end].iter_mut().zip(&u.delta) {
            *v += *d;
        }
        self.clock[w] = u.seq;
        Outcome::Applied
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::{BTreeMap, VecDeque};

    #[test]
    fn a_replica_applies_each_update_once_in_order_and_refuses_other_epochs() {
        let mut r = Replica::new(4, 2, 7);
        let u = |seq, off| Update { worker: 1, seq, offset: off, delta: vec![1.0, 2.0] };
        assert_eq!(r.apply(7, &u(1, 0)), Outcome::Applied);
        assert_eq!(r.apply(7, &u(1, 0)), Outcome::Duplicate);
        assert_eq!(r.apply(7, &u(3, 0)), Outcome::Gap { expected: 2 });
        assert_eq!(r.apply(6, &u(2, 0)), Outcome::StaleEpoch { current: 7 });
        assert_eq!(r.apply(7, &u(2, 3)), Outcome::OutOfRange);
        assert_eq!(r.apply(7, &u(2, 2)), Outcome::Applied);
        assert_eq!(r.values(), &[1.0, 2.0, 1.0, 2.0]);
        assert_eq!(r.clock(), &[0, 2]);
        let c = r.copy_for(8);
        assert_eq!((c.values(), c.clock(), c.epoch()), (r.values(), r.clock(), 8));
    }

    // ---- a seeded simulation of the protocol ----

    #[derive(Clone, Debug)]
    enum Msg {
        /// worker → head
        Write { to: u32, epoch: u64, u: Update },
        /// replica → successor; `via_stale`: the path went through the cut-off old head
        Forward { to: u32, epoch: u64, u: Update, via_stale: bool },
        /// tail → worker
        Ack { worker: u32, seq: u64, via_stale: bool },
    }

    struct Rng(u64);
    impl Rng {
        fn next(&mut self) -> u64 {
            self.0 = crate::init::splitmix64(self.0);
            self.0
        }
        fn below(&mut self, n: u64) -> u64 {
            self.next() % n.max(1)
        }
        fn chance(&mut self, p: f64) -> bool {
            (self.next() >> 11) as f64 / (1u64 << 53) as f64 <= p
        }
    }

    struct Worker {
        /// next sequence number to send (1-based); `done` when past `pushes`
        seq: u64,
        outstanding: Option<(Update, u64)>, // (update, step sent)
        view: (u64, Vec<u32>),              // routing: (epoch, chain)
    }

    struct Faults {
        crashes: usize,
        partition: bool,
        join_and_drain: bool,
        loss: f64,
        dup: f64,
    }

    /// Runs one seeded simulation; returns the final chain's replicas, the expected values,
    /// the reconfigurations and the acknowledgements of updates that went through the
    /// cut-off old head.
    fn simulate(seed: u64, k: usize, f: &Faults) -> (Vec<Replica>, Vec<f32>, usize, usize) {
        let mut rng = Rng(seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) ^ 0x5151);
        const LEN: usize = 8;
        let workers = 1 + rng.below(3) as usize;
        let pushes = 20 + rng.below(30);
        let servers = k + f.crashes + 2; // spares to rebuild from
        let mut epoch = 1u64;
        let mut chain: Vec<u32> = (0..k as u32).collect();
        let mut spare: VecDeque<u32> = (k as u32..servers as u32).collect();
        let mut replicas: BTreeMap<u32, Replica> = chain.iter().map(|&s| (s, Replica::new(LEN, workers, epoch))).collect();
        let mut dead: Vec<u32> = Vec::new();
        // a server cut off from the coordinator: it stays at its epoch and keeps serving
        let mut cut_off: Option<u32> = None;
        let mut pending_removal: Option<(u32, u64)> = None; // (server, step the coordinator notices)
        let mut w: Vec<Worker> = (0..workers).map(|_| Worker { seq: 1, outstanding: None, view: (epoch, chain.clone()) }).collect();
        let mut net: Vec<Msg> = Vec::new();
        let mut expected = vec![0f32; LEN];
        let (mut crashes_left, mut partition_left, mut joined, mut drained) = (f.crashes, f.partition, false, false);
        let timeout = 40;
        let mut step = 0u64;
        let mut reconfigs = 0usize;
        let mut stale_acks = 0usize;
        let reconfigure = |chain: &mut Vec<u32>,
                           replicas: &mut BTreeMap<u32, Replica>,
                           spare: &mut VecDeque<u32>,
                           epoch: &mut u64,
                           remove: Option<u32>,
                           cut_off: Option<u32>| {
            *epoch += 1;
            if let Some(s) = remove {
                chain.retain(|&x| x != s);
            }
            // every server still in the chain learns the new epoch (the cut-off one does not)
            for s in chain.iter() {
                if Some(*s) != cut_off {
                    if let Some(r) = replicas.get_mut(s) {
                        r.set_epoch(*epoch);
                    }
                }
            }
            // rebuild to k copies from the tail, which has every acknowledged update
            while chain.len() < k {
                let Some(new) = spare.pop_front() else { break };
                let tail = *chain.last().expect("a chain keeps a live replica");
                let copy = replicas[&tail].copy_for(*epoch);
                replicas.insert(new, copy);
                chain.push(new);
            }
        };
        loop {
            step += 1;
            assert!(step < 200_000, "seed {seed}: no progress");
            // workers send or retry
            for (i, wk) in w.iter_mut().enumerate() {
                if let Some((u, sent)) = &wk.outstanding {
                    if step - *sent > timeout {
                        // timeout: refresh the routing table, resend the same update
                        wk.view = (epoch, chain.clone());
                        let u = u.clone();
                        net.push(Msg::Write { to: wk.view.1[0], epoch: wk.view.0, u: u.clone() });
                        wk.outstanding = Some((u, step));
                    }
                } else if wk.seq <= pushes {
                    let offset = rng.below(LEN as u64 - 1) as usize;
                    let u = Update { worker: i as u32, seq: wk.seq, offset, delta: vec![1.0, 0.5] };
                    net.push(Msg::Write { to: wk.view.1[0], epoch: wk.view.0, u: u.clone() });
                    wk.outstanding = Some((u, step));
                }
            }
            if w.iter().all(|wk| wk.seq > pushes && wk.outstanding.is_none()) && pending_removal.is_none() {
                break;
            }
            // faults
            if crashes_left > 0 && chain.len() > 1 && pending_removal.is_none() && rng.chance(0.01) {
                let victim = chain[rng.below(chain.len() as u64) as usize];
                dead.push(victim);
                crashes_left -= 1;
                pending_removal = Some((victim, step + 5 + rng.below(20)));
            }
            if partition_left && chain.len() > 1 && pending_removal.is_none() && rng.chance(0.01) {
                // the head is cut off from the coordinator (not from workers): declared dead
                let head = chain[0];
                cut_off = Some(head);
                partition_left = false;
                pending_removal = Some((head, step + 5));
            }
            if let Some((s, at)) = pending_removal {
                if step >= at {
                    reconfigure(&mut chain, &mut replicas, &mut spare, &mut epoch, Some(s), cut_off);
                    reconfigs += 1;
                    pending_removal = None;
                }
            }
            if f.join_and_drain && !joined && step > 50 && rng.chance(0.02) {
                // a new server joins: appended as tail with a copy (k + 1 copies for a while)
                if let Some(new) = spare.pop_front() {
                    epoch += 1;
                    let tail = *chain.last().expect("non-empty chain");
                    let copy = replicas[&tail].copy_for(epoch);
                    for s in chain.iter() {
                        if let Some(r) = replicas.get_mut(s) {
                            r.set_epoch(epoch);
                        }
                    }
                    replicas.insert(new, copy);
                    chain.push(new);
                    reconfigs += 1;
                }
                joined = true;
            }
            if f.join_and_drain && joined && !drained && chain.len() > k && rng.chance(0.02) {
                // drain the head: it leaves the chain in a new epoch and exits
                let head = chain[0];
                reconfigure(&mut chain, &mut replicas, &mut spare, &mut epoch, Some(head), cut_off);
                dead.push(head);
                drained = true;
                reconfigs += 1;
            }
            // the network delivers one message (any of those in flight: reordering)
            if net.is_empty() {
                continue;
            }
            let m = net.swap_remove(rng.below(net.len() as u64) as usize);
            if rng.chance(f.loss) {
                continue;
            }
            if rng.chance(f.dup) {
                net.push(m.clone());
            }
            match m {
                Msg::Write { to, epoch: e, u } => deliver(to, e, u, false, &dead, &mut replicas, &chain, cut_off, &mut net),
                Msg::Forward { to, epoch: e, u, via_stale } => {
                    deliver(to, e, u, via_stale, &dead, &mut replicas, &chain, cut_off, &mut net)
                }
                Msg::Ack { worker, seq, via_stale } => {
                    let wk = &mut w[worker as usize];
                    if let Some((u, _)) = &wk.outstanding {
                        if u.seq == seq {
                            stale_acks += usize::from(via_stale);
                            for (i, d) in u.delta.iter().enumerate() {
                                expected[u.offset + i] += d;
                            }
                            wk.outstanding = None;
                            wk.seq += 1;
                        }
                    }
                }
            }
        }
        let finals = chain.iter().map(|s| replicas[s].clone()).collect();
        (finals, expected, reconfigs, stale_acks)
    }

    /// A replica receives an update: applies it, then forwards it down its chain or, at the
    /// tail, acknowledges it. The cut-off old head still believes it heads a chain whose
    /// next server is the current head.
    #[allow(clippy::too_many_arguments)]
    fn deliver(
        to: u32,
        e: u64,
        u: Update,
        via_stale: bool,
        dead: &[u32],
        replicas: &mut BTreeMap<u32, Replica>,
        chain: &[u32],
        cut_off: Option<u32>,
        net: &mut Vec<Msg>,
    ) {
        if dead.contains(&to) {
            return;
        }
        let Some(r) = replicas.get_mut(&to) else { return };
        if !r.apply(e, &u).passes() {
            return;
        }
        let stale = via_stale || Some(to) == cut_off;
        match chain.iter().position(|&s| s == to).filter(|_| Some(to) != cut_off) {
            Some(p) if p + 1 < chain.len() => net.push(Msg::Forward { to: chain[p + 1], epoch: r.epoch(), u, via_stale: stale }),
            Some(_) => net.push(Msg::Ack { worker: u.worker, seq: u.seq, via_stale: stale }),
            None => {
                if let Some(next) = chain.first() {
                    net.push(Msg::Forward { to: *next, epoch: r.epoch(), u, via_stale: true });
                }
            }
        }
    }

    fn check(seed: u64, k: usize, f: &Faults) -> usize {
        let (finals, expected, reconfigs, stale_acks) = simulate(seed, k, f);
        assert_eq!(stale_acks, 0, "seed {seed}: an update that went through the fenced old head was acknowledged");
        assert!(!finals.is_empty());
        for r in &finals {
            assert_eq!(r.values(), &expected[..], "seed {seed}: a replica lost or doubled an update");
            assert_eq!(r.clock(), finals[0].clock(), "seed {seed}: replicas disagree on the vector clock");
        }
        assert!(finals.len() >= k, "seed {seed}: the chain was rebuilt to {k} copies");
        reconfigs
    }

    #[test]
    fn crashes_loss_duplication_and_reordering_never_lose_or_double_an_update() {
        let mut reconfigs = 0;
        for seed in 0..300 {
            for k in [2, 3] {
                let f = Faults { crashes: k - 1, partition: false, join_and_drain: false, loss: 0.05, dup: 0.05 };
                reconfigs += check(seed, k, &f);
            }
        }
        assert!(reconfigs > 200, "the simulations exercised fail-over ({reconfigs} reconfigurations)");
    }

    #[test]
    fn a_cut_off_old_head_cannot_get_an_update_acknowledged() {
        let mut reconfigs = 0;
        for seed in 0..300 {
            let f = Faults { crashes: 0, partition: true, join_and_drain: false, loss: 0.02, dup: 0.02 };
            reconfigs += check(seed, 2, &f);
        }
        assert!(reconfigs > 100, "{reconfigs} reconfigurations");
    }

    #[test]
    fn a_server_joining_and_one_draining_lose_and_double_nothing() {
        let mut reconfigs = 0;
        for seed in 0..300 {
            let f = Faults { crashes: 1, partition: false, join_and_drain: true, loss: 0.03, dup: 0.03 };
            reconfigs += check(seed, 2, &f);
        }
        assert!(reconfigs > 300, "{reconfigs} reconfigurations");
    }
}
