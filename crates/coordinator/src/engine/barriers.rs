//! Named barriers over the worker ranks, counted so that a replacement calling again a
//! barrier the lost worker passed returns at once.

use super::Engine;
use crate::error::CoordError;
use std::collections::HashSet;

/// One named barrier: passes completed, and the worker ranks arrived at the next one.
#[derive(Default)]
pub(crate) struct Barrier {
    pub(crate) passed: u64,
    pub(crate) arrived: HashSet<u32>,
}

/// What an arrival at a barrier did ([`Engine::arrive`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BarrierStep {
    /// The pass was made already (a replacement calling again): go on.
    Passed,
    /// This arrival, the last one, made the pass: go on (and wake the ranks waiting).
    Made,
    /// Wait until [`Engine::barrier_passed`] says pass `target` was made.
    Wait {
        /// The pass waited for.
        target: u64,
    },
}

impl Engine {
    /// Worker `node` at barrier `name` for the `count`-th time (1-based; 0: uncounted, the
    /// next pass). A pass the rank made already (a replacement calling again what the lost
    /// worker had passed) is passed at once; an arrival the lost worker made is not counted
    /// twice; the last rank to arrive makes the pass.
    pub fn arrive(&mut self, node: u32, name: &str, count: u64) -> Result<BarrierStep, CoordError> {
        let rank = self.current_worker(node)?;
        let n = self.cfg.workers;
        let b = self.barriers.entry(name.to_string()).or_default();
        let target = if count == 0 { b.passed + 1 } else { count };
        if target <= b.passed {
            return Ok(BarrierStep::Passed);
        }
        if target > b.passed + 1 {
            return Err(CoordError::BarrierAhead { rank, name: name.to_string(), count: target, passed: b.passed });
        }
        b.arrived.insert(rank);
        if b.arrived.len() >= n {
            b.arrived.clear();
            b.passed += 1;
            return Ok(BarrierStep::Made);
        }
        Ok(BarrierStep::Wait { target })
    }

    /// Whether pass `target` of barrier `name` was made; an error once the job failed.
    pub fn barrier_passed(&self, name: &str, target: u64) -> Result<bool, CoordError> {
        if let Some(r) = &self.failed {
            return Err(CoordError::JobFailed { reason: r.clone() });
        }
        Ok(self.barriers.get(name).is_some_and(|b| b.passed >= target))
    }
}
