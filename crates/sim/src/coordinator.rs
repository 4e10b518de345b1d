//! The coordinator of the simulation: the production engine
//! (`downpour_coordinator::engine::Engine`, which the coordinator's runtime drives) decides
//! every change: servers and workers register through it and heartbeat to it, a killed
//! server's closed heartbeat connection is its `disconnected`, its monitor's `tick` declares
//! silent nodes (a vanished or cut-off server, a worker whose heartbeats stop) lost through
//! its `lose`, drains and joins are its `drain` and `register`, workers'
//! progress records go to its `progress` and their end to its `done`, every routing epoch is
//! its own and is served by its `epoch_ready`, and a restart takes it back from its
//! snapshot. The simulation adds what the runtime adds: the time (a virtual clock), the
//! heartbeats' arrival, and the messages to the nodes (which may be missed, as a heartbeat
//! answer that came with the next change already).

use super::*;
use downpour_coordinator::engine::{Engine, EpochReadyOutcome, Lost, Tick};
use downpour_coordinator::CoordinatorConfig;
use downpour_core::proto;
use std::time::Duration;

/// The coordinator: the production engine, and the last epoch it served.
pub(crate) struct Coordinator {
    pub(crate) engine: Engine,
    /// The last served epoch (the workers take their routing from it).
    pub(crate) served_epoch: u64,
    /// When the engine (re)started: its time counts from there.
    started: u64,
}

impl Coordinator {
    /// A job of `cfg`: its servers register (node ids 1 to `servers`), then its workers
    /// (recording their progress), and routing epoch 1 is served. K = 1 runs drive the
    /// engine as a replicated job with one copy (production's `--replication 1` has a fixed
    /// partition instead, and neither joins nor drains).
    pub(crate) fn start(cfg: &SimConfig) -> Result<(Coordinator, Vec<u32>), Violation> {
        let mut engine = Engine::new(CoordinatorConfig {
            servers: cfg.servers,
            workers: cfg.workers,
            replication: cfg.k.max(2),
            vnodes: cfg.vnodes,
            shards: cfg.shards,
            heartbeat: Duration::from_millis(TICK),
            node_timeout: Duration::from_millis(DETECT),
            reassign_after: Duration::ZERO,
            ..Default::default()
        });
        let err = |e: downpour_coordinator::CoordError| Violation(format!("the coordinator refused: {e}"));
        for s in 0..cfg.servers {
            let req = proto::RegisterRequest { role: "server".into(), addr: format!("sim:{s}"), ..Default::default() };
            engine.register(&req, Duration::ZERO).map_err(err)?;
        }
        let mut workers = Vec::new();
        for _ in 0..cfg.workers {
            let req = proto::RegisterRequest { role: "worker".into(), records_progress: true, ..Default::default() };
            workers.push(engine.register(&req, Duration::ZERO).map_err(err)?.id);
        }
        Ok((Coordinator { engine, served_epoch: 1, started: 0 }, workers))
    }

    /// The servers of the ring (the newest epoch's members).
    pub(crate) fn members(&self) -> Vec<u32> {
        self.engine.routing().servers.iter().map(|s| s.node_id).collect()
    }
}

impl Sim {
    /// The engine's time now.
    fn clock(&self) -> Duration {
        Duration::from_millis(self.now - self.coord.started)
    }

    pub(crate) fn at_coordinator(&mut self, _from: Node, msg: Msg) -> Result<(), Violation> {
        let fault = matches!(msg, Msg::Crash | Msg::Cut | Msg::Drain | Msg::Join | Msg::Replace | Msg::Restart);
        if fault && self.coord.engine.ended() {
            return Ok(()); // the job is over: a fault drawn for later finds nothing to break
        }
        match msg {
            Msg::Crash | Msg::Cut => {
                // a live member dies (or is cut off): its heartbeats stop, and the engine's
                // monitor declares it lost after the node timeout
                let live = self.live_members();
                if live.len() <= self.cfg.k {
                    return Ok(());
                }
                let victim = live[self.rng.below(live.len() as u64) as usize];
                if matches!(msg, Msg::Cut) {
                    self.cut.push(victim); // alive, at its epoch, serving whoever reaches it
                    return Ok(());
                }
                if let Some(s) = self.servers.get_mut(&victim) {
                    s.alive = false; // its state is gone with it
                }
                // a killed process's heartbeat connection closes at once (the runtime then
                // loses it without waiting for the timeout); a machine that vanished leaves
                // it to the monitor
                if self.rng.chance(0.5) {
                    if let Some(reason) = self.coord.engine.disconnected(victim) {
                        let now = self.clock();
                        match self.coord.engine.lose(victim, reason, now) {
                            Lost::Removed { .. } => self.new_epoch(),
                            other => {
                                return Err(Violation(format!("the loss of server {victim} did not remove it from the ring: {other:?}")))
                            }
                        }
                    }
                }
                Ok(())
            }
            Msg::Tick => self.monitor(),
            Msg::Drain => {
                // `admin drain`: off the ring in a new epoch at once (the engine refuses to
                // leave fewer than K servers; so does the simulation, counting live ones)
                let live = self.live_members();
                if live.len() <= self.cfg.k {
                    return Ok(());
                }
                let victim = live[self.rng.below(live.len() as u64) as usize];
                let rank = self.coord.engine.servers().iter().position(|s| s.0 == victim).unwrap_or(usize::MAX) as u32;
                let now = self.clock();
                self.coord.engine.drain(rank, now).map_err(|e| Violation(format!("drain of server {victim} refused: {e}")))?;
                self.out.drained += 1;
                self.new_epoch();
                Ok(())
            }
            Msg::Join => {
                let req = proto::RegisterRequest { role: "server".into(), addr: "sim:joined".into(), ..Default::default() };
                let now = self.clock();
                let r = self.coord.engine.register(&req, now).map_err(|e| Violation(format!("a joining server was refused: {e}")))?;
                let s = self.new_server(r.id, 0, self.coord.engine.epochs().served());
                self.servers.insert(r.id, s);
                if self.cfg.evict {
                    self.schedule(self.now + evict::EVICT_EVERY, Node::Server(r.id), Node::Server(r.id), Msg::EvictTick);
                }
                self.new_epoch();
                Ok(())
            }
            Msg::Replace => {
                // a running worker's heartbeats stop reaching the coordinator (it runs on)
                let running: Vec<u32> =
                    self.workers.iter().filter(|w| !w.lost && !w.done && !self.silenced.contains(&w.node)).map(|w| w.node).collect();
                if !running.is_empty() {
                    let node = running[self.rng.below(running.len() as u64) as usize];
                    self.silenced.push(node);
                }
                Ok(())
            }
            Msg::Restart => {
                // the coordinator dies and is started again on its state directory: the
                // engine comes back from its snapshot alone (nothing in flight to it is lost
                // here; its nodes' calls would be retried)
                let snapshot = self.coord.engine.snapshot();
                let cfg = self.coord.engine.config().clone();
                self.coord.engine = Engine::restore(&cfg, snapshot, std::path::Path::new("(simulated state directory)"))
                    .map_err(|e| Violation(format!("the coordinator could not take its job back: {e}")))?;
                self.coord.started = self.now;
                self.out.coordinator_restarts += 1;
                Ok(())
            }
            Msg::Ready { epoch, server } => {
                let now = self.clock();
                let ready = proto::EpochReady { epoch, keys_copied: 0, error: String::new() };
                match self.coord.engine.epoch_ready(server, &ready, now) {
                    EpochReadyOutcome::Served(r) => {
                        self.coord.served_epoch = r.epoch;
                        let members = self.coord.engine.epochs().served().to_vec();
                        for &m in &members {
                            if self.rng.chance(self.cfg.skip_served) {
                                continue;
                            }
                            self.send(Node::Coordinator, Node::Server(m), Msg::Served { epoch, members: members.clone() });
                        }
                        Ok(())
                    }
                    EpochReadyOutcome::Failed(why) => Err(Violation(why)),
                    EpochReadyOutcome::Waiting | EpochReadyOutcome::Ignored => Ok(()),
                }
            }
            _ => Ok(()),
        }
    }

    /// The monitor's look: the heartbeats of every node that reaches the coordinator arrive
    /// (a worker declared lost is answered so, and stops), then the engine's `tick`: a node
    /// silent for the node timeout is lost (`Engine::lose`): a server leaves the ring in a
    /// new epoch, a worker's rank goes to a replacement. The monitor looks until the job
    /// ends.
    fn monitor(&mut self) -> Result<(), Violation> {
        let now = self.clock();
        let servers: Vec<u32> = self.servers.iter().filter(|(id, s)| s.alive && !self.cut.contains(id)).map(|(id, _)| *id).collect();
        let served = (self.coord.served_epoch, self.coord.engine.epochs().served().to_vec());
        for id in servers {
            if self.coord.engine.heartbeat_seen(id, now).is_none() {
                self.coord.engine.heartbeat_reply(id, now);
                // a heartbeat's answer carries the routing: a server at the served epoch
                // that missed the word hears it now (`node.rs` calls `epoch_served`), unless
                // this answer is missed too
                let s = &self.servers[&id];
                if s.epoch == served.0 && !s.epoch_served && self.coord.engine.epochs().active() && !self.rng.chance(self.cfg.skip_served) {
                    self.send(Node::Coordinator, Node::Server(id), Msg::Served { epoch: served.0, members: served.1.clone() });
                }
            }
        }
        for w in 0..self.workers.len() {
            let wk = &self.workers[w];
            if wk.done || self.silenced.contains(&wk.node) {
                continue;
            }
            match self.coord.engine.heartbeat_seen(wk.node, now) {
                // declared lost while it ran: it stops
                Some(_) => self.workers[w].done = true,
                None => {
                    self.coord.engine.heartbeat_reply(wk.node, now);
                }
            }
        }
        for tick in self.coord.engine.tick(now) {
            match tick {
                Tick::Silent { node, reason } => self.silent(node, reason)?,
                Tick::Failed(why) => return Err(Violation(format!("the coordinator failed the job: {why}"))),
                Tick::CheckpointAsked(_) | Tick::Adopted { .. } => {}
            }
        }
        if !self.coord.engine.ended() {
            self.schedule(self.now + TICK, Node::Coordinator, Node::Coordinator, Msg::Tick);
        }
        Ok(())
    }

    /// Node `node` was silent for the node timeout: the engine loses it. A server leaves the
    /// ring in a new epoch; a worker's rank is left vacant, and the next worker registering
    /// takes it with the progress record the engine kept (the last one the lost worker's
    /// heartbeats carried, which lags: the replacement sends some pushes again).
    fn silent(&mut self, node: u32, reason: String) -> Result<(), Violation> {
        let now = self.clock();
        let Some(old) = self.workers.iter().position(|w| w.node == node) else {
            return match self.coord.engine.lose(node, reason, now) {
                Lost::Removed { .. } => {
                    self.new_epoch();
                    Ok(())
                }
                other => Err(Violation(format!("the loss of server {node} did not remove it from the ring: {other:?}"))),
            };
        };
        let rank = self.workers[old].rank;
        match self.coord.engine.lose(node, reason, now) {
            Lost::Vacant { rank: r } if r == rank => {}
            other => return Err(Violation(format!("the loss of worker {rank} left no vacancy: {other:?}"))),
        }
        self.workers[old].lost = true;
        let req = proto::RegisterRequest { role: "worker".into(), records_progress: true, ..Default::default() };
        let r = self.coord.engine.register(&req, now).map_err(|e| Violation(format!("the replacement was refused: {e}")))?;
        let record = r.restart.ok_or_else(|| Violation(format!("worker {rank}'s replacement got no progress record")))?;
        if r.rank != rank {
            return Err(Violation(format!("the replacement of worker {rank} got rank {}", r.rank)));
        }
        self.out.replaced += 1;
        let slot = self.workers.len() as u32;
        let routing = (self.coord.served_epoch, self.coord.engine.epochs().served().to_vec());
        self.workers.push(Worker::new(rank, r.id, self.workers[old].pushes.clone(), routing, record.next_request as usize));
        let start = self.now + 1 + self.rng.below(DETECT);
        self.schedule(start, Node::Coordinator, Node::Worker(slot), Msg::Start);
        // heartbeat answers name the new holder; a server may miss it (then the
        // replacement's first push there fences the old worker)
        let holders = self.coord.engine.worker_holders().to_vec();
        let targets: Vec<u32> = self.servers.iter().filter(|(_, s)| s.alive).map(|(id, _)| *id).collect();
        for id in targets {
            if !self.rng.chance(self.cfg.skip_served) {
                self.send(Node::Coordinator, Node::Server(id), Msg::Holders { nodes: holders.clone() });
            }
        }
        Ok(())
    }

    /// Worker `w`'s heartbeat carries its progress record (every push before `next` was
    /// acknowledged): the engine keeps it for a replacement. A worker declared lost is
    /// refused, and stops (its call was answered that its rank went to a replacement).
    /// (An unexpected refusal is the run's violation, reported after the event.)
    pub(crate) fn record_progress(&mut self, w: u32) {
        let wk = &self.workers[w as usize];
        let record = proto::WorkerCheckpoint { rank: wk.rank, next_request: wk.next as u64, ..Default::default() };
        match self.coord.engine.progress(wk.node, record) {
            Ok(()) => {}
            Err(downpour_coordinator::CoordError::LostNode { .. }) if wk.lost => self.workers[w as usize].done = true,
            Err(e) => {
                let v = Violation(format!("worker {} (node {})'s progress record was refused: {e}", wk.rank, wk.node));
                self.violation.get_or_insert(v);
            }
        }
    }

    /// The ring's members that are alive and reach the coordinator (a crash, cut-off or
    /// drain leaves at least K of them).
    fn live_members(&self) -> Vec<u32> {
        let alive = |m: &u32| self.servers.get(m).is_some_and(|s| s.alive) && !self.cut.contains(m);
        self.coord.members().into_iter().filter(alive).collect()
    }

    /// The engine prepared a new epoch (a loss, drain or join): every live server is told.
    pub(crate) fn new_epoch(&mut self) {
        self.out.epochs += 1;
        let (epoch, members, served) =
            (self.coord.engine.epochs().epoch(), self.coord.members(), self.coord.engine.epochs().served().to_vec());
        let targets: Vec<u32> = self.servers.iter().filter(|(_, s)| s.alive).map(|(id, _)| *id).collect();
        for id in targets {
            let msg = Msg::Routing { epoch, members: members.clone(), served: served.clone() };
            self.send(Node::Coordinator, Node::Server(id), msg);
        }
    }
}
