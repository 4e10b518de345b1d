//! The chain-replication push protocol's decisions, without I/O: what a replica of a
//! replicated table does with a push (the paper's §4.3, `../shared/REFERENCE.md` §1). The
//! server's runtime (`downpour-server`, `repl/push.rs`) receives a push, calls these and
//! executes what they decide over the network; the seeded simulation (`downpour-sim`) drives
//! the very same functions through loss, duplication, reordering and crashes.
//!
//! A push touches one or more shards ([`segments`]). A worker's push is taken only by the
//! head of every shard it touches, a forwarded one only by a replica past the head, and
//! only under the server's current routing epoch ([`check_roles`]: a server left in an
//! older epoch is fenced). Each shard's part is admitted by that shard's watermarks (a
//! retried or duplicated request applies only what it did not apply before) and applied
//! ([`admit_and_apply`]). It is then forwarded whole to the shard's successor, adjacent
//! shards with one successor in one frame ([`Forwarder::plan`]); after the request's last
//! chunk the sender is acknowledged only once every successor that got a part has
//! acknowledged it ([`ChunkPlan::reply_after`]), so a worker's push is acknowledged only
//! once the tail of each chain has it.

use crate::shards::{ShardMap, Watermarks};
use crate::table::Table;
use crate::{CoreError, KeyRange};
use std::ops::Range;

/// The keys of a push: a sorted, duplicate-free key list, or a contiguous range.
#[derive(Clone, Copy, Debug)]
pub enum PushKeys<'a> {
    /// Keys, sorted ascending without duplicates.
    Keys(&'a [u64]),
    /// The keys `[begin, end)`.
    Range(KeyRange),
}

impl PushKeys<'_> {
    /// Number of keys.
    pub fn len(&self) -> usize {
        match self {
            PushKeys::Keys(k) => k.len(),
            PushKeys::Range(r) => (r.end - r.begin) as usize,
        }
    }

    /// True when there is no key.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// Who sent a push and under what, as the chain sees it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PushMeta {
    /// Forwarded by the previous member of the chains (else: a worker's push).
    pub forwarded: bool,
    /// The worker whose push it is (forwarded pushes keep it).
    pub worker: u32,
    /// The worker's request id (forwarded pushes keep it).
    pub request_id: u64,
    /// The routing epoch it was sent under.
    pub epoch: u64,
    /// The table.
    pub table: u32,
}

/// `(shard, index range into the push's keys)` for every shard the push touches, in key
/// order.
pub fn segments(map: &ShardMap, keys: PushKeys<'_>) -> Vec<(usize, Range<usize>)> {
    match keys {
        PushKeys::Keys(k) => map.split_keys(k).collect(),
        PushKeys::Range(span) => {
            map.split_range(span).map(|(sh, k)| (sh, (k.begin - span.begin) as usize..(k.end - span.begin) as usize)).collect()
        }
    }
}

/// Whether server `me`, at routing epoch `epoch`, may take a push sent under `meta.epoch`
/// touching `segments`: the epochs must match (a server of another epoch is fenced), and
/// `me` must head every shard (a worker's push) or be a replica past the head of every
/// shard (a forwarded push). `Err` says why not; the sender is told to refresh its routing.
pub fn check_roles(map: &ShardMap, segments: &[(usize, Range<usize>)], me: u32, meta: &PushMeta, epoch: u64) -> Result<(), String> {
    if meta.epoch != epoch {
        return Err(format!("request for routing epoch {} but this server is at epoch {epoch}", meta.epoch));
    }
    for (shard, _) in segments {
        let pos = map.position(*shard, me);
        let ok = if meta.forwarded { pos.is_some_and(|p| p > 0) } else { pos == Some(0) };
        if !ok {
            let role = if meta.forwarded { "a replica" } else { "the head" };
            return Err(format!("this server is not {role} of shard {shard} of table {} in routing epoch {epoch}", meta.table));
        }
    }
    Ok(())
}

/// Admits each segment of a push by its shard's watermarks and applies what was admitted to
/// `table` (`vals`: `value_len` values per key). Parts applied before under the same worker
/// and request id are skipped, so a retried, duplicated or replayed push is applied exactly
/// once. Preconditions: [`check_roles`] passed under the lock that guards `table` and
/// `marks`; `vals.len()` is `keys.len() × value_len`.
pub fn admit_and_apply(
    table: &mut Table,
    marks: &mut Watermarks,
    meta: &PushMeta,
    keys: PushKeys<'_>,
    vals: &[f32],
    segments: &[(usize, Range<usize>)],
) -> Result<(), CoreError> {
    let vl = table.def().value_len;
    for (shard, range) in segments {
        let (shard, range) = (*shard, range.clone());
        let from = match keys {
            PushKeys::Range(span) => {
                let part = KeyRange::new(span.begin + range.start as u64, span.begin + range.end as u64);
                (marks.admit_range(shard, meta.worker as usize, meta.request_id, part)? - span.begin) as usize - range.start
            }
            PushKeys::Keys(k) => marks.admit(shard, meta.worker as usize, meta.request_id, &k[range.clone()])?,
        };
        let a = range.start + from;
        if a < range.end {
            let v = &vals[a * vl..range.end * vl];
            match keys {
                PushKeys::Range(span) => table.push_range(span.begin + a as u64, v).map(|_| ())?,
                PushKeys::Keys(k) => table.push(&k[a..range.end], v)?,
            }
        }
    }
    Ok(())
}

/// The rest of a failed request is skipped: a request's frames arrive in order on one
/// connection, and once a frame of it was refused (an error answered before its last frame),
/// its remaining frames are dropped unanswered, so no part of a request that was refused is
/// applied or forwarded after the refusal (the sender sends it again whole). One per
/// connection.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Skip(Option<u64>);

impl Skip {
    /// Whether the frame of `request_id` (`last`: the request's last frame) is dropped; the
    /// last frame of the skipped request ends the skip.
    pub fn skips(&mut self, request_id: u64, last: bool) -> bool {
        if self.0 != Some(request_id) {
            return false;
        }
        if last {
            self.0 = None;
        }
        true
    }

    /// A frame of `request_id` was refused: unless it was the request's last, skip the rest.
    pub fn refused(&mut self, request_id: u64, last: bool) {
        if !last {
            self.0 = Some(request_id);
        }
    }
}

/// What a server does with the connection a replicated push came on once the push failed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum AfterFailure {
    /// Answer the error and go on reading the connection (the rest of the request is skipped
    /// by [`Skip`]): the sender does not send the request again.
    GoOn,
    /// Answer the error and close the connection, so none of the requests the sender
    /// pipelined behind the failed one is read.
    Close,
}

/// The rule for a failed push of a replicated table. Exactly-once admission keeps one
/// watermark per (shard, worker): a replica takes a request id at or below it as applied.
/// That is sound only if every replica sees a worker's requests in order. A request the
/// sender will send again (`retried`: refused for a stale epoch, or forwarded to a successor
/// that refused it, failed or did not answer) breaks that order if any later request of the
/// same sender is admitted before the retry: the later one raises the watermarks past it,
/// at this server or (forwarded) at a successor, and the retry is taken as a duplicate
/// there, so its update is lost on that replica. The requests behind it on the connection
/// (the client pipelines them) could be admitted: a server at an older epoch than the worker
/// refuses request k, moves on, and admits k + 1; a successor that refused k may take k + 1.
/// So such a connection is closed after the answer: the sender reconnects and sends
/// everything unfinished again in order, and the failed request comes first. A failure the
/// sender does not retry (a bad key, a quota) loses nothing by going on, and closing
/// would turn a clear error into a lost connection.
pub fn after_failure(retried: bool) -> AfterFailure {
    if retried {
        AfterFailure::Close
    } else {
        AfterFailure::GoOn
    }
}

/// One frame to forward: the push's keys `[a, b)` (indices into the request) to server
/// `to`; `last` closes the request at `to`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Frame {
    /// The successor.
    pub to: u32,
    /// First index into the push's keys.
    pub a: usize,
    /// One past the last index.
    pub b: usize,
    /// The last frame of the request to `to`.
    pub last: bool,
}

/// What to send for one chunk of a push, and when to answer its sender.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ChunkPlan {
    /// Frames with parts of the chunk, in order.
    pub frames: Vec<Frame>,
    /// Successors that got parts of earlier chunks only: an empty frame with `last` closes
    /// the request there.
    pub close: Vec<u32>,
    /// `None` before the request's last chunk (no answer yet). After it, the successors
    /// whose acknowledgements must all arrive before the sender is acknowledged: every one
    /// that got a part of the request. Empty for the tail, which answers at once.
    pub reply_after: Option<Vec<u32>>,
}

/// The forwarding state of one connection's pushes (a request's chunks arrive in order on
/// one connection): the successors that got frames of the current request's earlier chunks.
#[derive(Clone, Debug, Default)]
pub struct Forwarder {
    touched: Vec<u32>,
}

impl Forwarder {
    /// Forgets the request under way (after a failure, or a change of epoch).
    pub fn reset(&mut self) {
        self.touched.clear();
    }

    /// The successors that got frames of the request under way, still open there (a round's
    /// update frames before its watermarks frame closes them); forgets them.
    pub fn take_open(&mut self) -> Vec<u32> {
        std::mem::take(&mut self.touched)
    }

    /// Plans the forwards of one chunk of a push that touched `segments` at server `me`
    /// (`last`: the request's last chunk). Each run of adjacent segments with one successor
    /// is one frame; on the last chunk the last frame to each successor carries `last`
    /// itself, and successors that got earlier chunks only get an empty closing frame.
    pub fn plan(&mut self, map: &ShardMap, segments: &[(usize, Range<usize>)], me: u32, last: bool) -> ChunkPlan {
        let mut runs: Vec<(u32, usize, usize)> = Vec::new();
        let mut i = 0;
        while i < segments.len() {
            let next = map.successor(segments[i].0, me);
            let mut j = i + 1;
            while j < segments.len() && map.successor(segments[j].0, me) == next && segments[j].1.start == segments[j - 1].1.end {
                j += 1;
            }
            if let Some(next) = next {
                runs.push((next, segments[i].1.start, segments[j - 1].1.end));
            }
            i = j;
        }
        let mut frames = Vec::with_capacity(runs.len());
        let mut closed: Vec<u32> = Vec::new();
        for (f, &(to, a, b)) in runs.iter().enumerate() {
            let is_last = last && !runs[f + 1..].iter().any(|x| x.0 == to);
            frames.push(Frame { to, a, b, last: is_last });
            if is_last {
                closed.push(to);
            } else if !self.touched.contains(&to) {
                self.touched.push(to);
            }
        }
        if !last {
            return ChunkPlan { frames, close: Vec::new(), reply_after: None };
        }
        let close: Vec<u32> = std::mem::take(&mut self.touched).into_iter().filter(|n| !closed.contains(n)).collect();
        closed.extend(close.iter().copied());
        ChunkPlan { frames, close, reply_after: Some(closed) }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ring::Ring;
    use crate::rule::RuleRegistry;

    fn map(k: usize) -> ShardMap {
        let ring = Ring::with_members(4, [1, 2, 3], 1);
        ShardMap::new(&ring, KeyRange::FULL, 8, k)
    }

    fn table() -> Table {
        Table::new(crate::table::tests::def(None, 1, "add"), KeyRange::FULL, &RuleRegistry::new()).unwrap()
    }

    fn meta(forwarded: bool, epoch: u64) -> PushMeta {
        PushMeta { forwarded, worker: 0, request_id: 1, epoch, table: 1 }
    }

    #[test]
    fn only_the_head_takes_a_workers_push_and_only_replicas_a_forwarded_one_in_the_same_epoch() {
        let m = map(2);
        let keys = [m.range(0).begin];
        let seg = segments(&m, PushKeys::Keys(&keys));
        let chain = m.chain(0).to_vec();
        assert!(check_roles(&m, &seg, chain[0], &meta(false, 1), 1).is_ok());
        assert!(check_roles(&m, &seg, chain[1], &meta(false, 1), 1).is_err());
        assert!(check_roles(&m, &seg, chain[1], &meta(true, 1), 1).is_ok());
        assert!(check_roles(&m, &seg, chain[0], &meta(true, 1), 1).is_err());
        let e = check_roles(&m, &seg, chain[0], &meta(false, 1), 2).unwrap_err();
        assert!(e.contains("epoch"), "{e}");
    }

    #[test]
    fn the_rest_of_a_refused_request_is_skipped_until_its_last_frame() {
        let mut s = Skip::default();
        assert!(!s.skips(7, false));
        s.refused(7, false);
        assert!(s.skips(7, false), "a later frame of the refused request");
        assert!(!s.skips(8, false), "another request's frames are not skipped");
        assert!(s.skips(7, true), "its last frame is dropped too");
        assert!(!s.skips(7, false), "then the skip is over");
        s.refused(9, true);
        assert!(!s.skips(9, true), "a refused last frame leaves nothing to skip");
    }

    #[test]
    fn a_repeated_push_is_applied_once() {
        let m = map(2);
        let mut t = table();
        let mut marks = Watermarks::new(m.len(), 1);
        let keys: Vec<u64> = (0..8).map(|s| m.range(s).begin).collect();
        let seg = segments(&m, PushKeys::Keys(&keys));
        for _ in 0..3 {
            admit_and_apply(&mut t, &mut marks, &meta(false, 1), PushKeys::Keys(&keys), &[1.0; 8], &seg).unwrap();
        }
        let mut out = vec![0f32; 8];
        t.pull(&keys, &mut out).unwrap();
        assert_eq!(out, vec![1.0; 8]);
    }

    #[test]
    fn the_sender_is_answered_after_every_successor_that_got_a_part_and_the_tail_at_once() {
        let m = map(2);
        let keys: Vec<u64> = (0..8).map(|s| m.range(s).begin).collect();
        let seg = segments(&m, PushKeys::Keys(&keys));
        let me = m.chain(0)[0];
        let mine: Vec<_> = seg.iter().filter(|(s, _)| m.position(*s, me) == Some(0)).cloned().collect();
        let mut f = Forwarder::default();
        // an earlier chunk goes to the successors without closing the request
        let first = f.plan(&m, &mine, me, false);
        assert!(first.reply_after.is_none() && first.frames.iter().all(|x| !x.last));
        // the last chunk touches nothing: the successors of the first are closed and awaited
        let last = f.plan(&m, &[], me, true);
        let mut want: Vec<u32> = first.frames.iter().map(|x| x.to).collect();
        want.sort_unstable();
        want.dedup();
        let mut close = last.close.clone();
        close.sort_unstable();
        assert_eq!(close, want);
        let mut after = last.reply_after.unwrap();
        after.sort_unstable();
        assert_eq!(after, want);
        // at the tail of every shard nothing is forwarded and the answer is immediate
        let tail_m = map(1);
        let plan = Forwarder::default().plan(&tail_m, &segments(&tail_m, PushKeys::Keys(&keys)), 1, true);
        assert!(plan.frames.is_empty() && plan.reply_after == Some(vec![]));
    }
}
