//! User-defined filters on the message path, without I/O: what a sender does to a message's
//! keys and values before they go on the wire, and what the receiver does to undo it.
//!
//! A [`Pipeline`] is a list of [`Filter`]s configured per table and direction. The sender
//! runs [`Pipeline::encode`] (filters in order), the receiver [`Pipeline::decode`] (in reverse
//! order); every filter records what it did in the message's [`proto::Encoding`], which
//! travels in the frame header, so the receiver decodes exactly what was encoded even when a
//! filter chose to do nothing (compression that would not pay, say).
//!
//! A [`Message`] has two forms: typed (`keys`, `values`) and wire (`key_bytes`,
//! `value_bytes`). Filters that change what is sent (significantly-modified, KKT) work on the
//! typed form; filters that change how it is sent (low precision, key caching, compression)
//! on the wire form, calling [`Message::to_wire`] first. Built-in filters:
//! * [`sigmod::SignificantlyModified`]: push an entry only when its accumulated change exceeds
//!   a threshold; the rest accumulates locally and is never lost;
//! * [`quant::LowPrecision`]: f16, bf16 or 8-bit fixed point with a per-message scale, with
//!   error feedback (the rounding error is carried into the next push);
//! * [`keycache::KeyCache`]: a key list the receiver has seen is replaced by its 128-bit
//!   signature; a receiver that no longer holds it answers a miss and the sender resends;
//! * [`compress::Compress`]: sorted keys delta-varint coded, then LZ4 or Zstandard, each part
//!   left raw when compressing it does not pay.

pub mod compress;
pub mod keycache;
pub mod quant;
pub mod sigmod;

use crate::proto;
use crate::{CoreError, Result};
use std::collections::HashMap;
use std::sync::Arc;

/// Makes a fresh instance of a user filter (one per pipeline: per connection, table and
/// direction, so instances may keep state).
pub type FilterFactory = Arc<dyn Fn() -> Box<dyn Filter> + Send + Sync>;

/// User filters by name. A table names them in its filter list as `user:NAME`; every worker
/// and every server must have registered the same names (the servers with
/// `ServerConfig::filters`, the workers with `KvClient::set_filter_registry`) before the table
/// is used, or the table is refused with a clear error.
#[derive(Clone, Default)]
pub struct FilterRegistry {
    custom: HashMap<String, FilterFactory>,
}

impl FilterRegistry {
    /// A registry with no user filter.
    pub fn new() -> FilterRegistry {
        FilterRegistry::default()
    }

    /// Registers `make` under `name` (letters, digits, `_` and `-`).
    pub fn register(&mut self, name: &str, make: FilterFactory) -> Result<()> {
        if name.is_empty() || !name.chars().all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '-') {
            return Err(CoreError::InvalidTable(format!("filter name {name:?}: use letters, digits, _ and -")));
        }
        self.custom.insert(name.to_string(), make);
        Ok(())
    }

    fn make(&self, name: &str) -> Result<Box<dyn Filter>> {
        match self.custom.get(name) {
            Some(f) => Ok(f()),
            None => {
                Err(CoreError::InvalidTable(format!("filter user:{name} is not registered here (register it on every worker and server)")))
            }
        }
    }
}

/// One message's payload as the filters see it.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Message {
    /// Sorted, unique keys (typed form).
    pub keys: Vec<u64>,
    /// `keys.len() × value_len` values (typed form; empty for a request without values).
    pub values: Vec<f32>,
    /// Values per key.
    pub value_len: usize,
    /// Wire form of the keys (valid when `wire` is true).
    pub key_bytes: Vec<u8>,
    /// Wire form of the values (valid when `wire` is true).
    pub value_bytes: Vec<u8>,
    /// Whether the wire form is current (the typed form may then be stale).
    pub wire: bool,
    /// What was done to the wire form.
    pub enc: proto::Encoding,
}

impl Message {
    /// A message in typed form. Precondition: `values` is empty or `keys.len() × value_len`.
    pub fn new(keys: Vec<u64>, values: Vec<f32>, value_len: usize) -> Message {
        Message { keys, values, value_len: value_len.max(1), ..Default::default() }
    }

    /// A received message in wire form with its encoding.
    pub fn from_wire(key_bytes: Vec<u8>, value_bytes: Vec<u8>, value_len: usize, enc: proto::Encoding) -> Message {
        Message { key_bytes, value_bytes, value_len: value_len.max(1), wire: true, enc, ..Default::default() }
    }

    /// Makes the wire form current: raw little-endian keys and f32 values, unless a filter has
    /// already produced them.
    pub fn to_wire(&mut self) {
        if !self.wire {
            self.enc.num_keys = self.keys.len() as u64;
            self.key_bytes = self.keys.iter().flat_map(|k| k.to_le_bytes()).collect();
            self.value_bytes = self.values.iter().flat_map(|v| v.to_le_bytes()).collect();
            self.wire = true;
        }
    }

    /// Makes the typed form current from raw wire bytes (after every filter has decoded).
    /// Errors when the bytes do not hold whole keys and values of the declared count.
    pub fn to_typed(&mut self) -> Result<()> {
        if !self.wire {
            return Ok(());
        }
        if !self.key_bytes.len().is_multiple_of(8) || !self.value_bytes.len().is_multiple_of(4) {
            return Err(CoreError::Codec(format!(
                "decoded payload of {} key bytes and {} value bytes is not whole keys and values",
                self.key_bytes.len(),
                self.value_bytes.len()
            )));
        }
        self.keys = self.key_bytes.chunks_exact(8).map(|c| u64::from_le_bytes(c.try_into().unwrap_or([0; 8]))).collect();
        self.values = self.value_bytes.chunks_exact(4).map(|c| f32::from_le_bytes(c.try_into().unwrap_or([0; 4]))).collect();
        if self.enc.num_keys != self.keys.len() as u64 {
            return Err(CoreError::Codec(format!("decoded {} keys, the sender encoded {}", self.keys.len(), self.enc.num_keys)));
        }
        // A values-only message (a pull reply) has no keys to check against.
        if !self.values.is_empty() && !self.keys.is_empty() && self.values.len() != self.keys.len() * self.value_len {
            return Err(CoreError::Codec(format!(
                "decoded {} values for {} keys of length {}",
                self.values.len(),
                self.keys.len(),
                self.value_len
            )));
        }
        self.wire = false;
        Ok(())
    }

    /// Bytes this message takes on the wire now (its wire form, or the raw size of its typed form).
    pub fn wire_len(&self) -> usize {
        if self.wire {
            self.key_bytes.len() + self.value_bytes.len()
        } else {
            self.keys.len() * 8 + self.values.len() * 4
        }
    }
}

/// A filter on the message path. The sender calls [`Filter::encode`], the receiver
/// [`Filter::decode`] on its own instance configured the same way. Both must agree through
/// [`proto::Encoding`] alone: a filter records in `m.enc` everything its decode needs.
pub trait Filter: Send {
    /// Short name, for traffic reports.
    fn name(&self) -> &'static str;
    /// Sender side: transforms `m`.
    fn encode(&mut self, m: &mut Message) -> Result<()>;
    /// Receiver side: undoes [`Filter::encode`] as recorded in `m.enc`. Filters that only
    /// decide what is sent (significantly-modified, KKT) have nothing to undo.
    fn decode(&mut self, m: &mut Message) -> Result<()> {
        let _ = m;
        Ok(())
    }

    /// True for a filter that may leave out part of the message on the assumption that
    /// the receiver holds it (key caching): [`Pipeline::encode_resendable`] keeps what went
    /// into it, so the message can be resent in full after a miss.
    fn omits_known_parts(&self) -> bool {
        false
    }

    /// Sender: the receiver answered a miss for the part with this signature.
    fn forget(&mut self, sig: &[u8]) {
        let _ = sig;
    }

    /// Sender: the next message should also carry everything this filter holds back (the
    /// end of training, say), so nothing stays behind.
    fn flush_next(&mut self) {}
}

/// Bytes before and after one filter, summed over messages.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct FilterTraffic {
    /// The filter's name.
    pub name: &'static str,
    /// Messages it saw.
    pub messages: u64,
    /// Payload bytes before it ran.
    pub bytes_in: u64,
    /// Payload bytes after it ran.
    pub bytes_out: u64,
}

/// The filters of one table and direction, in sender order, with per-filter byte counts.
#[derive(Default)]
pub struct Pipeline {
    filters: Vec<Box<dyn Filter>>,
    traffic: Vec<FilterTraffic>,
}

impl Pipeline {
    /// An empty pipeline (messages go raw).
    pub fn new() -> Pipeline {
        Pipeline::default()
    }

    /// Appends `f` (runs after the filters already added when encoding).
    pub fn push(&mut self, f: Box<dyn Filter>) {
        self.traffic.push(FilterTraffic { name: f.name(), ..Default::default() });
        self.filters.push(f);
    }

    /// Whether there is any filter.
    pub fn is_empty(&self) -> bool {
        self.filters.is_empty()
    }

    /// Sender side: runs every filter in order, then makes the wire form current.
    pub fn encode(&mut self, m: &mut Message) -> Result<()> {
        for (f, t) in self.filters.iter_mut().zip(self.traffic.iter_mut()) {
            t.messages += 1;
            t.bytes_in += m.wire_len() as u64;
            f.encode(m)?;
            t.bytes_out += m.wire_len() as u64;
        }
        m.to_wire();
        Ok(())
    }

    /// Like [`Pipeline::encode`], and returns the message as it was before the first filter
    /// that omits parts the receiver is assumed to hold, when there is one: give it to
    /// [`Pipeline::resend`] if the receiver answers a miss.
    pub fn encode_resendable(&mut self, m: &mut Message) -> Result<Option<Message>> {
        let mut snapshot = None;
        for (f, t) in self.filters.iter_mut().zip(self.traffic.iter_mut()) {
            if f.omits_known_parts() && snapshot.is_none() {
                m.to_wire();
                snapshot = Some(m.clone());
            }
            t.messages += 1;
            t.bytes_in += m.wire_len() as u64;
            f.encode(m)?;
            t.bytes_out += m.wire_len() as u64;
        }
        m.to_wire();
        Ok(snapshot)
    }

    /// After a miss for signature `sig`: every filter forgets it, and `snapshot` (from
    /// [`Pipeline::encode_resendable`]) is encoded again by the filters after the omitting one
    /// only, so the message goes whole and nothing upstream (accumulations, carried errors)
    /// counts twice.
    pub fn resend(&mut self, mut snapshot: Message, sig: &[u8]) -> Result<Message> {
        let mut after = false;
        for f in self.filters.iter_mut() {
            f.forget(sig);
            if after {
                f.encode(&mut snapshot)?;
            } else if f.omits_known_parts() {
                after = true;
            }
        }
        snapshot.to_wire();
        Ok(snapshot)
    }

    /// Receiver side: runs every filter's decode in reverse order, then makes the typed form
    /// current.
    pub fn decode(&mut self, m: &mut Message) -> Result<()> {
        for (f, t) in self.filters.iter_mut().zip(self.traffic.iter_mut()).rev() {
            t.messages += 1;
            t.bytes_out += m.wire_len() as u64;
            f.decode(m)?;
            t.bytes_in += m.wire_len() as u64;
        }
        m.to_typed()
    }

    /// Sender: every filter's next message carries what it holds back
    /// ([`Filter::flush_next`]); encode an empty message next to send it.
    pub fn flush_next(&mut self) {
        for f in self.filters.iter_mut() {
            f.flush_next();
        }
    }

    /// Bytes before and after each filter so far (for the receiver, "before" is what the
    /// filter restored and "after" what arrived).
    pub fn traffic(&self) -> &[FilterTraffic] {
        &self.traffic
    }
}

/// A table's filter settings (`TableSpec.filters`, `--filters`): a comma-separated list of
/// `user:NAME` (a filter registered in a [`FilterRegistry`]; user filters run first, in the
/// order written, on the typed form, in requests and replies), `sigmod:T`
/// (significantly-modified, threshold T), `f16` | `bf16` | `q8` (low-precision values; pushes
/// carry their rounding error forward), `keycache[:SLOTS]` (default 1024 slots) and
/// `lz4` | `zstd[:LEVEL]` (default level 3). The built-ins always run in that order, whatever
/// the order written; `none` or empty is no filter.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct FilterSpec {
    /// User filters, by registered name, in order.
    pub user: Vec<String>,
    /// Significantly-modified threshold.
    pub sigmod: Option<f32>,
    /// Low-precision values.
    pub precision: Option<quant::Precision>,
    /// Key-cache slots.
    pub keycache: Option<usize>,
    /// Compression.
    pub codec: Option<compress::Codec>,
}

/// Bytes of key lists a receiver keeps per connection and table (key caching).
pub const KEY_CACHE_BYTES: usize = 64 << 20;

impl FilterSpec {
    /// Whether any filter is set.
    pub fn is_empty(&self) -> bool {
        *self == FilterSpec::default()
    }

    /// The pipelines with user filters from `reg` in front: (request sender, request
    /// receiver, reply). Errors when a user filter is not registered.
    pub fn pipelines(&self, reg: &FilterRegistry) -> Result<(Pipeline, Pipeline, Pipeline)> {
        let with_user = |built: Pipeline| -> Result<Pipeline> {
            let mut p = Pipeline::new();
            for name in &self.user {
                p.push(reg.make(name)?);
            }
            for f in built.filters {
                p.push(f);
            }
            Ok(p)
        };
        Ok((with_user(self.request_sender())?, with_user(self.request_receiver())?, with_user(self.reply())?))
    }

    /// The worker's pipeline for its requests (pushes and pulls) to one server (built-in
    /// filters only; [`FilterSpec::pipelines`] adds the user filters).
    pub fn request_sender(&self) -> Pipeline {
        let mut p = Pipeline::new();
        if let Some(t) = self.sigmod {
            p.push(Box::new(sigmod::SignificantlyModified::new(t)));
        }
        if let Some(q) = self.precision {
            p.push(Box::new(quant::LowPrecision::new(q, true)));
        }
        self.lossless(&mut p);
        p
    }

    /// The server's pipeline for one connection's requests (the decoding side of
    /// [`FilterSpec::request_sender`]).
    pub fn request_receiver(&self) -> Pipeline {
        let mut p = Pipeline::new();
        if let Some(q) = self.precision {
            p.push(Box::new(quant::LowPrecision::new(q, false)));
        }
        self.lossless(&mut p);
        p
    }

    /// Both ends' pipeline for pull replies (values only: low precision without carried
    /// errors, then compression).
    pub fn reply(&self) -> Pipeline {
        let mut p = Pipeline::new();
        if let Some(q) = self.precision {
            p.push(Box::new(quant::LowPrecision::new(q, false)));
        }
        if let Some(c) = self.codec {
            p.push(Box::new(compress::Compress::new(c)));
        }
        p
    }

    fn lossless(&self, p: &mut Pipeline) {
        if let Some(n) = self.keycache {
            p.push(Box::new(keycache::KeyCache::new(n, KEY_CACHE_BYTES)));
        }
        if let Some(c) = self.codec {
            p.push(Box::new(compress::Compress::new(c)));
        }
    }
}

impl std::fmt::Display for FilterSpec {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let mut parts: Vec<String> = self.user.iter().map(|n| format!("user:{n}")).collect();
        if let Some(t) = self.sigmod {
            parts.push(format!("sigmod:{t}"));
        }
        match self.precision {
            Some(quant::Precision::F16) => parts.push("f16".into()),
            Some(quant::Precision::Bf16) => parts.push("bf16".into()),
            Some(quant::Precision::Q8) => parts.push("q8".into()),
            None => {}
        }
        if let Some(n) = self.keycache {
            parts.push(format!("keycache:{n}"));
        }
        match self.codec {
            Some(compress::Codec::Lz4) => parts.push("lz4".into()),
            Some(compress::Codec::Zstd(l)) => parts.push(format!("zstd:{l}")),
            None => {}
        }
        write!(f, "{}", if parts.is_empty() { "none".to_string() } else { parts.join(",") })
    }
}

impl std::str::FromStr for FilterSpec {
    type Err = CoreError;
    fn from_str(s: &str) -> Result<FilterSpec> {
        let mut spec = FilterSpec::default();
        let bad = |what: &str| {
            CoreError::InvalidTable(format!(
                "filter {what:?}: expected user:NAME, sigmod:T, f16, bf16, q8, keycache[:SLOTS], lz4 or zstd[:LEVEL]"
            ))
        };
        for part in s.split(',').map(str::trim).filter(|p| !p.is_empty() && *p != "none") {
            let (name, arg) = match part.split_once(':') {
                Some((n, a)) => (n, Some(a)),
                None => (part, None),
            };
            match (name, arg) {
                ("user", Some(n)) if !n.is_empty() => spec.user.push(n.to_string()),
                ("sigmod", Some(a)) => {
                    let t: f32 = a.parse().map_err(|_| bad(part))?;
                    if !t.is_finite() || t < 0.0 {
                        return Err(bad(part));
                    }
                    spec.sigmod = Some(t);
                }
                ("f16", None) => spec.precision = Some(quant::Precision::F16),
                ("bf16", None) => spec.precision = Some(quant::Precision::Bf16),
                ("q8", None) => spec.precision = Some(quant::Precision::Q8),
                ("keycache", a) => {
                    let n: usize = a.map(|a| a.parse().map_err(|_| bad(part))).transpose()?.unwrap_or(1024);
                    if n == 0 || n > 1 << 16 {
                        return Err(bad(part));
                    }
                    spec.keycache = Some(n);
                }
                ("lz4", None) => spec.codec = Some(compress::Codec::Lz4),
                ("zstd", a) => {
                    let l: i32 = a.map(|a| a.parse().map_err(|_| bad(part))).transpose()?.unwrap_or(3);
                    if !(1..=19).contains(&l) {
                        return Err(bad(part));
                    }
                    spec.codec = Some(compress::Codec::Zstd(l));
                }
                _ => return Err(bad(part)),
            }
        }
        Ok(spec)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn sorted_keys(mut k: Vec<u64>) -> Vec<u64> {
        k.sort_unstable();
        k.dedup();
        k
    }

    proptest! {
        #[test]
        fn a_pipeline_of_lossless_filters_round_trips_exactly(
            raw in proptest::collection::vec(any::<u64>(), 0..400),
            vl in 1usize..4,
            zstd in any::<bool>(),
        ) {
            let keys = sorted_keys(raw);
            let values: Vec<f32> = (0..keys.len() * vl).map(|i| (i as f32).sin()).collect();
            let codec = if zstd { compress::Codec::Zstd(3) } else { compress::Codec::Lz4 };
            let mut tx = Pipeline::new();
            tx.push(Box::new(keycache::KeyCache::new(8, 1 << 20)));
            tx.push(Box::new(compress::Compress::new(codec)));
            let mut rx = Pipeline::new();
            rx.push(Box::new(keycache::KeyCache::new(8, 1 << 20)));
            rx.push(Box::new(compress::Compress::new(codec)));
            for round in 0..3 {
                let mut m = Message::new(keys.clone(), values.clone(), vl);
                tx.encode(&mut m).unwrap();
                if round > 0 && keys.len() >= keycache::MIN_KEYS {
                    prop_assert!(m.enc.keys_omitted, "a repeated key list goes as its signature");
                }
                let mut got = Message::from_wire(m.key_bytes, m.value_bytes, vl, m.enc);
                rx.decode(&mut got).unwrap();
                prop_assert_eq!(&got.keys, &keys);
                prop_assert_eq!(got.values.iter().map(|v| v.to_bits()).collect::<Vec<_>>(), values.iter().map(|v| v.to_bits()).collect::<Vec<_>>());
            }
        }
    }

    #[test]
    fn filter_specs_parse_print_and_refuse_nonsense() {
        let s: FilterSpec = "lz4, keycache, q8,sigmod:0.01".parse().unwrap();
        assert_eq!(s.to_string(), "sigmod:0.01,q8,keycache:1024,lz4");
        assert_eq!(s.to_string().parse::<FilterSpec>().unwrap(), s);
        assert!("none".parse::<FilterSpec>().unwrap().is_empty());
        let u: FilterSpec = "zstd,user:mine,user:other".parse().unwrap();
        assert_eq!(u.to_string(), "user:mine,user:other,zstd:3");
        assert!(u.pipelines(&FilterRegistry::new()).is_err(), "unregistered user filters are refused");
        assert!("user:".parse::<FilterSpec>().is_err());
        assert!("".parse::<FilterSpec>().unwrap().is_empty());
        for bad in ["gzip", "sigmod", "sigmod:-1", "keycache:0", "zstd:99", "q8:3", "lz4:1"] {
            assert!(bad.parse::<FilterSpec>().is_err(), "{bad}");
        }
    }

    #[test]
    fn a_miss_is_cured_by_resending_the_snapshot_without_counting_twice() {
        let spec: FilterSpec = "sigmod:0,keycache:2,lz4".parse().unwrap();
        let mut tx = spec.request_sender();
        let mut rx = spec.request_receiver();
        let keys: Vec<u64> = (0..100).collect();
        // first send: keys travel and are cached
        let mut m = Message::new(keys.clone(), vec![1.0; 100], 1);
        tx.encode_resendable(&mut m).unwrap();
        let mut r = Message::from_wire(m.key_bytes, m.value_bytes, 1, m.enc);
        rx.decode(&mut r).unwrap();
        // the receiver loses its cache (a new server process, say)
        let mut rx = spec.request_receiver();
        let mut m = Message::new(keys.clone(), vec![2.0; 100], 1);
        let snapshot = tx.encode_resendable(&mut m).unwrap().unwrap();
        assert!(m.enc.keys_omitted);
        let sig = m.enc.key_sig.clone();
        let mut r = Message::from_wire(m.key_bytes, m.value_bytes, 1, m.enc);
        assert!(matches!(rx.decode(&mut r), Err(CoreError::KeyCacheMiss { .. })));
        let again = tx.resend(snapshot, &sig).unwrap();
        let mut r = Message::from_wire(again.key_bytes, again.value_bytes, 1, again.enc);
        rx.decode(&mut r).unwrap();
        assert_eq!(r.keys, keys);
        assert_eq!(r.values, vec![2.0; 100], "the accumulation was not applied twice");
    }

    #[test]
    fn a_raw_message_decodes_with_an_empty_pipeline_and_bad_lengths_are_errors() {
        let mut m = Message::new(vec![1, 5, 9], vec![1.0, 2.0, 3.0], 1);
        Pipeline::new().encode(&mut m).unwrap();
        assert_eq!(m.key_bytes.len(), 24);
        let mut r = Message::from_wire(m.key_bytes.clone(), m.value_bytes.clone(), 1, m.enc.clone());
        Pipeline::new().decode(&mut r).unwrap();
        assert_eq!(r.keys, vec![1, 5, 9]);
        let mut bad = Message::from_wire(m.key_bytes[..20].to_vec(), m.value_bytes, 1, m.enc);
        assert!(Pipeline::new().decode(&mut bad).is_err());
    }
}
