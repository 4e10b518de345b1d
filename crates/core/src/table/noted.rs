//! Pushes applied at the rows their minibatch's pull found. A worker pushes the very keys
//! it pulled a minibatch earlier (the linear and embedding jobs do); [`Table::pull_noting`]
//! notes each key's slot as its walk finds it, and [`Table::push_at`] reaches the same
//! keys' rows through those slots without hashing or probing again. The slots are hints:
//! each is checked against the key stored at it, so one made stale by a growth, a rebuild
//! or a removal in between costs that key a walk, never a wrong row.

use super::batch::{Collect, Keyed};
use super::{Store, Table};
use crate::hashstore::{ShardsMut, Slot};
use crate::rule::RowStepUser;
use crate::Result;

impl Table {
    /// [`Table::pull`] that also leaves in `noted` each key's slot, in the keys' order: the
    /// hints of a later [`Table::push_at`] of the same keys. `noted` is left empty for a
    /// dense table, a table under admission (whose pushes take the plain path) and a
    /// request large enough to be cut into pieces over two threads.
    /// Preconditions, checked: as for [`Table::pull`].
    pub fn pull_noting(&mut self, keys: &[u64], out: &mut [f32], noted: &mut Vec<Slot>) -> Result<()> {
        noted.clear();
        self.check_keys(keys, out.len())?;
        let noting = matches!(self.store, Store::Sparse(_)) && self.admitter.is_none();
        self.batch(Keyed::pull(keys, out, true), noting.then_some(noted));
        Ok(())
    }

    /// [`Table::push`] of keys whose rows `hints` name (what a [`Table::pull_noting`] of
    /// the same keys noted, perhaps stale since, or any slots at all): the rows, their
    /// values and rule state, eviction marks and change stamps, the change log and the
    /// update feed end as [`Table::push`] leaves them. Each key whose hinted slot still
    /// holds it is updated there; the others are walked to as a push walks, and room is
    /// reserved for them alone, so where rows were removed in between, the arrays' sizes
    /// and the free slots new rows take may differ from a plain push's. Returns how many
    /// keys were updated at their hints: 0 when the table is dense or under admission, or
    /// `hints` is not one per key (a plain push then).
    /// Preconditions, checked: as for [`Table::push`].
    pub fn push_at(&mut self, keys: &[u64], values: &[f32], hints: &[Slot]) -> Result<usize> {
        if hints.len() != keys.len() || self.admitter.is_some() || !matches!(self.store, Store::Sparse(_)) {
            self.push(keys, values)?;
            return Ok(0);
        }
        self.check_keys(keys, values.len())?;
        // what every keyed push tells the eviction marks, the change log and the feed
        self.touch(true);
        self.note_write(true);
        let writer = self.feed_writer.take();
        if let Some(f) = self.feed.as_mut() {
            f.wrote(keys, writer);
        }
        let vl = self.vl;
        let mut rest = std::mem::take(&mut self.scratch.rest);
        rest.clear();
        if let Store::Sparse(h) = &mut self.store {
            let mut view = h.view();
            self.rule.with_row_step(PushAt { view: &mut view, keys, g: values, vl, hints, rest: &mut rest });
            let parts = view.into_parts();
            h.finish(parts);
        }
        let at_hints = keys.len() - rest.len();
        if !rest.is_empty() {
            let (mut rk, mut rg) = (std::mem::take(&mut self.scratch.rest_keys), std::mem::take(&mut self.scratch.rest_values));
            rk.clear();
            rg.clear();
            for &i in &rest {
                let i = i as usize;
                rk.push(keys[i]);
                rg.extend_from_slice(&values[i * vl..(i + 1) * vl]);
            }
            self.batch_plain(Keyed::push(&rk, &rg), Collect::default());
            (self.scratch.rest_keys, self.scratch.rest_values) = (rk, rg);
        }
        self.scratch.rest = rest;
        Ok(at_hints)
    }
}

/// A push at hinted rows, run with the rule's row step ([`crate::rule::Rule::with_row_step`]).
struct PushAt<'a, 'v> {
    view: &'a mut ShardsMut<'v>,
    keys: &'a [u64],
    g: &'a [f32],
    vl: usize,
    hints: &'a [Slot],
    rest: &'a mut Vec<u32>,
}

impl RowStepUser for PushAt<'_, '_> {
    type Output = ();

    #[inline]
    fn run<S: Fn(&mut [f32], &mut [f32], &[f32])>(self, step: S) {
        let PushAt { view, keys, g, vl, hints, rest } = self;
        view.walk_at(
            keys,
            hints,
            rest,
            #[inline(always)]
            |i, (w, s)| step(w, s, &g[i * vl..(i + 1) * vl]),
        );
    }
}
