//! A worker-side read cache for `ssp:τ` tables (Petuum's process cache; REFERENCE §3, the
//! seeds' `003_*` and `001_*` slide 18).
//!
//! Under `ssp:τ` a pull issued at clock `c` must see every update of clocks below `c − τ`.
//! A server's answer says how fresh it is: its staleness `st` means the values include every
//! update of clocks below `F = c − st` (the oldest clock all workers completed on that
//! range). A row fetched with freshness `F` therefore answers, without asking any server, a
//! read at any clock `c' ≤ F + τ`: its staleness there, `c' − F`, is within the bound. A
//! [`ReadCache`] keeps the rows a worker pulled with their freshness, answers the keys it
//! holds fresh enough from memory and pulls only the others; a row read at its last valid
//! clock is refreshed in the background (a pull nobody waits for, folded in by a later
//! read). Every read still counts in the client's staleness histogram with its true
//! staleness, so the bound is checked the same way with and without the cache.
//!
//! With [`ReadCache::with_feed`] the servers' update feeds (`downpour_core::feed`; Petuum's
//! SSPPush, asked once a clock instead of pushed) keep the rows fresh too. Each server's
//! questions are numbered; a row carries a *stamp*, the number of questions sent to its
//! server before its fetch was (a server answers one connection's requests in order, so the
//! fetch saw the server after it read position `P_j` for question `j`), or the number of the
//! answer that brought it. Answer `k + 1` names every row written between the server's
//! positions `P_k` and `P_{k+1}` (less those only this worker wrote, which it folds in
//! itself), so a row stamped `j` with `chain_start ≤ j ≤ k` (its value is the server's at
//! some moment after `P_j`, and every later change came in an answer) is as fresh as answer
//! `k`. An answer that cannot name the changes (another generation of the feed) restarts
//! the chain, and so does dropping rows for room. A row is replaced only by one of a later
//! stamp (or the same stamp and a freshness at least its own), so a fetch answered before
//! an answer that was applied first cannot take it back.
//!
//! The answers name only rows the worker holds: each question subscribes the rows fetched
//! since the one before (`downpour_core::subscription`, Petuum's row registration), and the
//! server answers with the subscribed rows that changed, by their rank in the subscription
//! (a byte or two) instead of their key (eight). A row counts as kept up to date only once
//! subscribed, by question `j + 1` at the latest for stamp `j`, and since the server's
//! copy of the subscription was last reset (a new connection, rows dropped for room, a
//! failed question: the question's count and digest of the subscribed keys tell the server
//! its copy differs); a row subscribed before a reset is subscribed again at its next fetch.
//!
//! The worker's own pushes since a row was fetched are folded in where the table's rule
//! makes that exact (`add`, `sgd`; [`ReadCache::pushed`]); under other rules (FTRL,
//! AdaGrad, …), which cannot be replayed on the worker, a row shows them at its next fetch,
//! which `ssp` allows (it only promises updates older than the bound) but which makes the
//! staleness a read actually sees reach the bound. A read sent while an earlier one is still
//! pulling some of its rows (a pipelined job sends the next read before waiting for the
//! current one) takes those rows from the earlier answer once it lands instead of pulling
//! them twice; it then also shows the own pushes made between the two waits (more than a
//! server would have shown it, never less). Requests answered from memory take no request id, so a job
//! whose requests must replay with the same ids (checkpoints, replacement of a worker of a
//! replicated job) must not use it.

use crate::{ClientError, FeedQuestion, KvClient, Timestamp};
use downpour_core::consistency::Consistency;
use downpour_core::feed::FeedPosition;
use downpour_core::hashstore::HashStore;
use downpour_core::partition::Partition;
use downpour_core::subscription::Subscription;
use downpour_core::CoreError;
use std::collections::VecDeque;

/// Counts of a [`ReadCache`].
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct CacheStats {
    /// Rows read through the cache.
    pub rows_read: u64,
    /// Of those, rows answered from memory.
    pub rows_hit: u64,
    /// Reads (calls) answered entirely from memory.
    pub reads_local: u64,
    /// Reads in all.
    pub reads: u64,
    /// Background refresh pulls issued.
    pub refreshes: u64,
    /// Update-feed answers applied (one question per clock to every server).
    pub feed_answers: u64,
    /// Rows those answers carried (subscribed rows written since the question before).
    pub feed_rows: u64,
    /// Rows subscribed to at the servers (their changes come in the answers), now.
    pub subscribed: u64,
}

impl CacheStats {
    /// The fraction of rows answered from memory (0 before any read).
    pub fn hit_rate(&self) -> f64 {
        self.rows_hit as f64 / self.rows_read.max(1) as f64
    }
}

/// A read in progress: the rows found in memory, and the pull of the others.
#[derive(Debug)]
pub struct PendingRead {
    values: Vec<f32>,
    /// Positions (in the caller's keys) of the rows pulled, and their keys.
    missing: Vec<u32>,
    missing_keys: Vec<u64>,
    /// The keys pulled when rows about to expire rode along (sorted; empty: just
    /// `missing_keys`).
    pulled: Vec<u64>,
    pull: Option<Timestamp>,
    /// Positions and keys of rows that an earlier read still in flight is pulling: taken
    /// from its answer once it lands (or pulled then, if that answer is too stale).
    deferred: Vec<u32>,
    deferred_keys: Vec<u64>,
    /// This read's number.
    seq: u64,
    clock: u64,
    /// Own pushes before the pull was sent.
    pushes: u64,
    /// Largest staleness among the rows answered from memory.
    hit_staleness: Option<u64>,
    /// Per server, the feed questions sent before the pull was (its rows' stamp).
    stamps: Vec<u64>,
}

/// The cache's place in one server's update feed (see [`ReadCache`]'s doc): rows stamped
/// `chain_start..=count` are kept up to date by the answers, so they are at least as fresh
/// as the last one.
#[derive(Debug, Default, Clone)]
struct FeedState {
    /// Where to ask from next (`None`: never asked).
    since: Option<FeedPosition>,
    /// Answers applied.
    count: u64,
    /// Rows stamped below this missed changes (an answer that did not know them, or rows
    /// dropped for room): not kept up to date.
    chain_start: u64,
    /// The last answer's freshness (every update of clocks below it is in those rows).
    fresh: Option<u64>,
    /// This end's copy of the subscription at the server (the rows the answers cover).
    sub: Subscription,
    /// Rows subscribed by a question numbered below this do not count: the server's copy
    /// was reset since.
    floor: u64,
    /// Keys of rows fetched from this server and not subscribed yet (go with the next
    /// question), and those the question in flight added.
    pending: Vec<u64>,
    sent: Vec<u64>,
    /// Times the copy was emptied here (rows dropped for room, a failed question), and
    /// that count when the question in flight went out: an answer to a question sent before
    /// the last emptying names ranks of the old copy.
    emptied: u64,
    asked_emptied: u64,
}

impl FeedState {
    /// Empties this end's copy of the subscription: rows subscribed by a question numbered
    /// below `floor` no longer count, and an answer to a question sent before now is not
    /// read against the emptied copy. The next question's count and digest then differ
    /// from the server's copy, which starts over too.
    fn forget_copy(&mut self, floor: u64) {
        self.sub.clear();
        self.floor = floor;
        self.emptied += 1;
    }
}

/// The read cache of one `ssp` table (see the module doc).
pub struct ReadCache {
    table: u32,
    vl: usize,
    tau: u64,
    capacity: usize,
    /// The rows: per key its values, then its [`Meta`] in [`META`] state words (the
    /// servers' sparse store: rows inline, lookups prefetched a few keys ahead).
    store: HashStore,
    /// How the table's rule folds a push into a row when that is exact: `Some(c)` adds
    /// `c × value` (`add`: 1, `sgd`: −lr); `None` for the other rules.
    own: Option<f32>,
    /// Background refreshes in flight: the pull, its keys, the clock it was issued at, how
    /// many own pushes came before it, and the feed questions sent before it.
    refreshing: VecDeque<Refresh>,
    /// Own pushes folded in so far, and those a pull still in flight did not see (it was
    /// sent before them): `(sequence number, keys, row changes)`, replayed onto that pull's
    /// rows when they land, so a row never loses a push the servers have not shown it yet.
    pushes: u64,
    push_log: VecDeque<(u64, Vec<u64>, Vec<f32>)>,
    /// Buffers of log entries no longer needed, reused by the next pushes.
    spare: Vec<(Vec<u64>, Vec<f32>)>,
    /// Pulls in flight by the number of own pushes before them.
    in_flight: std::collections::BTreeMap<u64, usize>,
    /// Own pushes to add to the rows an insert writes (reused).
    add: Vec<f32>,
    /// The keys the last read that pulled is pulling, and its number, until it is waited
    /// for: a read sent meanwhile (a pipelined job sends the next read before waiting for
    /// this one) takes those rows from its answer instead of pulling them again.
    last: Option<(u64, Vec<u64>)>,
    reads_sent: u64,
    stats: CacheStats,
    /// The servers' update feeds, when used: which server holds a key, the place in each
    /// feed, the question in flight (its id, clock and own pushes before it) and the clock
    /// of the last question.
    feed: Option<Partition>,
    feeds: Vec<FeedState>,
    asking: Option<(Timestamp, u64, u64)>,
    asked_clock: Option<u64>,
}

/// What the cache knows of a row besides its values: its own freshness (every update below
/// it is in), the feed stamp of its fetch, its server, and the number of the feed question
/// that subscribed it there (0: none; see [`ReadCache`]).
#[derive(Clone, Copy, Debug, Default)]
struct Meta {
    fresh: u64,
    stamp: u64,
    server: u32,
    sub: u32,
}

/// State words a row's [`Meta`] takes in the store (its bits, in f32 slots).
const META: usize = 6;

impl Meta {
    fn read(st: &[f32]) -> Meta {
        let w = |i: usize| st.get(i).map_or(0, |x| x.to_bits());
        Meta { fresh: w(0) as u64 | (w(1) as u64) << 32, stamp: w(2) as u64 | (w(3) as u64) << 32, server: w(4), sub: w(5) }
    }
    fn write(self, st: &mut [f32]) {
        let words = [self.fresh as u32, (self.fresh >> 32) as u32, self.stamp as u32, (self.stamp >> 32) as u32, self.server, self.sub];
        for (x, w) in st.iter_mut().zip(words) {
            *x = f32::from_bits(w);
        }
    }
}

/// The freshness of a row with `m`: its own, or the last feed answer's when the answers
/// since its fetch kept it up to date (`feeds` empty: no feed): fetched within the chain,
/// and subscribed (since the last reset) by the question after its fetch at the latest.
fn fresh_of(feeds: &[FeedState], m: Meta) -> u64 {
    let Some(f) = feeds.get(m.server as usize) else { return m.fresh };
    let sub = m.sub as u64;
    match f.fresh {
        Some(ff) if (f.chain_start..=f.count).contains(&m.stamp) && sub >= f.floor.max(1) && sub <= m.stamp + 1 => m.fresh.max(ff),
        _ => m.fresh,
    }
}

impl std::fmt::Debug for ReadCache {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ReadCache")
            .field("table", &self.table)
            .field("tau", &self.tau)
            .field("rows", &self.store.len())
            .field("capacity", &self.capacity)
            .field("feed", &self.feed.is_some())
            .field("stats", &self.stats)
            .finish_non_exhaustive()
    }
}

/// A background refresh in flight: the pull, its keys, the clock it was issued at, how many
/// own pushes came before it, and the feed questions sent before it.
type Refresh = (Timestamp, Vec<u64>, u64, u64, Vec<u64>);

/// The feed stamps of rows being kept: per server (a pull's, the feed questions sent before
/// it), or one server's answer.
enum Stamps<'a> {
    PerServer(&'a [u64]),
    Server(u32, u64),
}

/// Background refreshes in flight at most.
const MAX_REFRESHING: usize = 4;

/// Keys a feed question subscribes at most per server (servers refuse requests of more than
/// their `max_keys_per_request`, 4M by default); the rest go with the next questions.
const MAX_SUBSCRIBE: usize = 1 << 20;

impl ReadCache {
    /// A cache of at most `capacity_rows` rows of `table`, which `kv` knows and which must be
    /// `ssp:τ` with `τ ≥ 1` (a bound of 0 leaves nothing to answer locally). Errors: an
    /// unknown table, another consistency model, or a capacity of 0.
    pub fn new(kv: &KvClient, table: u32, capacity_rows: usize) -> Result<ReadCache, ClientError> {
        let def = kv.table(table).ok_or(ClientError::UnknownTable(table))?;
        let tau = match def.consistency {
            Consistency::Ssp(t) if t >= 1 => t,
            other => {
                return Err(ClientError::Invalid(CoreError::Consistency(format!(
                    "a read cache needs an ssp:TAU table with TAU ≥ 1; table {table} is {other}"
                ))))
            }
        };
        if capacity_rows == 0 {
            return Err(ClientError::Invalid(CoreError::Limit("a read cache needs room for at least one row".into())));
        }
        let own = match def.rule.name.as_str() {
            "add" => Some(1.0),
            "sgd" => Some(-def.rule.lr),
            _ => None,
        };
        Ok(ReadCache {
            table,
            own,
            vl: def.value_len,
            tau,
            capacity: capacity_rows,
            store: HashStore::new(def.value_len, META),
            refreshing: VecDeque::new(),
            pushes: 0,
            push_log: VecDeque::new(),
            spare: Vec::new(),
            in_flight: std::collections::BTreeMap::new(),
            add: Vec::new(),
            last: None,
            reads_sent: 0,
            stats: CacheStats::default(),
            feed: None,
            feeds: Vec::new(),
            asking: None,
            asked_clock: None,
        })
    }

    /// Keeps the rows fresh from the servers' update feeds too: once a clock the cache asks
    /// every server which rows changed since its last question, takes those, and counts
    /// every other row it holds as fresh as the answer (see the module doc). More rows are
    /// answered locally; each question costs a request per server and the changed rows'
    /// transfer. Call it before the first read, on the client the cache reads with. Errors:
    /// a replicated cluster (each copy would answer its own feed).
    pub fn with_feed(mut self, kv: &KvClient) -> Result<ReadCache, ClientError> {
        if kv.replication() > 1 {
            return Err(ClientError::Invalid(CoreError::Consistency(
                "the servers' update feeds are not kept on a replicated cluster: use the cache without them".into(),
            )));
        }
        self.feed = Some(kv.info(self.table)?.1);
        self.feeds = vec![FeedState::default(); kv.num_servers()];
        Ok(self)
    }

    /// Whether the servers' update feeds keep the rows fresh.
    pub fn uses_feed(&self) -> bool {
        self.feed.is_some()
    }

    /// Asks every server's feed what changed, once per clock, one question at a time.
    fn ask_feed(&mut self, kv: &mut KvClient, clock: u64) -> Result<(), ClientError> {
        if self.feed.is_none() || self.asking.is_some() || self.asked_clock.is_some_and(|c| c >= clock) {
            return Ok(());
        }
        // the rows fetched since the last question are subscribed with this one (those the
        // copy does not hold yet are sent)
        let mut later: Vec<Vec<u64>> = Vec::new();
        for f in &mut self.feeds {
            f.pending.sort_unstable();
            f.pending.dedup();
            let sub = &f.sub;
            f.sent.clear();
            f.sent.extend(f.pending.iter().copied().filter(|&k| !sub.contains(k)));
            // at most MAX_SUBSCRIBE keys a question (a server refuses larger requests): the
            // rest wait for the next one, their rows not marked
            let rest = if f.sent.len() > MAX_SUBSCRIBE { f.sent.split_off(MAX_SUBSCRIBE) } else { Vec::new() };
            if !rest.is_empty() {
                f.pending.retain(|k| rest.binary_search(k).is_err());
            }
            later.push(rest);
        }
        let questions: Vec<FeedQuestion<'_>> =
            self.feeds.iter().map(|f| FeedQuestion { since: f.since, subscribe: Some((&f.sent, &f.sub)) }).collect();
        let ts = match kv.feed(self.table, &questions, self.own.is_some()) {
            Ok(ts) => ts,
            Err(e) => {
                // some server may have taken its part: no copy can be trusted, and no row
                // counts as subscribed until subscribed again
                for f in &mut self.feeds {
                    f.forget_copy(f.count + 2);
                    f.sent.clear();
                }
                return Err(e);
            }
        };
        // sent: the rows record the question's number at their server (count + 1), and the
        // copies take the keys the servers' copies take
        for (s, f) in self.feeds.iter_mut().enumerate() {
            let q = (f.count + 1) as u32;
            self.store.walk(
                &f.pending,
                false,
                |_, _| {},
                |_, row| {
                    if let Some((_, st)) = row {
                        let mut m = Meta::read(st);
                        if m.server as usize == s {
                            m.sub = q;
                            m.write(st);
                        }
                    }
                },
            );
            f.pending = later.get_mut(s).map(std::mem::take).unwrap_or_default();
            f.asked_emptied = f.emptied;
            if f.sub.add(&f.sent).is_err() {
                // (sorted above, so not expected) the server refuses the question and keeps
                // its copy; this one starts over, and the next question resets both
                f.forget_copy(f.count + 2);
            }
        }
        *self.in_flight.entry(self.pushes).or_default() += 1;
        self.asking = Some((ts, clock, self.pushes));
        self.asked_clock = Some(clock);
        Ok(())
    }

    /// Applies the feed answers to a question sent at `clock` after `pushes` own pushes.
    fn apply_feed(&mut self, answers: Vec<crate::FeedAnswer>, clock: u64, pushes: u64) {
        for (s, a) in answers.into_iter().enumerate() {
            let Some(f) = self.feeds.get_mut(s) else { break };
            f.count += 1;
            f.since = Some(a.position);
            f.fresh = a.staleness.map(|st| clock.saturating_sub(st));
            let k = f.count;
            let mut a = a;
            if a.subscription_reset {
                // the server's copy holds only this question's keys now; rows subscribed
                // before count only once subscribed again (their next fetch)
                f.sub.clear();
                let _ = f.sub.add(&f.sent);
                f.floor = k + 1;
            } else if f.asked_emptied != f.emptied {
                // ranks of the copy this end emptied since: not taken (the server's copy is
                // reset by a question sent after, or found equal to this one)
                a.known = false;
            } else if a.ranked {
                if let Err(e) = f.sub.keys_of(&mut a.keys) {
                    // the copies differ: the next question, with a count the server's copy
                    // does not have, starts both over; this answer is not taken
                    tracing::warn!("server {s}: feed answer by subscription: {e}; subscribing again");
                    f.forget_copy(k + 1);
                    a.known = false;
                }
            }
            f.sent.clear();
            if !a.known {
                // rows fetched before this answer may have missed changes: only rows
                // fetched after it are kept up to date from now on
                f.chain_start = k;
                continue;
            }
            self.stats.feed_answers += 1;
            self.stats.feed_rows += a.keys.len() as u64;
            if let Some(fresh) = f.fresh {
                self.insert(&a.keys, &a.values, fresh, pushes, Stamps::Server(s as u32, k));
            }
        }
    }

    /// The counts so far.
    pub fn stats(&self) -> CacheStats {
        CacheStats { subscribed: self.feeds.iter().map(|f| f.sub.len()).sum(), ..self.stats }
    }

    /// Rows held.
    pub fn len(&self) -> usize {
        self.store.len()
    }

    /// Whether no row is held.
    pub fn is_empty(&self) -> bool {
        self.store.is_empty()
    }

    /// Starts reading `keys` (sorted, unique, as for [`KvClient::pull`]) at the client's
    /// current clock: rows held fresh enough are copied now, rows the last read is still
    /// pulling are taken from its answer when it lands, the others are pulled. Finish with
    /// [`ReadCache::wait`], reads in the order they were sent (a read waited for before an
    /// earlier one pulls the rows it expected from that one itself: correct, slower).
    pub fn pull(&mut self, kv: &mut KvClient, keys: &[u64]) -> Result<PendingRead, ClientError> {
        self.harvest(kv, false)?;
        let clock = kv.current_clock();
        self.ask_feed(kv, clock)?;
        let vl = self.vl;
        let mut values = vec![0f32; keys.len() * vl];
        let (mut missing, mut missing_keys, mut expiring, mut pulled) = (Vec::new(), Vec::new(), Vec::new(), Vec::new());
        let (mut deferred, mut deferred_keys) = (Vec::new(), Vec::new());
        let mut hit_staleness: Option<u64> = None;
        // the keys of the read in flight, sorted like `keys`: walked alongside
        let in_flight: &[u64] = self.last.as_ref().map_or(&[], |(_, k)| k);
        let mut at = 0;
        let (tau, feeds) = (self.tau, &self.feeds);
        self.store.walk(
            keys,
            false,
            |_, _| {},
            |i, row| {
                let k = keys[i];
                let found = row.map(|(w, st)| (w, fresh_of(feeds, Meta::read(st))));
                match found {
                    Some((w, fresh)) if fresh + tau >= clock => {
                        values[i * vl..(i + 1) * vl].copy_from_slice(w);
                        let st = clock.saturating_sub(fresh);
                        hit_staleness = Some(hit_staleness.map_or(st, |m| m.max(st)));
                        if fresh + tau == clock {
                            expiring.push(k);
                        }
                    }
                    _ => {
                        while in_flight.get(at).is_some_and(|&f| f < k) {
                            at += 1;
                        }
                        if in_flight.get(at) == Some(&k) {
                            deferred.push(i as u32);
                            deferred_keys.push(k);
                        } else {
                            missing.push(i as u32);
                            missing_keys.push(k);
                        }
                    }
                }
            },
        );
        self.reads_sent += 1;
        let seq = self.reads_sent;
        self.stats.reads += 1;
        self.stats.rows_read += keys.len() as u64;
        self.stats.rows_hit += (keys.len() - missing.len() - deferred.len()) as u64;
        let pull = if missing_keys.is_empty() {
            // rows read at their last valid clock are fetched again in the background, so
            // that the next reads find them fresh without waiting
            if !expiring.is_empty() && self.refreshing.len() < MAX_REFRESHING {
                let ts = kv.pull(self.table, &expiring)?;
                *self.in_flight.entry(self.pushes).or_default() += 1;
                self.refreshing.push_back((ts, expiring, clock, self.pushes, self.counts()));
                self.stats.refreshes += 1;
            }
            None
        } else {
            // a pull goes out anyway: the expiring rows ride along (as extra keys of it,
            // answered from memory now and refreshed when it lands), no request of their own
            if !expiring.is_empty() {
                pulled.extend_from_slice(&missing_keys);
                pulled.extend_from_slice(&expiring);
                // both are in the caller's (sorted) order and disjoint
                pulled.sort_unstable();
            }
            let sent: &[u64] = if pulled.is_empty() { &missing_keys } else { &pulled };
            let ts = kv.pull(self.table, sent)?;
            *self.in_flight.entry(self.pushes).or_default() += 1;
            let mut last = self.last.take().map(|(_, v)| v).unwrap_or_default();
            last.clear();
            last.extend_from_slice(sent);
            self.last = Some((seq, last));
            Some(ts)
        };
        Ok(PendingRead {
            values,
            missing,
            missing_keys,
            pulled,
            pull,
            deferred,
            deferred_keys,
            seq,
            clock,
            pushes: self.pushes,
            hit_staleness,
            stamps: self.counts(),
        })
    }

    /// Per server, the feed questions sent so far (the stamp of rows pulled now: answered
    /// after them).
    fn counts(&self) -> Vec<u64> {
        let asking = self.asking.is_some() as u64;
        self.feeds.iter().map(|f| f.count + asking).collect()
    }

    /// Finishes a read: waits for the rows pulled (if any), keeps them, and returns every
    /// row in the order of the keys given to [`ReadCache::pull`].
    pub fn wait(&mut self, kv: &mut KvClient, read: PendingRead) -> Result<Vec<f32>, ClientError> {
        let PendingRead {
            mut values,
            missing,
            missing_keys,
            pulled,
            pull,
            deferred,
            deferred_keys,
            seq,
            clock,
            pushes,
            mut hit_staleness,
            stamps,
        } = read;
        let vl = self.vl;
        let local = pull.is_none();
        if self.last.as_ref().is_some_and(|(s, _)| *s == seq) {
            // its rows are in memory from now on (or the read fails): later reads look there
            self.last = None;
        }
        if let Some(ts) = pull {
            let (rows, st) = kv.wait_values_staleness(ts).inspect_err(|_| self.landed(pushes))?;
            let got: &[u64] = if pulled.is_empty() { &missing_keys } else { &pulled };
            // the pulled keys are sorted and hold the missing ones (in the caller's order,
            // sorted too) among the expiring ones that rode along
            let mut j = 0;
            for (&i, &k) in missing.iter().zip(&missing_keys) {
                while got.get(j).is_some_and(|&g| g != k) {
                    j += 1;
                }
                let i = i as usize;
                if let Some(row) = rows.get(j * vl..(j + 1) * vl) {
                    values[i * vl..(i + 1) * vl].copy_from_slice(row);
                }
                j += 1;
            }
            if let Some(st) = st {
                self.insert(got, &rows, clock.saturating_sub(st), pushes, Stamps::PerServer(&stamps));
            }
            self.landed(pushes);
        }
        // rows an earlier read was pulling: its answer is in memory if it was waited for
        let mut late: Vec<(u32, u64)> = Vec::new();
        let (tau, feeds) = (self.tau, &self.feeds);
        self.store.walk(
            &deferred_keys,
            false,
            |_, _| {},
            |j, row| {
                let (i, k) = (deferred[j], deferred_keys[j]);
                match row.map(|(w, st)| (w, fresh_of(feeds, Meta::read(st)))) {
                    Some((w, fresh)) if fresh + tau >= clock => {
                        let i = i as usize;
                        values[i * vl..(i + 1) * vl].copy_from_slice(w);
                        let st = clock.saturating_sub(fresh);
                        hit_staleness = Some(hit_staleness.map_or(st, |m| m.max(st)));
                    }
                    _ => late.push((i, k)),
                }
            },
        );
        self.stats.rows_hit += (deferred.len() - late.len()) as u64;
        if local && late.is_empty() {
            self.stats.reads_local += 1;
        }
        if !late.is_empty() {
            // too stale for this read's clock (or never waited for): pulled now, at a clock at
            // least the read's, so within the bound for it too
            let keys: Vec<u64> = late.iter().map(|&(_, k)| k).collect();
            let now = kv.current_clock();
            let stamps = self.counts();
            let ts = kv.pull(self.table, &keys)?;
            let (rows, st) = kv.wait_values_staleness(ts)?;
            for (j, &(i, _)) in late.iter().enumerate() {
                let i = i as usize;
                if let Some(row) = rows.get(j * vl..(j + 1) * vl) {
                    values[i * vl..(i + 1) * vl].copy_from_slice(row);
                }
            }
            if let Some(st) = st {
                // no own push came between this pull and its answer: nothing to replay
                self.insert(&keys, &rows, now.saturating_sub(st), self.pushes, Stamps::PerServer(&stamps));
            }
        }
        if let Some(st) = hit_staleness {
            kv.record_staleness(st);
        }
        self.harvest(kv, false)?;
        Ok(values)
    }

    /// Folds finished background refreshes in (all of them, waiting, when `all`).
    fn harvest(&mut self, kv: &mut KvClient, all: bool) -> Result<(), ClientError> {
        if let Some((ts, clock, pushes)) = self.asking {
            if all || kv.finished(ts.0) {
                self.asking = None;
                match kv.wait_feed(ts) {
                    Ok(answers) => {
                        self.apply_feed(answers, clock, pushes);
                        self.landed(pushes);
                    }
                    Err(e) => {
                        self.landed(pushes);
                        return Err(e);
                    }
                }
            }
        }
        while let Some((ts, ..)) = self.refreshing.front() {
            if !all && !kv.finished(ts.0) {
                break;
            }
            let Some((ts, keys, clock, pushes, stamps)) = self.refreshing.pop_front() else { break };
            let (rows, st) = kv.wait_values_staleness(ts).inspect_err(|_| self.landed(pushes))?;
            if let Some(st) = st {
                self.insert(&keys, &rows, clock.saturating_sub(st), pushes, Stamps::PerServer(&stamps));
            }
            self.landed(pushes);
        }
        Ok(())
    }

    /// Folds this worker's own push of `values` to `keys` into the rows held, where the
    /// table's rule makes that exact (`add`, `sgd`: the row changes by a fixed multiple of
    /// the pushed value), so reads see the worker's own updates as a server would (Petuum's
    /// read-my-writes). Returns whether it did; with other rules the rows wait for their
    /// next fetch. Call it right after the push.
    pub fn pushed(&mut self, keys: &[u64], values: &[f32]) -> bool {
        let Some(c) = self.own else { return false };
        let vl = self.vl;
        let (mut logged_keys, mut deltas) = self.spare.pop().unwrap_or_default();
        deltas.clear();
        deltas.extend(values.iter().map(|v| c * v));
        self.store.walk(
            keys,
            false,
            |_, _| {},
            |j, row| {
                if let Some((w, _)) = row {
                    for (w, d) in w.iter_mut().zip(&deltas[j * vl..(j + 1) * vl]) {
                        *w += d;
                    }
                }
            },
        );
        self.pushes += 1;
        // a pull in flight was sent before this push: its rows will not show it
        if !self.in_flight.is_empty() {
            logged_keys.clear();
            logged_keys.extend_from_slice(keys);
            self.push_log.push_back((self.pushes, logged_keys, deltas));
        } else {
            self.spare.push((logged_keys, deltas));
        }
        true
    }

    /// A pull sent after `pushes` own pushes has landed: the log keeps only what pulls
    /// still in flight need.
    fn landed(&mut self, pushes: u64) {
        if let Some(n) = self.in_flight.get_mut(&pushes) {
            *n -= 1;
            if *n == 0 {
                self.in_flight.remove(&pushes);
            }
        }
        let oldest = self.in_flight.keys().next().copied().unwrap_or(u64::MAX);
        while self.push_log.front().is_some_and(|(seq, ..)| *seq <= oldest) {
            if let Some((_, k, d)) = self.push_log.pop_front() {
                if self.spare.len() < 8 {
                    self.spare.push((k, d));
                }
            }
        }
    }

    /// Waits for the background refreshes in flight (before the client is dropped or its
    /// requests are all waited for, so none is left unread).
    pub fn settle(&mut self, kv: &mut KvClient) -> Result<(), ClientError> {
        self.harvest(kv, true)
    }

    /// Keeps `rows` of `keys` from a pull (or feed answer) sent after `pushes` own pushes,
    /// with freshness `fresh` and feed stamps `stamps`, and replays onto them the own
    /// pushes made after it was sent. A row is replaced only by one of a later stamp, or of
    /// the same stamp and at least its freshness: a fetch sent earlier than the row's must
    /// not take it back in time past what the feed answers since have shown.
    fn insert(&mut self, keys: &[u64], rows: &[f32], fresh: u64, pushes: u64, stamps: Stamps<'_>) {
        let vl = self.vl;
        if self.store.len() + keys.len() > self.capacity {
            // full: start over (the rows a worker reads next are mostly those it just pulled,
            // which come back in the following reads); fetches in flight may have missed
            // changes the answers so far carried
            self.store = HashStore::new(vl, META);
            for f in &mut self.feeds {
                f.chain_start = f.count + 1;
                // and the servers stop sending the rows dropped: the next question's
                // count differs from their copies', so both start over
                f.forget_copy(f.count + 2);
                f.pending.clear();
            }
        }
        // the own pushes made after the fetch was sent, to add to the rows it writes: both
        // key lists are sorted (pushes and fetches take sorted keys), so a merge
        let mut add = std::mem::take(&mut self.add);
        add.clear();
        let later = self.push_log.iter().filter(|(seq, ..)| *seq > pushes);
        if later.clone().next().is_some() {
            add.resize(keys.len() * vl, 0.0);
            let sorted = keys.windows(2).all(|w| w[0] < w[1]);
            for (_, pk, deltas) in later {
                let mut at = 0;
                for (j, k) in pk.iter().enumerate() {
                    let i = if sorted {
                        while keys.get(at).is_some_and(|x| x < k) {
                            at += 1;
                        }
                        at
                    } else {
                        keys.iter().position(|x| x == k).unwrap_or(keys.len())
                    };
                    if keys.get(i) == Some(k) {
                        for (a, d) in add[i * vl..(i + 1) * vl].iter_mut().zip(&deltas[j * vl..(j + 1) * vl]) {
                            *a += d;
                        }
                    }
                }
            }
        }
        let part = self.feed.as_ref();
        let feeds = &mut self.feeds;
        self.store.walk(
            keys,
            true,
            |_, _| {},
            |j, row| {
                let Some((w, st)) = row else { return };
                let k = keys[j];
                let (server, stamp) = match (&stamps, part) {
                    (Stamps::Server(s, c), _) => (*s, *c),
                    (Stamps::PerServer(c), Some(p)) => {
                        let s = p.owner(k).unwrap_or(0);
                        (s as u32, c.get(s).copied().unwrap_or(0))
                    }
                    (Stamps::PerServer(_), None) => (0, 0),
                };
                // (a row just created reads as stamp 0, freshness 0: always replaced)
                let old = Meta::read(st);
                if (stamp, fresh) >= (old.stamp, old.fresh) {
                    w.copy_from_slice(&rows[j * vl..(j + 1) * vl]);
                    if let Some(a) = add.get(j * vl..(j + 1) * vl) {
                        for (x, d) in w.iter_mut().zip(a) {
                            *x += d;
                        }
                    }
                    // subscribed still (since the last reset), or: an answer's row is (the
                    // answers hold only such rows), a fetched one goes with the next question
                    let mut sub = 0;
                    if let Some(f) = feeds.get_mut(server as usize) {
                        let floor = f.floor.max(1) as u32;
                        sub = if old.server == server && old.sub >= floor {
                            old.sub
                        } else if matches!(stamps, Stamps::Server(..)) && f.sub.contains(k) {
                            floor
                        } else {
                            // (an answer's row too, when this copy was cleared for room
                            // while the answer was on its way)
                            f.pending.push(k);
                            0
                        };
                    }
                    Meta { fresh, stamp, server, sub }.write(st);
                }
            },
        );
        self.add = add;
    }
}
