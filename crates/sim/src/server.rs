//! The servers of the simulation: every decision goes through the engines production runs
//! (`core::chain_push`, `core::chain_epoch`); this file only carries their frames.

use super::*;

impl Sim {
    // ---- servers: every decision through core::chain_push and core::chain_epoch

    pub(crate) fn at_server(&mut self, id: u32, from: Node, msg: Msg) -> Result<(), Violation> {
        let Some(s) = self.servers.get(&id) else { return Ok(()) };
        if !s.alive {
            return Ok(());
        }
        match msg {
            Msg::Push { conn, meta, last, keys, vals } => self.server_push(id, from, conn, meta, last, keys, vals),
            Msg::Ack { conn, meta, result } => {
                let Node::Server(succ) = from else { return Ok(()) };
                let s = self.servers.get_mut(&id).expect("present");
                let mut answers = Vec::new();
                s.pending.retain_mut(|p| {
                    // acknowledgements come back on the forwarding connection of their
                    // request's epoch (the runtime opens new ones when the epoch changes)
                    let same =
                        p.out == conn && p.meta.worker == meta.worker && p.meta.request_id == meta.request_id && p.meta.epoch == meta.epoch;
                    if !same || !p.waiting.contains(&succ) {
                        return true;
                    }
                    match &result {
                        Err(e) => {
                            answers.push((p.up, p.conn, p.meta, Err(format!("replica node {succ}: {e}"))));
                            false
                        }
                        Ok(()) => {
                            p.waiting.retain(|n| *n != succ);
                            if p.waiting.is_empty() {
                                answers.push((p.up, p.conn, p.meta, Ok(())));
                                false
                            } else {
                                true
                            }
                        }
                    }
                });
                for (up, conn, meta, result) in answers {
                    self.answer(id, up, conn, meta, result)?;
                }
                Ok(())
            }
            Msg::Routing { epoch, members, served } => self.server_move(id, epoch, members, served),
            Msg::Served { epoch, members } => {
                let s = self.servers.get_mut(&id).expect("present");
                if s.epoch == epoch {
                    s.known_served = members;
                }
                Ok(())
            }
            Msg::Copy { epoch, range, keys, rows, marks } => {
                let s = self.servers.get_mut(&id).expect("present");
                // a copy of an older epoch is refused (its sender moved on as well)
                let ok = epoch >= s.epoch && {
                    let r = chain_epoch::install_copy(&mut s.table, &mut s.marks, &s.map, range, &keys, &rows, &marks);
                    r.map_err(|e| Violation(format!("server {id}: installing a copy of {range}: {e}")))?;
                    true
                };
                self.send(Node::Server(id), from, Msg::CopyAck { epoch, ok });
                Ok(())
            }
            Msg::CopyAck { epoch, ok } => {
                let s = self.servers.get_mut(&id).expect("present");
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

    /// Answers a push. (An answer may leave after this server moved to a newer epoch: the
    /// push was admitted under the sender's epoch and its successors took it under that
    /// epoch too, before their moves copied it on.)
    pub(crate) fn answer(&mut self, id: u32, up: Node, conn: u64, meta: PushMeta, result: Result<(), String>) -> Result<(), Violation> {
        self.send(Node::Server(id), up, Msg::Ack { conn, meta, result });
        Ok(())
    }

    #[allow(clippy::too_many_arguments)]
    pub(crate) fn server_push(
        &mut self,
        id: u32,
        from: Node,
        conn: u64,
        meta: PushMeta,
        last: bool,
        keys: Vec<u64>,
        vals: Vec<f32>,
    ) -> Result<(), Violation> {
        if self.servers.get_mut(&id).expect("present").skipping.entry((from, conn)).or_default().skips(meta.request_id, last) {
            return Ok(());
        }
        // this incoming connection's own forwarding connections (one per incoming
        // connection in the runtime: `ConnCtx::fwd`)
        let out = splitmix64(conn ^ splitmix64(node_code(from)) ^ (id as u64) << 40);
        let s = self.servers.get_mut(&id).expect("present");
        let segs = chain_push::segments(&s.map, PushKeys::Keys(&keys));
        if let Err(why) = chain_push::check_roles(&s.map, &segs, id, &meta, s.epoch) {
            return self.fail(id, from, conn, meta, last, why);
        }
        if let Err(e) = chain_push::admit_and_apply(&mut s.table, &mut s.marks, &meta, PushKeys::Keys(&keys), &vals, &segs) {
            return self.fail(id, from, conn, meta, last, e.to_string());
        }
        let plan = s.forwarders.entry((from, conn)).or_default().plan(&s.map, &segs, id, last);
        // no answer before the request's last frame
        let answer_now = plan.reply_after.as_ref().is_some_and(|a| a.is_empty());
        let after = plan.reply_after.clone().unwrap_or_default();
        if !after.is_empty() {
            // one request at a time per connection: a new one ends the wait of the one before
            s.pending.retain(|p| !(p.up == from && p.conn == conn));
            s.pending.push(Pending { up: from, conn, out, meta, waiting: after });
        }
        let fwd = PushMeta { forwarded: true, ..meta };
        let mut sends: Vec<(u32, Msg)> = plan
            .frames
            .iter()
            .map(|f| (f.to, Msg::Push { conn: out, meta: fwd, last: f.last, keys: keys[f.a..f.b].to_vec(), vals: vals[f.a..f.b].to_vec() }))
            .collect();
        sends.extend(plan.close.iter().map(|&to| (to, Msg::Push { conn: out, meta: fwd, last: true, keys: Vec::new(), vals: Vec::new() })));
        for (to, msg) in sends {
            if !self.send(Node::Server(id), Node::Server(to), msg) {
                // the runtime answers the failure and replaces every forwarding connection
                // of this incoming one (`Forwarding::reset`)
                let s = self.servers.get_mut(&id).expect("present");
                s.pending.retain(|p| !(p.up == from && p.conn == conn));
                s.forwarders.remove(&(from, conn));
                let others: Vec<u32> = self.servers.keys().copied().collect();
                for x in others {
                    let key = (Node::Server(id), Node::Server(x), out);
                    self.broken.remove(&key);
                    self.reconnected(key);
                }
                return self.fail(id, from, conn, meta, last, format!("forwarding to replica node {to} failed"));
            }
        }
        if answer_now {
            self.answer(id, from, conn, meta, Ok(()))?;
        }
        Ok(())
    }

    /// Answers a push's failure; before its last frame, the rest of the request is skipped.
    pub(crate) fn fail(&mut self, id: u32, from: Node, conn: u64, meta: PushMeta, last: bool, why: String) -> Result<(), Violation> {
        self.servers.get_mut(&id).expect("present").skipping.entry((from, conn)).or_default().refused(meta.request_id, last);
        self.answer(id, from, conn, meta, Err(why))
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
        s.epoch = epoch;
        s.known_served = data;
        s.map = new.clone();
        if !members.contains(&id) {
            s.alive = false;
            return Ok(());
        }
        let plan = chain_epoch::outgoing(&old, &new, &members, id).map_err(|e| Violation(format!("server {id}, epoch {epoch}: {e}")))?;
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
        s.copies_waiting = sends.len();
        for (to, msg) in sends {
            self.send(Node::Server(id), Node::Server(to), msg);
        }
        if self.servers[&id].copies_waiting == 0 {
            self.send(Node::Server(id), Node::Coordinator, Msg::Ready { epoch, server: id });
        }
        Ok(())
    }
}
