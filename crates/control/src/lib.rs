//! downpour-control: the node side of the coordinator protocol (the control plane). Servers,
//! workers and tools call the coordinator through [`ControlClient`] over any transport;
//! the coordinator itself (`downpour-coordinator`) serves it.

use downpour_core::msg::{self, Op, Status};
use downpour_core::proto::{self, FrameHeader};
use downpour_transport::{Connection, Transport, TransportError};
use prost::Message;
use std::sync::Arc;
use std::time::{Duration, Instant};
use thiserror::Error;

/// A failed control call.
#[derive(Debug, Error)]
pub enum ControlError {
    /// The coordinator could not be reached or went away.
    #[error("coordinator at {addr}: {cause}")]
    Transport {
        /// Coordinator address.
        addr: String,
        /// What happened (in the message, not a separate error source, so it prints once).
        cause: TransportError,
    },
    /// The coordinator refused the call.
    #[error("coordinator refused {op:?}: {message}")]
    Refused {
        /// The call.
        op: Op,
        /// Status.
        status: Status,
        /// Its message.
        message: String,
    },
    /// A reply that does not decode.
    #[error("{0}")]
    Malformed(String),
    /// The coordinator went away and did not come back in time (reconnecting clients).
    #[error("{0}")]
    Gone(String),
}

/// A connection to the coordinator, used by one thread.
pub struct ControlClient {
    conn: Box<dyn Connection>,
    addr: String,
    node_id: u32,
    next_id: u64,
    /// The receive timeout set (kept for a new connection).
    timeout: Option<Duration>,
    /// Reconnect to a restarted coordinator: how, and for how long.
    reconnect: Option<(Arc<dyn Transport>, Duration)>,
}

/// Calls sent again, unchanged, to a coordinator that went away and came back: the
/// coordinator answers each of them the same however often it hears it (a barrier counts
/// ranks and passes, a checkpoint join its round, a report its epoch or round).
fn retried(op: Op) -> bool {
    matches!(
        op,
        Op::Heartbeat
            | Op::Barrier
            | Op::Progress
            | Op::GetRouting
            | Op::EpochReady
            | Op::CheckpointJoin
            | Op::CheckpointWritten
            | Op::Done
    )
}

impl ControlClient {
    /// Connects to the coordinator at `addr`, failing after `timeout`.
    pub fn connect(transport: &dyn Transport, addr: &str, timeout: Duration) -> Result<Self, ControlError> {
        let conn = transport.connect(addr, timeout).map_err(|source| ControlError::Transport { addr: addr.into(), cause: source })?;
        Ok(ControlClient { conn, addr: addr.into(), node_id: 0, next_id: 1, timeout: None, reconnect: None })
    }

    /// Survive a coordinator restart (a coordinator with a state directory, which says so at
    /// registration): when the connection fails, reconnect to the same address with
    /// `transport` for up to `within` and send the call again (only calls the coordinator
    /// answers the same when repeated; others still fail).
    pub fn enable_reconnect(&mut self, transport: Arc<dyn Transport>, within: Duration) {
        self.reconnect = Some((transport, within));
    }

    /// Fail at once when the connection fails (undoes [`ControlClient::enable_reconnect`]).
    pub fn disable_reconnect(&mut self) {
        self.reconnect = None;
    }

    /// A random registration token (see [`ControlClient::register_as`]).
    pub fn new_token() -> u64 {
        use std::hash::{BuildHasher, Hasher};
        // std's randomly keyed hasher: distinct keys per call, per thread and per process
        std::collections::hash_map::RandomState::new().build_hasher().finish().max(1)
    }

    /// Sets the node id sent with every call (after registration).
    pub fn set_node_id(&mut self, id: u32) {
        self.node_id = id;
    }

    /// Bounds how long a call may wait for its reply.
    pub fn set_timeout(&mut self, t: Option<Duration>) -> Result<(), ControlError> {
        self.timeout = t;
        self.conn.set_recv_timeout(t).map_err(|source| ControlError::Transport { addr: self.addr.clone(), cause: source })
    }

    /// Sends one call with `body` and returns the reply header (its `meta` is the body).
    /// With [`ControlClient::enable_reconnect`], a call the coordinator answers the same when
    /// repeated survives the coordinator going away and coming back.
    pub fn call(&mut self, op: Op, body: Vec<u8>) -> Result<FrameHeader, ControlError> {
        self.call_retrying(op, body, retried(op))
    }

    fn call_retrying(&mut self, op: Op, body: Vec<u8>, retry: bool) -> Result<FrameHeader, ControlError> {
        let Some((transport, within)) = self.reconnect.clone().filter(|_| retry) else {
            return self.call_once(op, body);
        };
        let first = match self.call_once(op, body.clone()) {
            Err(e @ ControlError::Transport { .. }) => e,
            r => return r,
        };
        tracing::warn!("lost the coordinator at {} ({first}); reconnecting for up to {within:?}", self.addr);
        let deadline = Instant::now() + within;
        let mut last = first;
        while Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(100));
            let conn = match transport.connect(&self.addr, Duration::from_secs(1)) {
                Ok(c) => c,
                Err(cause) => {
                    last = ControlError::Transport { addr: self.addr.clone(), cause };
                    continue;
                }
            };
            self.conn = conn;
            if let Err(cause) = self.conn.set_recv_timeout(self.timeout) {
                last = ControlError::Transport { addr: self.addr.clone(), cause };
                continue;
            }
            match self.call_once(op, body.clone()) {
                Err(e @ ControlError::Transport { .. }) => last = e,
                r => {
                    tracing::info!("reconnected to the coordinator at {}", self.addr);
                    return r;
                }
            }
        }
        Err(ControlError::Gone(format!("the coordinator at {} did not come back within {within:?}: {last}", self.addr)))
    }

    fn call_once(&mut self, op: Op, body: Vec<u8>) -> Result<FrameHeader, ControlError> {
        let id = self.next_id;
        self.next_id += 1;
        let mut h = msg::request(op, self.node_id, id, 0, 0);
        h.meta = body.into();
        let terr = |addr: &str, source| ControlError::Transport { addr: addr.to_string(), cause: source };
        self.conn.send(&mut h, &[], &[]).map_err(|e| terr(&self.addr, e))?;
        let r = match self.conn.recv_header() {
            Ok(Some(r)) => r,
            Ok(None) => return Err(terr(&self.addr, TransportError::Closed { peer: self.addr.clone() })),
            Err(e) => return Err(terr(&self.addr, e)),
        };
        if r.keys_len + r.values_len > 0 {
            return Err(ControlError::Malformed("control reply with a payload".into()));
        }
        if r.request_id != id {
            return Err(ControlError::Malformed(format!("reply to call {} while waiting for {id}", r.request_id)));
        }
        if r.status != 0 {
            return Err(ControlError::Refused { op, status: Status::from_u32(r.status), message: r.error });
        }
        Ok(r)
    }

    /// Registers as `role` ("server" with its data address, or "worker").
    pub fn register(&mut self, role: &str, addr: &str) -> Result<proto::RegisterReply, ControlError> {
        self.register_as(&proto::RegisterRequest { role: role.into(), addr: addr.into(), ..Default::default() })
    }

    /// Registers with the full request (a worker saying its job records progress). With a
    /// `token` and [`ControlClient::enable_reconnect`], a registration whose connection failed
    /// is sent again (a coordinator restarted with its state answers it the same).
    pub fn register_as(&mut self, req: &proto::RegisterRequest) -> Result<proto::RegisterReply, ControlError> {
        let r = self.call_retrying(Op::Register, req.encode_to_vec(), req.token != 0)?;
        let reply: proto::RegisterReply = decode_body(&r).map_err(ControlError::Malformed)?;
        self.node_id = reply.node_id;
        Ok(reply)
    }

    /// Waits at the named barrier until every worker has reached it. `count` is this
    /// worker's count of its calls to `name`, 1-based (0: not counted); a pass its rank made
    /// already (before a replacement took the rank over) returns at once.
    pub fn barrier(&mut self, name: &str, count: u64) -> Result<(), ControlError> {
        self.call(Op::Barrier, proto::BarrierRequest { name: name.into(), count }.encode_to_vec()).map(|_| ())
    }

    /// One heartbeat (long-polled by the coordinator for up to one interval), carrying this
    /// worker's latest progress record, if any.
    pub fn heartbeat(&mut self, progress: Option<proto::WorkerCheckpoint>) -> Result<proto::HeartbeatReply, ControlError> {
        let body = match progress {
            Some(p) => proto::HeartbeatRequest { progress: Some(p) }.encode_to_vec(),
            None => Vec::new(),
        };
        let r = self.call(Op::Heartbeat, body)?;
        decode_body(&r).map_err(ControlError::Malformed)
    }

    /// (Workers) records where this worker stands with every request acknowledged (answered
    /// at once): a replacement goes on from the newest record if the worker is lost.
    pub fn progress(&mut self, record: &proto::WorkerCheckpoint) -> Result<(), ControlError> {
        self.call(Op::Progress, record.encode_to_vec()).map(|_| ())
    }

    /// Sends a worker's reports to the BPG task scheduler and returns its next tasks (held by
    /// the coordinator until there is one when `req.wait`).
    pub fn schedule(&mut self, req: &proto::ScheduleRequest) -> Result<proto::ScheduleReply, ControlError> {
        let r = self.call(Op::Schedule, req.encode_to_vec())?;
        decode_body(&r).map_err(ControlError::Malformed)
    }

    /// A call to the coordinator's piece board (Sandblaster; held for `want` 2 and 3).
    pub fn pieces(&mut self, req: &proto::PieceRequest) -> Result<proto::PieceReply, ControlError> {
        let r = self.call(Op::Pieces, req.encode_to_vec())?;
        decode_body(&r).map_err(ControlError::Malformed)
    }

    /// A call to the coordinator's chunk board (data handed out by the scheduler; held with
    /// `wait` until a chunk comes back or the epoch is done).
    pub fn chunks(&mut self, req: &proto::ChunkRequest) -> Result<proto::ChunkReply, ControlError> {
        let r = self.call(Op::Chunks, req.encode_to_vec())?;
        decode_body(&r).map_err(ControlError::Malformed)
    }

    /// Reports a finished model-parallel round and returns this worker's blocks of the next
    /// (held until every worker finished the round).
    pub fn blocks(&mut self, req: &proto::BlocksRequest) -> Result<proto::BlocksReply, ControlError> {
        let r = self.call(Op::Blocks, req.encode_to_vec())?;
        decode_body(&r).map_err(ControlError::Malformed)
    }

    /// The routing table: waits up to `wait` for an active one of epoch `min_epoch` or later
    /// (replicated jobs, after a failure), else answers the current one.
    pub fn routing(&mut self, min_epoch: u64, wait: Duration) -> Result<proto::Routing, ControlError> {
        let body = proto::RoutingRequest { min_epoch, wait_ms: wait.as_millis() as u64 }.encode_to_vec();
        let r = self.call(Op::GetRouting, body)?;
        decode_body(&r).map_err(ControlError::Malformed)
    }

    /// (Servers of a replicated job) reports that this server moved to `epoch` and built
    /// the replicas it had to (`keys_copied` rows sent), or why it could not (`error`).
    pub fn epoch_ready(&mut self, epoch: u64, keys_copied: u64, error: &str) -> Result<(), ControlError> {
        let body = proto::EpochReady { epoch, keys_copied, error: error.into() }.encode_to_vec();
        self.call(Op::EpochReady, body).map(|_| ())
    }

    /// (Admin) drains server `rank` of a replicated job: the coordinator moves its shards to
    /// the other servers in a new epoch (returned with the server's node id) and the server
    /// exits once it hears it. Refused for unreplicated jobs, unknown or already removed
    /// servers, and when fewer servers than copies would be left.
    pub fn drain(&mut self, rank: u32) -> Result<proto::DrainReply, ControlError> {
        let r = self.call(Op::Drain, proto::DrainRequest { server: rank, ..Default::default() }.encode_to_vec())?;
        decode_body(&r).map_err(ControlError::Malformed)
    }

    /// [`ControlClient::drain`] of the server on the ring registered at data address `addr`
    /// (a pod's preStop hook drains itself by its advertised address).
    pub fn drain_addr(&mut self, addr: &str) -> Result<proto::DrainReply, ControlError> {
        let r = self.call(Op::Drain, proto::DrainRequest { addr: addr.to_string(), ..Default::default() }.encode_to_vec())?;
        decode_body(&r).map_err(ControlError::Malformed)
    }

    /// (Workers) joins checkpoint round `seq` with every push acknowledged, or (`retiring`)
    /// says this worker takes no more clocks; held until the round is written. The reply's
    /// `write` makes this worker the one to write it.
    pub fn checkpoint_join(&mut self, req: &proto::CheckpointJoin) -> Result<proto::CheckpointJoinReply, ControlError> {
        let r = self.call(Op::CheckpointJoin, req.encode_to_vec())?;
        decode_body(&r).map_err(ControlError::Malformed)
    }

    /// (The checkpoint's writer) reports checkpoint `seq` written at `path`, or why not.
    pub fn checkpoint_written(&mut self, seq: u64, path: &str, error: &str) -> Result<(), ControlError> {
        let body = proto::CheckpointWritten { seq, path: path.into(), error: error.into() }.encode_to_vec();
        self.call(Op::CheckpointWritten, body).map(|_| ())
    }

    /// Reports that this worker is done (`ok == false` fails the job with `message`).
    pub fn done(&mut self, ok: bool, message: &str) -> Result<(), ControlError> {
        self.call(Op::Done, proto::DoneRequest { ok, message: message.into() }.encode_to_vec()).map(|_| ())
    }
}

/// A reply body from a successful control call.
pub fn decode_body<M: Message + Default>(h: &FrameHeader) -> Result<M, String> {
    M::decode(h.meta.as_ref()).map_err(|e| format!("bad reply from the coordinator: {e}"))
}
