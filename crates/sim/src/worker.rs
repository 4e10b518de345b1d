//! The workers of the simulation: each pushes its increments one push at a time, keeps its
//! routing until a refusal or a timeout, and retries (sometimes twice at once) until every
//! head acknowledged the push.

use super::*;

impl Sim {
    // ---- workers: push i until every head acknowledged it, again under the newest routing

    pub(crate) fn send_push(&mut self, w: u32) {
        let wi = w as usize;
        if self.workers[wi].next >= self.workers[wi].pushes.len() {
            self.workers[wi].done = true;
            return;
        }
        let keys = self.workers[wi].pushes[self.workers[wi].next].clone();
        let epoch = self.workers[wi].routing.0;
        let map = self.map_of(&self.workers[wi].routing.1);
        let mut by_head: BTreeMap<u32, Vec<u64>> = BTreeMap::new();
        for (shard, r) in map.split_keys(&keys) {
            by_head.entry(map.chain(shard)[0]).or_default().extend_from_slice(&keys[r]);
        }
        let request_id = self.workers[wi].next as u64 + 1;
        self.workers[wi].waiting = by_head.keys().copied().collect();
        self.workers[wi].attempt += 1;
        let attempt = self.workers[wi].attempt;
        let mut failed = false;
        for (head, ks) in by_head {
            let meta = PushMeta { forwarded: false, worker: w, request_id, epoch, table: TABLE };
            let vals = vec![1.0; ks.len()];
            failed |= !self.send(Node::Worker(w), Node::Server(head), Msg::Push { conn: worker_conn(w), meta, last: true, keys: ks, vals });
        }
        if failed {
            // a connection broke: again at once, on new connections, under the newest routing
            self.workers[wi].routing = (self.coord.served_epoch, self.coord.served.clone());
            self.workers[wi].attempt += 1;
            let attempt = self.workers[wi].attempt;
            self.schedule(self.now + 20, Node::Worker(w), Node::Worker(w), Msg::WorkerTimeout { attempt });
            return;
        }
        self.schedule(self.now + TIMEOUT, Node::Worker(w), Node::Worker(w), Msg::WorkerTimeout { attempt });
        // a spurious retry: the same push again while the first is in flight (as a worker's
        // replay after a reconnect sends requests the servers may have had already)
        if !self.faults_over && self.rng.chance(self.cfg.duplicate) {
            self.out.duplicated += 1;
            let again = self.now + 1 + self.rng.below(self.cfg.max_delay * 4);
            self.schedule(again, Node::Worker(w), Node::Worker(w), Msg::WorkerTimeout { attempt });
        }
    }

    pub(crate) fn at_worker(&mut self, w: u32, from: Node, msg: Msg) {
        let wi = w as usize;
        if self.workers[wi].done {
            return;
        }
        match msg {
            Msg::Ack { meta, result, .. } => {
                let cur = self.workers[wi].next as u64 + 1;
                let Node::Server(head) = from else { return };
                if meta.request_id != cur || !self.workers[wi].waiting.contains(&head) {
                    return; // an old or duplicated answer
                }
                match result {
                    Ok(()) => {
                        self.workers[wi].waiting.retain(|h| *h != head);
                        if self.workers[wi].waiting.is_empty() {
                            self.workers[wi].next += 1;
                            self.send_push(w);
                        }
                    }
                    Err(_) => {
                        // refused (stale routing, a successor gone): again, a little later,
                        // under the newest served routing
                        self.workers[wi].routing = (self.coord.served_epoch, self.coord.served.clone());
                        self.workers[wi].attempt += 1;
                        let attempt = self.workers[wi].attempt;
                        self.schedule(self.now + 20, Node::Worker(w), Node::Worker(w), Msg::WorkerTimeout { attempt });
                    }
                }
            }
            Msg::WorkerTimeout { attempt } if attempt == self.workers[wi].attempt => {
                self.out.retries += 1;
                self.workers[wi].routing = (self.coord.served_epoch, self.coord.served.clone());
                self.send_push(w);
            }
            _ => {}
        }
    }
}
