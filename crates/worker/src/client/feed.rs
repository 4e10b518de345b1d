//! A read cache's questions to the servers' update feeds ([`KvClient::feed`]): which rows of
//! a table changed since the position each server last gave (`downpour_core::feed`).

use super::recv::Reply;
use super::{bytes_like, ClientError, KvClient, Timestamp};
use downpour_core::feed::FeedPosition;
use downpour_core::msg::Op;
use downpour_core::proto;
use downpour_core::subscription::Subscription;
use downpour_transport::key_bytes;
use prost::Message;

/// One server's part of a feed question ([`KvClient::feed`]).
#[derive(Clone, Copy, Debug, Default)]
pub struct FeedQuestion<'a> {
    /// The position in the server's feed to ask from (`None` the first time, which turns
    /// the feed on and is answered "not known").
    pub since: Option<FeedPosition>,
    /// Ask by subscription (`downpour_core::subscription`): `Some((new, copy))` first adds
    /// `new` (sorted keys of this server) to the subscription on this connection, of which
    /// `copy` is the asker's copy before them (the server checks its count and digest, and
    /// resets its own when they differ); the answer then holds only subscribed rows, named
    /// by rank ([`FeedAnswer::ranked`]). `None`: every changed row, by key. One subscriber
    /// per table and client: the server keeps one copy per connection and table.
    pub subscribe: Option<(&'a [u64], &'a Subscription)>,
}

/// One server's answer to a feed question ([`KvClient::wait_feed`]).
#[derive(Clone, Debug, Default, PartialEq)]
pub struct FeedAnswer {
    /// The position to ask from next time.
    pub position: FeedPosition,
    /// Whether the changes are known: if not, no row of this server may be taken as
    /// unchanged (and `keys` is empty).
    pub known: bool,
    /// The rows written since the position asked from, as of the answer, in key order:
    /// their keys, or with [`FeedAnswer::ranked`] their ranks in the subscription (turn
    /// them into keys with the asker's copy, `Subscription::keys_of`).
    pub keys: Vec<u64>,
    /// Their values (`value_len` each).
    pub values: Vec<f32>,
    /// On a table with a staleness bound, the answer's staleness at the clock the question
    /// was sent at: every update of clocks below that clock minus this is in every row of
    /// the server as of the answer.
    pub staleness: Option<u64>,
    /// Asked by subscription: `keys` are ranks.
    pub ranked: bool,
    /// Asked by subscription: the server's copy was not the asker's (a new connection) or
    /// had outgrown the table; it now holds only the question's new keys, and the answer is
    /// not known.
    pub subscription_reset: bool,
}

impl KvClient {
    /// Asks every server which rows of `table` changed since `questions[s].since`, by
    /// subscription where the question says so; with `skip_own`, not rows only this client
    /// wrote (for a caller that applies its own pushes itself). Not held for clocks. Take
    /// the answers with [`KvClient::wait_feed`].
    /// Preconditions: `questions` has one entry per server, all by subscription or none; the table is neither
    /// replicated nor `bsp` (the servers refuse); one question at a time per table when
    /// asking by subscription (the copies change in question order).
    pub fn feed(&mut self, table: u32, questions: &[FeedQuestion<'_>], skip_own: bool) -> Result<Timestamp, ClientError> {
        let (vl, _, domain) = self.info(table)?;
        let n = self.servers.len();
        if questions.len() != n {
            return Err(ClientError::Invalid(downpour_core::CoreError::Limit(format!(
                "feed questions for {} servers, but the client has {n}",
                questions.len()
            ))));
        }
        let ranked = questions.iter().any(|q| q.subscribe.is_some());
        if questions.iter().any(|q| q.subscribe.is_some() != ranked) {
            return Err(ClientError::Invalid(downpour_core::CoreError::Limit(
                "feed questions by subscription to some servers only: ask every server the same way".into(),
            )));
        }
        let _ = self.before_issue()?;
        let ts = self.new_op(n, vl, true);
        if let Some(o) = self.ops.get_mut(&ts) {
            o.range_parts = vec![(Vec::new(), Vec::new()); n];
            o.part_meta = vec![Default::default(); n];
            o.ranked = ranked;
        }
        for (s, q) in questions.iter().enumerate() {
            self.before_send(s, None)?;
            let (new, held, digest) = q.subscribe.map_or((&[][..], 0, 0), |(n, c)| (n, c.len(), c.digest()));
            let body: bytes_like::Bytes = proto::FeedRequest {
                since: q.since.map(|p| proto::FeedPosition { generation: p.generation, offset: p.offset }),
                skip_own,
                subscribed_only: q.subscribe.is_some(),
                subscribed: held,
                digest,
            }
            .encode_to_vec()
            .into();
            let mut h = self.header(Op::Feed, ts, table);
            h.range_begin = domain.begin;
            h.range_end = domain.end;
            h.meta = body;
            self.send(s, &mut h, key_bytes(new), &[])?;
            let reply = if ranked { Reply::Ranked { vl } } else { Reply::SparseRange };
            self.push_inflight(s, ts, reply, 0, s);
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
                ranked: op.ranked,
                subscription_reset: r.subscription_reset,
            });
        }
        Ok(out)
    }
}
