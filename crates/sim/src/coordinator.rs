//! The coordinator of the simulation: crashes, cut-offs and joins change the ring, and each
//! change is a routing epoch of the production rule (`core::epochs::Epochs`, which the
//! coordinator's `epochs.rs` runs): served once every member has its copies. Detection
//! (a timeout after a crash), drains and the replacement of workers are modelled here.

use super::*;

impl Sim {
    // ---- the coordinator model: crashes and joins make epochs; an epoch is served once
    // every member has its copies

    pub(crate) fn at_coordinator(&mut self, _from: Node, msg: Msg) -> Result<(), Violation> {
        match msg {
            Msg::Crash | Msg::Cut => {
                // a live member dies (or is cut off); the coordinator notices after its node
                // timeout and replaces it
                let live = self.live_members();
                if live.len() <= self.cfg.k {
                    return Ok(());
                }
                let victim = live[self.rng.below(live.len() as u64) as usize];
                if matches!(msg, Msg::Cut) {
                    self.cut.push(victim); // alive, at its epoch, serving whoever reaches it
                } else if let Some(s) = self.servers.get_mut(&victim) {
                    s.alive = false; // its state is gone with it
                }
                self.schedule(self.now + DETECT, Node::Coordinator, Node::Coordinator, Msg::Detected { server: victim });
                Ok(())
            }
            Msg::Drain => {
                // `admin drain`: off the ring in a new epoch at once (it refuses to leave
                // fewer than K servers, as the coordinator's `drain` does)
                let live = self.live_members();
                if live.len() <= self.cfg.k {
                    return Ok(());
                }
                let victim = live[self.rng.below(live.len() as u64) as usize];
                self.coord.members.retain(|m| *m != victim);
                self.out.drained += 1;
                self.new_epoch(format!("server {victim} drained"), false);
                Ok(())
            }
            Msg::Join => {
                let id = self.coord.next_id;
                self.coord.next_id += 1;
                let s = self.new_server(id, 0, self.coord.epochs.served());
                self.servers.insert(id, s);
                self.coord.members.push(id);
                self.new_epoch(format!("server {id} joined"), false);
                Ok(())
            }
            Msg::Replace => {
                // a running worker is declared lost (its heartbeats stopped reaching the
                // coordinator) and its rank goes to a replacement with a newer node id, which
                // goes on from the lost one's progress record: the record lags a little, so
                // the replacement sends some pushes again
                let running: Vec<usize> = (0..self.workers.len()).filter(|&i| !self.workers[i].lost && !self.workers[i].done).collect();
                if running.is_empty() {
                    return Ok(());
                }
                let old = running[self.rng.below(running.len() as u64) as usize];
                self.workers[old].lost = true;
                let rank = self.workers[old].rank;
                let node = self.coord.next_worker_node;
                self.coord.next_worker_node += 1;
                self.coord.holders[rank as usize] = node;
                self.out.replaced += 1;
                let record = self.workers[old].next.saturating_sub(self.rng.below(3) as usize);
                let slot = self.workers.len() as u32;
                let routing = (self.coord.served_epoch, self.coord.epochs.served().to_vec());
                self.workers.push(Worker::new(rank, node, self.workers[old].pushes.clone(), routing, record));
                let start = self.now + 1 + self.rng.below(DETECT);
                self.schedule(start, Node::Coordinator, Node::Worker(slot), Msg::Start);
                // heartbeat answers name the new holder; a server may miss it (then the
                // replacement's first push there fences the old worker)
                let targets: Vec<u32> = self.servers.iter().filter(|(_, s)| s.alive).map(|(id, _)| *id).collect();
                for id in targets {
                    if !self.rng.chance(self.cfg.skip_served) {
                        self.send(Node::Coordinator, Node::Server(id), Msg::Holders { nodes: self.coord.holders.clone() });
                    }
                }
                Ok(())
            }
            Msg::Detected { server } => {
                self.coord.members.retain(|m| *m != server);
                self.new_epoch(format!("server {server} lost"), true);
                Ok(())
            }
            Msg::Ready { epoch, server } => {
                // the production rule: served once every member of the newest epoch is ready
                if let Ready::Served(s) = self.coord.epochs.ready(server, epoch, 0) {
                    self.coord.served_epoch = s.epoch;
                    for &m in &s.members {
                        if self.rng.chance(self.cfg.skip_served) {
                            continue;
                        }
                        self.send(Node::Coordinator, Node::Server(m), Msg::Served { epoch, members: s.members.clone() });
                    }
                }
                Ok(())
            }
            _ => Ok(()),
        }
    }

    /// The ring's members that are alive and reach the coordinator (a crash, cut-off or
    /// drain leaves at least K of them).
    fn live_members(&self) -> Vec<u32> {
        let alive = |m: &u32| self.servers.get(m).is_some_and(|s| s.alive) && !self.cut.contains(m);
        self.coord.members.iter().copied().filter(alive).collect()
    }

    /// The ring changed: a new epoch through `core::epochs` (what the coordinator's
    /// `State::reconfigure` calls), sent to every live server.
    pub(crate) fn new_epoch(&mut self, cause: String, failure: bool) {
        let now = self.now;
        self.coord.epochs.reconfigure(self.coord.members.clone(), cause, failure, now);
        self.out.epochs += 1;
        let (epoch, members, served) = (self.coord.epochs.epoch(), self.coord.members.clone(), self.coord.epochs.served().to_vec());
        let targets: Vec<u32> = self.servers.iter().filter(|(_, s)| s.alive).map(|(id, _)| *id).collect();
        for id in targets {
            let msg = Msg::Routing { epoch, members: members.clone(), served: served.clone() };
            self.send(Node::Coordinator, Node::Server(id), msg);
        }
    }
}
