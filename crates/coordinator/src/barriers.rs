//! Named barriers over the worker ranks, counted so that a replacement calling again a
//! barrier the lost worker passed returns at once.

use crate::error::CoordError;
use crate::service::Coordinator;
use std::collections::HashSet;
use std::time::Duration;

/// One named barrier: passes completed, and the worker ranks arrived at the next one.
#[derive(Default)]
pub(crate) struct Barrier {
    pub(crate) passed: u64,
    pub(crate) arrived: HashSet<u32>,
}

impl Coordinator {
    /// Worker `node` at barrier `name` for the `count`-th time (1-based; 0: uncounted, the
    /// next pass): returns once every worker rank arrived. A pass the rank made already (a
    /// replacement calling again what the lost worker had passed) returns at once; an
    /// arrival the lost worker made is not counted twice.
    pub(crate) fn barrier(&self, node: u32, name: &str, count: u64) -> Result<(), CoordError> {
        let mut st = self.state.lock();
        let rank = self.current_worker(&st, node)?;
        let n = self.cfg.workers;
        let b = st.barriers.entry(name.to_string()).or_default();
        let target = if count == 0 { b.passed + 1 } else { count };
        if target <= b.passed {
            return Ok(());
        }
        if target > b.passed + 1 {
            return Err(CoordError::BarrierAhead { rank, name: name.to_string(), count: target, passed: b.passed });
        }
        b.arrived.insert(rank);
        if b.arrived.len() >= n {
            b.arrived.clear();
            b.passed += 1;
            self.persist(&mut st, true);
            self.cv.notify_all();
            return Ok(());
        }
        loop {
            if let Some(r) = &st.failed {
                return Err(CoordError::JobFailed { reason: r.clone() });
            }
            if st.barriers.get(name).is_some_and(|b| b.passed >= target) {
                return Ok(());
            }
            self.park(&self.cv, &mut st, Duration::from_millis(200));
        }
    }
}
