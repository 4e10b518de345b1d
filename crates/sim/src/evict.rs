//! Eviction runs: the heads drop rows and the chains carry the drops, every decision
//! through `core::chain_evict` as the runtime's `evict.rs` (the evictor) and
//! `repl/drops.rs` (a drop received, a push to a dropped row held) take them. What this
//! file adds is what the runtime does with threads: a server's evictor sends the drops it
//! holds on a connection of its own and reads their answers, and a frame that waits (a
//! push for a drop, a drop for the updates before it) holds its connection until it goes
//! on or its wait times out.

use super::*;
use downpour_core::chain_evict::{self, DropNext, DropState};

/// How often a server's evictor runs.
pub(crate) const EVICT_EVERY: u64 = 40;
/// Rounds an evictor makes after every worker finished, to send the drops it still holds.
const ROUNDS_AFTER_DONE: u64 = 200;
/// How long a worker's push waits for the drop of a row it touches (the runtime's `DROP_WAIT`).
pub(crate) const PUSH_WAIT: u64 = FWD_TIMEOUT / 2;
/// How long a drop waits for the updates before it (the runtime's `COVER_WAIT`): briefly,
/// for an update still on its way on another connection. A drop holds its connection while
/// it waits, and the drops of other shards behind it wait too; a drop refused comes again
/// with the evictor's next round.
const COVER_WAIT: u64 = FWD_TIMEOUT / 10;
/// Drops travel as requests `DROP_REQUEST | shard << 32 | seq`.
const DROP_REQUEST: u64 = 1 << 62;

/// A server's evictor: its connection to the successors (a new one after a failure) and
/// the drops whose answers it waits for.
pub(crate) struct Evictor {
    id: u32,
    gen: u64,
    waiting: Vec<(usize, u64)>,
    deadline: u64,
    rounds_after_done: u64,
}

impl Evictor {
    pub(crate) fn new(id: u32) -> Evictor {
        Evictor { id, gen: 0, waiting: Vec::new(), deadline: 0, rounds_after_done: 0 }
    }

    /// The connection it sends on now.
    pub(crate) fn conn(&self) -> u64 {
        splitmix64(0xE71C_0000_0000 ^ (self.id as u64) << 20 ^ self.gen)
    }
}

/// The frame header of `drop` under `epoch`.
fn drop_meta(d: &RowDrop, epoch: u64) -> PushMeta {
    PushMeta { forwarded: true, worker: 0, request_id: DROP_REQUEST | (d.shard as u64) << 32 | d.seq, epoch, table: TABLE }
}

impl Sim {
    /// A round of server `id`'s evictor: unless answers are still awaited, drop a few rows
    /// of the shards it heads now and then, and send every drop it holds to its successor.
    pub(crate) fn evict_tick(&mut self, id: u32) -> Result<(), Violation> {
        let all_done = self.workers.iter().all(|w| w.done);
        let slot = self.cfg.workers;
        let Some(s) = self.servers.get_mut(&id) else { return Ok(()) };
        if !s.alive {
            return Ok(());
        }
        let e = &mut s.evictor;
        if !e.waiting.is_empty() && self.now >= e.deadline {
            // answers overdue: a new connection (the runtime's read times out)
            e.waiting.clear();
            e.gen += 1;
        }
        if e.waiting.is_empty() {
            // (only once every member of its epoch has its copies)
            if !all_done && s.epoch_served && self.rng.chance(0.4) {
                // a pass: a few rows of half the keys, of the shards this server heads
                let n = 1 + self.rng.below(3) as usize;
                let mut keys: Vec<u64> = (0..n)
                    .map(|_| self.universe[2 * self.rng.below((self.universe.len() as u64).div_ceil(2)) as usize % self.universe.len()])
                    .filter(|&k| s.map.shard_of(k).is_some_and(|sh| s.map.position(sh, id) == Some(0)))
                    .collect();
                keys.sort_unstable();
                keys.dedup();
                // the rows there are (as the runtime's pass reports them)
                keys.retain(|k| s.table.drop_rows(std::slice::from_ref(k)) == 1);
                if !keys.is_empty() {
                    let max_keys = 1 + self.rng.below(2) as usize;
                    s.drops.record_dropped(&s.map, id, &mut keys, &mut s.marks, slot, max_keys).map_err(|e| Violation(e.to_string()))?;
                    self.out.drops += 1;
                    self.dropped_keys.extend(keys);
                }
            }
            let before = s.drops.len();
            let sends = s.drops.to_send(&s.map, id, |sh| chain_evict::settled(&s.data_map, &s.map, sh));
            let forgot = s.drops.len() < before;
            let (conn, epoch) = (s.evictor.conn(), s.epoch);
            let mut sent = Vec::new();
            let mut broken = false;
            for (to, d) in sends {
                let (shard, seq, meta) = (d.shard, d.seq, drop_meta(&d, epoch));
                let msg = Msg::Push { conn, sender: id, op: FrameOp::Drop(d), meta, last: true, keys: Vec::new(), vals: Vec::new() };
                if !self.send(Node::Server(id), Node::Server(to), msg) {
                    broken = true;
                    break;
                }
                sent.push((shard, seq));
            }
            let e = &mut self.servers.get_mut(&id).expect("present").evictor;
            if broken {
                e.gen += 1;
            }
            e.waiting = sent;
            e.deadline = self.now + FWD_TIMEOUT;
            if forgot {
                self.wake_later(id);
            }
        }
        let s = self.servers.get_mut(&id).expect("present");
        if all_done {
            s.evictor.rounds_after_done += 1;
        }
        if !all_done || (!s.drops.is_empty() && s.evictor.rounds_after_done < ROUNDS_AFTER_DONE) {
            self.schedule(self.now + EVICT_EVERY, Node::Server(id), Node::Server(id), Msg::EvictTick);
        }
        Ok(())
    }

    /// An answer to a drop server `id`'s evictor sent.
    pub(crate) fn evictor_ack(&mut self, id: u32, meta: PushMeta, result: Result<(), Failure>) -> Result<(), Violation> {
        let s = self.servers.get_mut(&id).expect("present");
        let (shard, seq) = (((meta.request_id & !DROP_REQUEST) >> 32) as usize, meta.request_id & 0xFFFF_FFFF);
        s.evictor.waiting.retain(|&w| w != (shard, seq));
        // the runtime's read timeout counts from the last answer, not from the sending
        s.evictor.deadline = self.now + FWD_TIMEOUT;
        // (an acknowledgement from an older epoch's chain, or one the data's placement does
        // not have, counts no more: `repl::drops::acked_in`)
        let settled = chain_evict::settled(&s.data_map, &s.map, shard);
        if result.is_ok() && meta.epoch == s.epoch && settled && s.drops.acked(shard, seq) {
            self.wake_later(id);
        }
        Ok(())
    }

    /// A drop from the predecessor on incoming connection `key` (`repl::drops::receive_drop`).
    pub(crate) fn server_drop(&mut self, id: u32, key: ConnKey, f: Frame) -> Result<(), Violation> {
        let Frame { sender, op: FrameOp::Drop(d), meta, last, .. } = f else { return Ok(()) };
        let slot = self.cfg.workers;
        let s = self.servers.get_mut(&id).expect("present");
        let next = match chain_evict::check_drop(&s.map, &d, id, sender, meta.epoch, s.epoch) {
            Ok(n) => n,
            Err(why) => {
                self.fail(id, key, meta, last, Failure { retried: true, why });
                return Ok(());
            }
        };
        let pass_on = match chain_evict::drop_state(&s.marks, &d, slot).map_err(|e| Violation(format!("server {id}: {e}")))? {
            DropState::Wait => {
                self.hold(id, key, Frame { sender, op: FrameOp::Drop(d), meta, last, keys: Vec::new(), vals: Vec::new() }, COVER_WAIT);
                return Ok(());
            }
            DropState::Apply => {
                s.table.drop_rows(&d.keys);
                chain_evict::applied(&mut s.marks, &d, slot).map_err(|e| Violation(e.to_string()))?;
                let forward = matches!(next, DropNext::Forward(_));
                if forward {
                    s.drops.record(d.clone());
                }
                self.wake_later(id);
                forward
            }
            // applied before (or had with a copy): passed on all the same, and held
            DropState::Applied => {
                let forward = matches!(next, DropNext::Forward(_));
                if forward {
                    s.drops.record(d.clone());
                }
                forward
            }
        };
        let (DropNext::Forward(to), true) = (next, pass_on) else {
            self.answer(id, key, meta, Ok(()));
            return Ok(());
        };
        let s = self.servers.get_mut(&id).expect("present");
        let out = forward_conn(key, id, s.incoming.entry(key).or_default().gen);
        let (shard, seq) = (d.shard, d.seq);
        let msg = Msg::Push { conn: out, sender: id, op: FrameOp::Drop(d), meta, last: true, keys: Vec::new(), vals: Vec::new() };
        if !self.send(Node::Server(id), Node::Server(to), msg) {
            self.fail(id, key, meta, last, Failure { retried: true, why: format!("forwarding a row drop to replica node {to} failed") });
            return Ok(());
        }
        let s = self.servers.get_mut(&id).expect("present");
        s.incoming.entry(key).or_default().pending = Some(Pending { out, meta, waiting: vec![to], kind: PendKind::Drop { shard, seq } });
        s.owner.insert(out, key);
        self.schedule(self.now + FWD_TIMEOUT, Node::Server(id), Node::Server(id), Msg::AckTimeout { up: key.0, conn: key.1, meta });
        Ok(())
    }

    /// Frame `f` of incoming connection `key` waits, back at the front of its inbox, until
    /// [`Sim::wake`] or its timeout.
    pub(crate) fn hold(&mut self, id: u32, key: ConnKey, f: Frame, wait: u64) {
        self.waits += 1;
        let token = self.waits;
        let s = self.servers.get_mut(&id).expect("present");
        s.waiting.insert(key);
        let c = s.incoming.entry(key).or_default();
        c.inbox.push_front(f);
        c.waiting = Some(token);
        self.schedule(self.now + wait, Node::Server(id), Node::Server(id), Msg::WaitTimeout { up: key.0, conn: key.1, token });
    }

    /// Server `id` looks at its waiting frames soon (not from inside a handler).
    pub(crate) fn wake_later(&mut self, id: u32) {
        let waits = self.servers.get(&id).is_some_and(|s| !s.waiting.is_empty());
        if waits {
            self.schedule(self.now, Node::Server(id), Node::Server(id), Msg::Wake);
        }
    }

    /// Every waiting frame of server `id` is looked at again.
    pub(crate) fn wake(&mut self, id: u32) -> Result<(), Violation> {
        let Some(s) = self.servers.get_mut(&id) else { return Ok(()) };
        let keys: Vec<ConnKey> = std::mem::take(&mut s.waiting).into_iter().collect();
        for k in &keys {
            if let Some(c) = s.incoming.get_mut(k) {
                c.waiting = None;
            }
        }
        for key in keys {
            self.read_on(id, key)?;
        }
        Ok(())
    }

    /// A frame waited too long: refused (its sender retries), and the connection reads on
    /// (or is closed, for a push: `chain_push::after_failure`).
    pub(crate) fn wait_timeout(&mut self, id: u32, key: ConnKey, token: u64) -> Result<(), Violation> {
        let Some(s) = self.servers.get_mut(&id) else { return Ok(()) };
        let Some(c) = s.incoming.get_mut(&key) else { return Ok(()) };
        if c.waiting != Some(token) {
            return Ok(());
        }
        c.waiting = None;
        s.waiting.remove(&key);
        let Some(f) = c.inbox.pop_front() else { return Ok(()) };
        self.fail(
            id,
            key,
            f.meta,
            f.last,
            Failure { retried: true, why: "waited too long for a row drop or the updates before one".into() },
        );
        self.read_on(id, key)
    }
}
