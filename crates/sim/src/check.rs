//! The invariants checked after every run.

use super::*;

impl Sim {
    // ---- invariants

    pub(crate) fn check(&mut self) -> Result<(), Violation> {
        for (w, wk) in self.workers.iter().enumerate() {
            if !wk.done {
                // what the servers still wait for, to read a hang
                let waits: Vec<String> = self
                    .servers
                    .iter()
                    .filter(|(_, s)| s.alive)
                    .flat_map(|(id, s)| {
                        s.incoming.iter().filter_map(move |(key, c)| {
                            let p = c.pending.as_ref()?;
                            Some(format!(
                                "server {id}: worker {} request {} from {:?} waits for {:?}",
                                p.meta.worker, p.meta.request_id, key.0, p.waiting
                            ))
                        })
                    })
                    .collect();
                // eviction runs: the drops held and the frames waiting, with the marks they wait on
                let mut waits = waits;
                if self.cfg.evict {
                    let slots = self.cfg.workers + 1;
                    for (id, s) in self.servers.iter().filter(|(_, s)| s.alive) {
                        let held: Vec<String> = s.drops.held().map(|(sh, q)| format!("{sh}#{q}")).collect();
                        if !held.is_empty() {
                            waits.push(format!("server {id} holds drops {held:?}"));
                        }
                        for (key, c) in s.incoming.iter().filter(|(_, c)| c.waiting.is_some()) {
                            let Some(f) = c.inbox.front() else { continue };
                            let what = match &f.op {
                                FrameOp::Drop(d) => {
                                    let marks: Vec<u64> = (0..slots).map(|w| s.marks.get(d.shard, w).map_or(u64::MAX, |m| m.0)).collect();
                                    let mut snap = Watermarks::new(1, slots);
                                    let want: Vec<u64> = if snap.decode_into(0, 1, &d.marks).is_ok() {
                                        (0..slots).map(|w| snap.get(0, w).map_or(u64::MAX, |m| m.0)).collect()
                                    } else {
                                        Vec::new()
                                    };
                                    format!(
                                        "drop {}#{} (chain {:?}) has marks {marks:?}, wants {want:?}",
                                        d.shard,
                                        d.seq,
                                        s.map.chain(d.shard)
                                    )
                                }
                                _ => format!("worker {} request {} (a push held for a drop)", f.meta.worker, f.meta.request_id),
                            };
                            waits.push(format!("server {id}: from {:?} waits: {what}", key.0));
                        }
                    }
                }
                return Err(Violation(format!(
                    "worker {w} hung at push {}/{} (epoch {} served {}, time {}); {}",
                    wk.next + 1,
                    wk.pushes.len(),
                    self.coord.engine.epochs().epoch(),
                    self.coord.served_epoch,
                    self.now,
                    if waits.is_empty() { "no server waits".to_string() } else { waits.join("; ") }
                )));
            }
        }
        // the last epoch must be served, unless the job ended while a member it waits for
        // was dead or cut off and not yet declared lost (the monitor stops with the job)
        let blocked = self
            .coord
            .engine
            .routing()
            .servers
            .iter()
            .any(|m| self.servers.get(&m.node_id).is_none_or(|s| !s.alive) || self.cut.contains(&m.node_id));
        if !self.coord.engine.epochs().active() && !blocked {
            return Err(Violation(format!(
                "epoch {} was never served (served: {})",
                self.coord.engine.epochs().epoch(),
                self.coord.served_epoch
            )));
        }
        let mut reference: HashMap<u64, f32> = HashMap::new();
        // one run of each rank's pushes: the holder's (a replaced worker sent the same ones)
        for wk in self.workers.iter().filter(|w| !w.lost) {
            for p in &wk.pushes {
                for k in p {
                    *reference.entry(*k).or_default() += 1.0;
                }
            }
        }
        let map = self.map_of(self.coord.engine.epochs().served());
        for &key in &self.universe {
            let Some(shard) = map.shard_of(key) else { continue };
            // a member of the chain dead or cut off when the job ended (not declared lost yet:
            // the monitor stops with the job) holds up the drops behind it
            let stuck = map.chain(shard).iter().any(|n| self.servers.get(n).is_none_or(|s| !s.alive) || self.cut.contains(n));
            let want = reference.get(&key).copied().unwrap_or(0.0);
            if map.chain(shard).iter().all(|n| self.servers.get(n).is_none_or(|s| !s.alive)) {
                return Err(Violation(format!("every copy of shard {shard} died (chain {:?})", map.chain(shard))));
            }
            let mut dropped_value = None;
            for &node in map.chain(shard) {
                let s = self.servers.get_mut(&node).ok_or_else(|| Violation(format!("server {node} of the final chain is gone")))?;
                if !s.alive {
                    continue; // it died after the job's last epoch was served: its copy died with it
                }
                let mut got = [0f32];
                s.table.pull(&[key], &mut got).map_err(|e| Violation(e.to_string()))?;
                if self.dropped_keys.contains(&key) {
                    // a dropped key: every copy the same, none past the sequential run (a
                    // job that ended in an epoch never served, blocked by a member it waits
                    // for, or with a member of this chain dead or cut off, may leave a drop
                    // on its way down the chain)
                    let first = *dropped_value.get_or_insert(got[0]);
                    let lags = !self.coord.engine.epochs().active() || stuck;
                    if (got[0] != first && !lags) || got[0] > want {
                        return Err(Violation(format!(
                            "key {key} (shard {shard}, chain {:?}), dropped by its head: server {node} holds {} where the chain's first live copy holds {first} (the sequential run gives {want}, drops aside)",
                            map.chain(shard),
                            got[0]
                        )));
                    }
                    continue;
                }
                if got[0] != want {
                    return Err(Violation(format!(
                        "key {key} (shard {shard}, chain {:?}): server {node} holds {} but the sequential run gives {want} ({})",
                        map.chain(shard),
                        got[0],
                        if got[0] > want { "applied twice" } else { "lost" }
                    )));
                }
            }
        }
        Ok(())
    }
}
