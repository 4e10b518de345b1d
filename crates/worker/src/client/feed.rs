//! A read cache's questions to the servers' update feeds ([`KvClient::feed`]): which rows of
//! a table changed since the position each server last gave (`downpour_core::feed`).

use super::recv::Reply;
use super::{bytes_like, ClientError, KvClient, Timestamp};
use downpour_core::feed::FeedPosition;
use downpour_core::msg::Op;
use downpour_core::proto;
use prost::Message;

/// One server's answer to a feed question ([`KvClient::wait_feed`]).
#[derive(Clone, Debug, Default, PartialEq)]
pub struct FeedAnswer {
    /// The position to ask from next time.
    pub position: FeedPosition,
    /// Whether the changes are known: if not, no row of this server may be taken as
    /// unchanged (and `keys` is empty).
    pub known: bool,
    /// The rows written since the position asked from (sorted keys, `value_len` values
    /// each), as of the answer.
    pub keys: Vec<u64>,
    /// Their values.
    pub values: Vec<f32>,
    /// On a table with a staleness bound, the answer's staleness at the clock the question
    /// was sent at: every update of clocks below that clock minus this is in every row of
    /// the server as of the answer.
    pub staleness: Option<u64>,
}

impl KvClient {
    /// Asks every server which rows of `table` changed since `since[s]` (its position in
    /// server `s`'s feed; `None` the first time, which turns the feed on and is answered
    /// "not known"); with `skip_own`, not rows only this client wrote (for a caller that
    /// applies its own pushes itself). Not held for clocks. Take the answers with
    /// [`KvClient::wait_feed`].
    /// Preconditions: `since` has one entry per server; the table is neither replicated
    /// nor `bsp` (the servers refuse).
    pub fn feed(&mut self, table: u32, since: &[Option<FeedPosition>], skip_own: bool) -> Result<Timestamp, ClientError> {
        let (vl, _, domain) = self.info(table)?;
        let n = self.servers.len();
        if since.len() != n {
            return Err(ClientError::Invalid(downpour_core::CoreError::Limit(format!(
                "feed positions for {} servers, but the client has {n}",
                since.len()
            ))));
        }
        let _ = self.before_issue()?;
        let ts = self.new_op(n, vl, true);
        if let Some(o) = self.ops.get_mut(&ts) {
            o.range_parts = vec![(Vec::new(), Vec::new()); n];
            o.part_meta = vec![Default::default(); n];
        }
        for (s, p) in since.iter().enumerate() {
            self.before_send(s, None)?;
            let body: bytes_like::Bytes =
                proto::FeedRequest { since: p.map(|p| proto::FeedPosition { generation: p.generation, offset: p.offset }), skip_own }
                    .encode_to_vec()
                    .into();
            let mut h = self.header(Op::Feed, ts, table);
            h.range_begin = domain.begin;
            h.range_end = domain.end;
            h.meta = body;
            self.send(s, &mut h, &[], &[])?;
            self.push_inflight(s, ts, Reply::SparseRange, 0, s);
        }
        Ok(Timestamp(ts))
    }

    /// Waits for feed question `ts` and takes every server's answer, in server order.
    pub fn wait_feed(&mut self, ts: Timestamp) -> Result<Vec<FeedAnswer>, ClientError> {
        if !self.ops.contains_key(&ts.0) {
            return Err(ClientError::UnknownTimestamp(ts));
        }
        self.drive(ts.0, None)?;
        let op = self.finish(ts.0)?;
        let vl = op.vl;
        let mut out = Vec::with_capacity(op.range_parts.len());
        for (s, ((keys, values), meta)) in op.range_parts.into_iter().zip(op.part_meta).enumerate() {
            let bad = |message: String| ClientError::BadReply { server: s, message };
            let r = proto::FeedReply::decode(meta.as_ref()).map_err(|e| bad(format!("feed reply: {e}")))?;
            let p = r.position.ok_or_else(|| bad("feed reply without a position".into()))?;
            if vl > 0 && values.len() != keys.len() * vl {
                return Err(bad(format!("feed reply of {} keys with {} values", keys.len(), values.len())));
            }
            out.push(FeedAnswer {
                position: FeedPosition { generation: p.generation, offset: p.offset },
                known: r.known,
                keys,
                values,
                staleness: r.staleness,
            });
        }
        Ok(out)
    }
}
