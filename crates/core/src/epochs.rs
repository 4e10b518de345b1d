//! Routing epochs of a replicated job, without I/O: the coordinator's rule for when a new
//! placement of the data is served.
//!
//! Every change of the ring (a server lost, one joining, an `admin drain`) starts a new epoch
//! ([`Epochs::reconfigure`]); the servers move to it and copy what their new replicas need,
//! and each reports that it is ready ([`Epochs::ready`]). The epoch is served — workers get
//! it, and it is where the data is from then on — only once every member of it reported. A
//! change while an epoch is prepared folds into it: the earlier one is never served, and a
//! report for it is ignored. Until an epoch is served, the data is where the last served one
//! put it ([`Epochs::served`]), which is what servers plan their copies from.
//!
//! The coordinator (`crates/coordinator/src/epochs.rs`) keeps one [`Epochs<Instant>`] under
//! its lock and persists it; the simulation (`crates/sim`) drives the same type with its
//! ticks. `T` is the caller's clock: the engine only keeps when a change was first seen.
//!
//! [`Epochs<Instant>`]: Epochs

use std::collections::BTreeSet;

/// An epoch being prepared.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Pending<T> {
    /// Its members (the ring as changed).
    pub members: Vec<u32>,
    /// Members that have not reported ready yet.
    pub waiting: BTreeSet<u32>,
    /// When the first change folded into it was seen.
    pub since: T,
    /// What changed (changes folded in are joined with "; ").
    pub cause: String,
    /// Rows the members copied for it so far.
    pub keys_copied: u64,
    /// Whether a failure (rather than only joins and drains) started it.
    pub failure: bool,
}

/// An epoch that was just served ([`Ready::Served`]).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Served<T> {
    /// The epoch.
    pub epoch: u64,
    /// Its members, where the data is now.
    pub members: Vec<u32>,
    /// When the change that led to it was first seen.
    pub since: T,
    /// What changed.
    pub cause: String,
    /// Rows copied to build its replicas.
    pub keys_copied: u64,
    /// Whether a failure caused it.
    pub failure: bool,
}

/// What a server's report of readiness did.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Ready<T> {
    /// It was for an epoch other than the newest (superseded, or one never published):
    /// ignored; the server hears the newest with its next heartbeat.
    Superseded,
    /// Counted; other members have yet to report.
    Waiting,
    /// No epoch is being prepared (a report repeated after its epoch was served).
    Idle,
    /// It was the last one: the epoch is served.
    Served(Served<T>),
}

/// The routing epochs of a job: the newest, whether it is served, where the data is.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Epochs<T> {
    epoch: u64,
    active: bool,
    served: Vec<u32>,
    pending: Option<Pending<T>>,
}

impl<T> Default for Epochs<T> {
    fn default() -> Self {
        Epochs { epoch: 0, active: false, served: Vec::new(), pending: None }
    }
}

impl<T: Clone> Epochs<T> {
    /// No epoch yet (epoch 0: the servers are still registering).
    pub fn new() -> Epochs<T> {
        Epochs::default()
    }

    /// State restored from a coordinator's state directory (see the coordinator's
    /// `persist`): the newest epoch, whether it is served, the members of the last served
    /// one, and the epoch being prepared if any. Precondition: `pending` is `None` when
    /// `active`.
    pub fn restore(epoch: u64, active: bool, served: Vec<u32>, pending: Option<Pending<T>>) -> Epochs<T> {
        Epochs { epoch, active, served, pending: if active { None } else { pending } }
    }

    /// Publishes the first epoch (1) with `members`, served at once (nothing to copy).
    /// Does nothing once an epoch was published.
    pub fn publish_first(&mut self, members: Vec<u32>) {
        if self.epoch == 0 {
            self.epoch = 1;
            self.active = true;
            self.served = members;
        }
    }

    /// The ring changed to `members` because of `cause` (`failure`: a server was lost),
    /// seen at `now`: starts preparing a new epoch, which every member must report ready
    /// for. A change while another epoch is prepared folds into it (its cause is kept in
    /// front, its time is kept, and it counts as a failure if either was). Returns the new
    /// epoch.
    pub fn reconfigure(&mut self, members: Vec<u32>, cause: String, failure: bool, now: T) -> u64 {
        self.epoch += 1;
        self.active = false;
        let (since, cause, failure) = match self.pending.take() {
            Some(p) => (p.since, format!("{}; {cause}", p.cause), p.failure || failure),
            None => (now, cause, failure),
        };
        let waiting = members.iter().copied().collect();
        self.pending = Some(Pending { members, waiting, since, cause, keys_copied: 0, failure });
        self.epoch
    }

    /// Server `node` moved to `epoch` and built its replicas (copying `keys_copied` rows).
    /// The last member to report serves the epoch.
    pub fn ready(&mut self, node: u32, epoch: u64, keys_copied: u64) -> Ready<T> {
        if epoch != self.epoch {
            return Ready::Superseded;
        }
        let Some(p) = self.pending.as_mut() else { return Ready::Idle };
        if p.waiting.remove(&node) {
            p.keys_copied += keys_copied;
        }
        if !p.waiting.is_empty() {
            return Ready::Waiting;
        }
        let Some(p) = self.pending.take() else { return Ready::Idle };
        self.active = true;
        self.served = p.members.clone();
        Ready::Served(Served {
            epoch: self.epoch,
            members: p.members,
            since: p.since,
            cause: p.cause,
            keys_copied: p.keys_copied,
            failure: p.failure,
        })
    }

    /// The newest epoch (0 before the first).
    pub fn epoch(&self) -> u64 {
        self.epoch
    }

    /// Whether the newest epoch is served (false while one is prepared).
    pub fn active(&self) -> bool {
        self.active
    }

    /// The members of the last served epoch: where the data is.
    pub fn served(&self) -> &[u32] {
        &self.served
    }

    /// The epoch being prepared, if any.
    pub fn pending(&self) -> Option<&Pending<T>> {
        self.pending.as_ref()
    }

    /// Whether server `node` has yet to report ready for the epoch being prepared.
    pub fn must_move(&self, node: u32) -> bool {
        self.pending.as_ref().is_some_and(|p| p.waiting.contains(&node))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_epoch_is_served_only_once_every_member_reported() {
        let mut e = Epochs::new();
        e.publish_first(vec![1, 2, 3]);
        assert_eq!((e.epoch(), e.active(), e.served()), (1, true, &[1, 2, 3][..]));
        assert_eq!(e.reconfigure(vec![1, 3], "server 2 lost".into(), true, 10u64), 2);
        assert!(!e.active());
        assert_eq!(e.served(), &[1, 2, 3], "the data is where epoch 1 put it");
        assert_eq!(e.ready(1, 2, 5), Ready::Waiting);
        assert_eq!(e.ready(1, 2, 5), Ready::Waiting, "a repeated report counts once");
        assert!(e.must_move(3) && !e.must_move(1));
        let Ready::Served(s) = e.ready(3, 2, 7) else { panic!("served") };
        assert_eq!((s.epoch, s.members, s.keys_copied, s.since, s.failure), (2, vec![1, 3], 12, 10, true));
        assert_eq!((e.active(), e.served()), (true, &[1, 3][..]));
        assert_eq!(e.ready(3, 2, 0), Ready::Idle);
    }

    #[test]
    fn a_change_while_an_epoch_is_prepared_folds_into_it_and_the_old_one_is_never_served() {
        let mut e = Epochs::new();
        e.publish_first(vec![1, 2, 3]);
        e.reconfigure(vec![1, 2, 3, 4], "server 4 joined".into(), false, 5u64);
        assert_eq!(e.ready(1, 2, 0), Ready::Waiting);
        e.reconfigure(vec![1, 3, 4], "server 2 lost".into(), true, 9);
        for n in [1, 3] {
            assert_eq!(e.ready(n, 2, 0), Ready::Superseded, "reports for epoch 2 are ignored");
        }
        assert_eq!(e.served(), &[1, 2, 3]);
        assert_eq!(e.ready(1, 3, 0), Ready::Waiting);
        assert_eq!(e.ready(3, 3, 0), Ready::Waiting);
        let Ready::Served(s) = e.ready(4, 3, 0) else { panic!("served") };
        assert_eq!(s.cause, "server 4 joined; server 2 lost");
        assert_eq!((s.since, s.failure), (5, true));
        assert_eq!(e.served(), &[1, 3, 4]);
    }

    #[test]
    fn a_restored_state_goes_on_preparing_its_epoch() {
        let p = Pending { members: vec![1, 2], waiting: [2].into(), since: 0u64, cause: "c".into(), keys_copied: 0, failure: true };
        let mut e = Epochs::restore(4, false, vec![1, 2, 3], Some(p));
        assert!(e.must_move(2) && !e.must_move(1));
        assert!(matches!(e.ready(2, 4, 0), Ready::Served(_)));
        assert_eq!(e.served(), &[1, 2]);
    }
}
