//! The servers of the simulation: every decision goes through the engines production runs
//! (`core::chain_push`, `core::chain_epoch`); this file only carries their frames.

use super::*;

impl Sim {
    // ---- servers: every decision through core::chain_push and core::chain_epoch

    pub(crate) fn at_server(&mut self, id: u32, from: Node, msg: Msg) -> Result<(), Violation> {
        self.at_server_inner(id, from, msg)?;
        if self.cfg.bsp {
            // what waited for the rounds' lock, or for its rounds, may go on now
            self.rounds_progress(id)?;
        }
        Ok(())
    }

    fn at_server_inner(&mut self, id: u32, from: Node, msg: Msg) -> Result<(), Violation> {
        let Some(s) = self.servers.get_mut(&id) else { return Ok(()) };
        if !s.alive {
            return Ok(());
        }
        match msg {
            Msg::Push { conn, sender, op, meta, last, keys, vals } => {
                let key = (from, conn);
                if s.closed.contains(&key) {
                    return Ok(());
                }
                s.incoming.entry(key).or_default().inbox.push_back(Frame { sender, op, meta, last, keys, vals });
                self.read_on(id, key)
            }
            Msg::Ack { conn, meta, result } => {
                let Node::Server(succ) = from else { return Ok(()) };
                if conn == s.evictor.conn() {
                    return self.evictor_ack(id, meta, result);
                }
                // acknowledgements come back on the forwarding connection they answer (the
                // runtime opens new ones when the epoch changes or after a failure)
                let Some(&key) = s.owner.get(&conn) else { return Ok(()) };
                let Some(c) = s.incoming.get_mut(&key) else { return Ok(()) };
                let answers = c.pending.as_ref().is_some_and(|p| {
                    p.out == conn
                        && p.meta.worker == meta.worker
                        && p.meta.request_id == meta.request_id
                        && p.meta.epoch == meta.epoch
                        && p.waiting.contains(&succ)
                });
                if !answers {
                    return Ok(());
                }
                let result = match result {
                    // the head answers a successor's refusal as one to retry (the worker
                    // sends the request again to the new chain)
                    Err(f) => Err(Failure { retried: true, why: format!("replica node {succ}: {}", f.why) }),
                    Ok(()) => {
                        let p = c.pending.as_mut().expect("found above");
                        p.waiting.retain(|n| *n != succ);
                        if !p.waiting.is_empty() {
                            return Ok(());
                        }
                        Ok(())
                    }
                };
                let p = c.pending.take().expect("found above");
                self.finish_pending(id, key, p, result)
            }
            Msg::AckTimeout { up, conn, meta } => {
                let Some(c) = s.incoming.get_mut(&(up, conn)) else { return Ok(()) };
                if c.pending.as_ref().is_none_or(|p| p.meta != meta) {
                    return Ok(());
                }
                let p = c.pending.take().expect("checked above");
                let why = format!("replica nodes {:?} did not acknowledge", p.waiting);
                self.finish_pending(id, (up, conn), p, Err(Failure { retried: true, why }))
            }
            Msg::Routing { epoch, members, served } => self.server_move(id, epoch, members, served),
            Msg::EvictTick => self.evict_tick(id),
            Msg::WaitTimeout { up, conn, token } => self.wait_timeout(id, (up, conn), token),
            Msg::Wake => self.wake(id),
            Msg::Holders { nodes } => {
                // the coordinator's heartbeat answer names the newest holder of every rank
                s.fence.note_holders(&nodes);
                for (h, n) in s.heard.iter_mut().zip(&nodes) {
                    *h = (*h).max(*n);
                }
                Ok(())
            }
            Msg::Served { epoch, members } => {
                if s.epoch == epoch {
                    s.known_served = members;
                    s.data_map = s.map.clone();
                    s.epoch_served = true;
                }
                Ok(())
            }
            Msg::Copy { epoch, range, keys, rows, marks } => {
                // a copy of an older epoch is refused (its sender moved on as well)
                let ok = epoch >= s.epoch && {
                    let r = chain_epoch::install_copy(&mut s.table, &mut s.marks, &s.map, range, &keys, &rows, &marks);
                    r.map_err(|e| Violation(format!("server {id}: installing a copy of {range}: {e}")))?;
                    // the copy's state replaces this server's (`repl::epoch::receive_copy`)
                    s.drops.replaced(&s.map, range);
                    true
                };
                self.send(Node::Server(id), from, Msg::CopyAck { epoch, ok });
                // pushes waiting for drops the copy replaced
                self.wake_later(id);
                Ok(())
            }
            Msg::CopyAck { epoch, ok } => {
                if ok && epoch == s.epoch && s.copies_waiting > 0 {
                    s.copies_waiting -= 1;
                    if s.copies_waiting == 0 {
                        self.send(Node::Server(id), Node::Coordinator, Msg::Ready { epoch, server: id });
                    }
                }
                Ok(())
            }
            _ => Ok(()),
        }
    }

    /// Reads the frames waiting on incoming connection `key` until one leaves a request
    /// waiting for acknowledgements (the runtime reads the next request only after
    /// answering the one before).
    pub(crate) fn read_on(&mut self, id: u32, key: ConnKey) -> Result<(), Violation> {
        loop {
            let Some(s) = self.servers.get_mut(&id) else { return Ok(()) };
            if !s.alive {
                return Ok(());
            }
            let Some(c) = s.incoming.get_mut(&key) else { return Ok(()) };
            if c.pending.is_some() || c.clock_wait.is_some() || c.lock_wait.is_some() || c.waiting.is_some() {
                return Ok(());
            }
            let Some(f) = c.inbox.pop_front() else { return Ok(()) };
            self.server_push(id, key, f)?;
        }
    }

    /// Answers the request that `key` waited on and, unless the connection is closed then,
    /// reads on.
    pub(crate) fn finish(&mut self, id: u32, key: ConnKey, meta: PushMeta, result: Result<(), Failure>) -> Result<(), Violation> {
        match result {
            Ok(()) => {
                self.answer(id, key, meta, Ok(()));
                self.read_on(id, key)
            }
            Err(f) => {
                self.fail(id, key, meta, true, f);
                self.read_on(id, key)
            }
        }
    }

    /// Sends the answer to a push on its connection; a connection that turned out broken
    /// is closed (the runtime's loop ends when a reply cannot be sent).
    pub(crate) fn answer(&mut self, id: u32, (up, conn): ConnKey, meta: PushMeta, result: Result<(), Failure>) {
        if !self.send(Node::Server(id), up, Msg::Ack { conn, meta, result }) {
            self.close(id, (up, conn));
        }
    }

    /// Closes incoming connection `key`: nothing more is read from it, and its sender's
    /// next send there fails.
    fn close(&mut self, id: u32, key: ConnKey) {
        if let Some(s) = self.servers.get_mut(&id) {
            s.incoming.remove(&key);
            s.waiting.remove(&key);
            s.closed.insert(key);
            if s.lock == Some(key) {
                s.lock = None; // its thread ends, and the lock is free
            }
        }
        self.broken.insert((key.0, Node::Server(id), key.1));
    }

    pub(crate) fn server_push(&mut self, id: u32, key: ConnKey, f: Frame) -> Result<(), Violation> {
        match f.op {
            FrameOp::Push => {}
            FrameOp::Round(_) | FrameOp::Clock(_) => return self.round_request(id, key, f),
            FrameOp::Marks(_) => return self.round_marks(id, key, f),
            FrameOp::Drop(_) => return self.server_drop(id, key, f),
        }
        let Frame { sender, meta, last, keys, vals, .. } = f;
        let s = self.servers.get_mut(&id).expect("present");
        let c = s.incoming.entry(key).or_default();
        if c.skip.skips(meta.request_id, last) {
            return Ok(());
        }
        // a worker's push: first the fence of replaced workers (`repl::fence::fence_worker`
        // runs before the chain's checks); the simulation notes whom it heard of, by itself,
        // to check that rule below
        let rank = meta.worker as usize;
        let heard = if meta.forwarded { 0 } else { s.heard[rank] };
        if !meta.forwarded {
            s.heard[rank] = heard.max(sender);
            if let Err(e) = s.fence.admit(meta.worker, sender) {
                self.out.fenced += 1;
                self.fail(id, key, meta, last, Failure { retried: false, why: e.to_string() });
                return Ok(());
            }
        }
        // this incoming connection's own forwarding connections (one set per incoming
        // connection in the runtime: `ConnCtx::fwd`), replaced after a failure
        let gen = c.gen;
        let out = forward_conn(key, id, gen);
        let segs = chain_push::segments(&s.map, PushKeys::Keys(&keys));
        if let Err(why) = chain_push::check_roles(&s.map, &segs, id, &meta, s.epoch) {
            self.fail(id, key, meta, last, Failure { retried: true, why });
            return Ok(());
        }
        // a worker's push to a row dropped here waits until the drop is down the chain
        // (`repl::push`, `core::chain_evict`)
        let waits =
            !meta.forwarded && s.drops.push_waits(&s.marks, &meta, PushKeys::Keys(&keys), &segs).map_err(|e| Violation(e.to_string()))?;
        if waits {
            self.hold(id, key, Frame { sender, op: FrameOp::Push, meta, last, keys, vals }, evict::PUSH_WAIT);
            return Ok(());
        }
        if let Err(e) = chain_push::admit_and_apply(&mut s.table, &mut s.marks, &meta, PushKeys::Keys(&keys), &vals, &segs) {
            self.fail(id, key, meta, last, Failure { retried: true, why: e.to_string() });
            return Ok(());
        }
        // drops waiting for this update may go on (`TableRepl::pushed`)
        self.wake_later(id);
        let s = self.servers.get_mut(&id).expect("present");
        if sender < heard {
            return Err(Violation(format!(
                "server {id} took request {} of node {sender} under worker rank {rank} after it had heard of node {heard}, which replaced it (a fenced worker applied an update)",
                meta.request_id
            )));
        }
        let plan = s.incoming.entry(key).or_default().forwarder.plan(&s.map, &segs, id, last);
        let after = plan.reply_after.clone();
        let fwd = PushMeta { forwarded: true, ..meta };
        let mut sends: Vec<(u32, Msg)> = plan
            .frames
            .iter()
            .map(|f| {
                let (keys, vals) = (keys[f.a..f.b].to_vec(), vals[f.a..f.b].to_vec());
                (f.to, Msg::Push { conn: out, sender: id, op: FrameOp::Push, meta: fwd, last: f.last, keys, vals })
            })
            .collect();
        let close =
            |to| (to, Msg::Push { conn: out, sender: id, op: FrameOp::Push, meta: fwd, last: true, keys: Vec::new(), vals: Vec::new() });
        sends.extend(plan.close.iter().map(|&to| close(to)));
        for (to, msg) in sends {
            if !self.send(Node::Server(id), Node::Server(to), msg) {
                let why = format!("forwarding to replica node {to} failed");
                self.fail(id, key, meta, last, Failure { retried: true, why });
                return Ok(());
            }
        }
        match after {
            // not the request's last frame: no answer yet
            None => Ok(()),
            Some(after) if after.is_empty() => {
                self.answer(id, key, meta, Ok(()));
                Ok(())
            }
            Some(waiting) => {
                // the next request on this connection is read once this one is answered
                let s = self.servers.get_mut(&id).expect("present");
                s.incoming.entry(key).or_default().pending = Some(Pending { out, meta, waiting, kind: PendKind::Push });
                s.owner.insert(out, key);
                self.schedule(self.now + FWD_TIMEOUT, Node::Server(id), Node::Server(id), Msg::AckTimeout { up: key.0, conn: key.1, meta });
                Ok(())
            }
        }
    }

    /// Answers a push's failure. As the runtime: the forwarding connections of `key` are
    /// replaced (`Forwarding::reset`); the rest of the request is skipped (`Skip`); and the
    /// connection is closed if `chain_push::after_failure` says so (for a failure the worker
    /// retries; not for a fenced worker's).
    pub(crate) fn fail(&mut self, id: u32, key: ConnKey, meta: PushMeta, last: bool, f: Failure) {
        let retried = f.retried;
        // frames of a replicated bsp table's rounds come under the round watermark's slot
        let round_slot = meta.forwarded && meta.worker as usize == self.cfg.workers;
        let c = self.servers.get_mut(&id).expect("present").incoming.entry(key).or_default();
        c.skip.refused(meta.request_id, last);
        c.forwarder = Forwarder::default();
        c.gen += 1;
        if round_slot && meta.request_id != MARKS_REQUEST {
            c.forward_failed = true;
        }
        self.answer(id, key, meta, Err(f));
        // the connection loop's rule is for pushes (not clocks, not the rounds' frames)
        let push = !round_slot && meta.request_id < CLOCK_REQUEST;
        let close = push && self.close_after_failure && chain_push::after_failure(retried) == AfterFailure::Close;
        if close {
            self.close(id, key);
        }
    }

    pub(crate) fn server_move(&mut self, id: u32, epoch: u64, members: Vec<u32>, served: Vec<u32>) -> Result<(), Violation> {
        let known = self.servers[&id].known_served.clone();
        let data = chain_epoch::data_members(&served, &known);
        let old = self.map_of(&data);
        let new = self.map_of(&members);
        let s = self.servers.get_mut(&id).expect("present");
        if epoch <= s.epoch {
            return Ok(());
        }
        if s.lock.is_some() {
            // the move takes the rounds' lock, which a clock holds while its rounds are
            // forwarded: it waits (the newest move only)
            if s.deferred_move.as_ref().is_none_or(|d| d.0 < epoch) {
                s.deferred_move = Some((epoch, members, served));
            }
            return Ok(());
        }
        s.epoch = epoch;
        s.known_served = data;
        s.data_map = old.clone();
        s.epoch_served = false;
        s.map = new.clone();
        if !members.contains(&id) {
            s.alive = false;
            return Ok(());
        }
        // with eviction, a changed chain is copied whole (`repl/epoch.rs`)
        let plan = if self.cfg.evict {
            chain_epoch::outgoing_resync(&old, &new, &members, id)
        } else {
            chain_epoch::outgoing(&old, &new, &members, id)
        }
        .map_err(|e| Violation(format!("server {id}, epoch {epoch}: {e}")))?;
        let mut sends = Vec::new();
        for c in &plan {
            let range = new.range(c.shard);
            let (mut keys, mut rows) = (Vec::new(), Vec::new());
            s.table.export_rows(range, &mut keys, &mut rows);
            let marks = s.marks.encode(c.shard, c.shard + 1);
            for &to in &c.to {
                sends.push((to, Msg::Copy { epoch, range, keys: keys.clone(), rows: rows.clone(), marks: marks.clone() }));
            }
        }
        if let Some(cr) = s.rounds.as_mut() {
            // the headships change with the placement (`repl/epoch.rs`)
            cr.set_heads(epoch, |sh| new.position(sh, id) == Some(0));
        }
        s.copies_waiting = sends.len();
        // waiting frames see the new epoch (a drop waiting for updates is refused); the
        // evictor sends the drops held here to the new successors at its next round
        self.wake_later(id);
        for (to, msg) in sends {
            self.send(Node::Server(id), Node::Server(to), msg);
        }
        if self.servers[&id].copies_waiting == 0 {
            self.send(Node::Server(id), Node::Coordinator, Msg::Ready { epoch, server: id });
        }
        Ok(())
    }
}
