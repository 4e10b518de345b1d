//! Connections to the job's other servers: connecting and identifying ([`peer_connect`]),
//! a connection's forwarding connections ([`forward_conn`]), reading a peer's answer
//! ([`peer_ack`]), and which nodes count as peers ([`is_peer`]).

use super::Forwarding;
use crate::state::ServerState;
use downpour_core::msg::{self, Op};
use downpour_transport::Connection;
use std::time::Duration;

/// How long a chain member waits for its successor's acknowledgement of a request.
const FORWARD_TIMEOUT: Duration = Duration::from_secs(10);

/// Connects to another server of the job (identifying with this node's credential when
/// the cluster has a secret).
pub(crate) fn peer_connect(st: &ServerState, node: u32, me: u32) -> Result<Box<dyn Connection>, String> {
    let addr = st
        .repl
        .read()
        .as_ref()
        .and_then(|r| r.addr(node).map(str::to_string))
        .ok_or_else(|| format!("node {node} is not in the routing table"))?;
    let t = st.cfg.peer_transport.as_ref().ok_or("this server has no transport to reach its peers")?;
    let mut c = t.connect(&addr, Duration::from_secs(5)).map_err(|e| e.to_string())?;
    c.set_recv_timeout(Some(FORWARD_TIMEOUT)).map_err(|e| e.to_string())?;
    if let Some(secret) = &st.cfg.secret {
        let mut h = msg::request(Op::Identify, me, 0, 0, 0);
        h.meta = msg::worker_credential(secret, me).to_vec().into();
        c.send(&mut h, &[], &[]).map_err(|e| e.to_string())?;
        peer_ack(c.as_mut()).map_err(|e| format!("node {node} refused this server: {e}"))?;
    }
    Ok(c)
}

/// Reads a peer's one-frame answer: `Ok` for a success, else what went wrong.
pub(crate) fn peer_ack(c: &mut dyn Connection) -> Result<(), String> {
    match c.recv_header() {
        Ok(Some(r)) if r.status == 0 => Ok(()),
        Ok(Some(r)) => Err(r.error),
        Ok(None) => Err("the connection was closed".into()),
        Err(e) => Err(e.to_string()),
    }
}

pub(crate) fn forward_conn<'a>(
    st: &ServerState,
    fwd: &'a mut Forwarding,
    node: u32,
    me: u32,
) -> Result<&'a mut Box<dyn Connection>, String> {
    match fwd.conns.entry(node) {
        std::collections::hash_map::Entry::Occupied(e) => Ok(e.into_mut()),
        std::collections::hash_map::Entry::Vacant(e) => Ok(e.insert(peer_connect(st, node, me)?)),
    }
}

/// Whether `node` is a server of this replicated job (in the current routing or the last
/// one served): only those forward pushes and send replica copies.
pub(crate) fn is_peer(st: &ServerState, node: u32) -> bool {
    st.repl.read().as_ref().is_some_and(|r| r.active_members.contains(&node) || r.routing.servers.iter().any(|s| s.node_id == node))
}
