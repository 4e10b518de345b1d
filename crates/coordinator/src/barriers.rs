//! Barrier calls: the rule is the engine's (`engine/barriers.rs`); a call waits here until
//! its pass is made.

use crate::engine::BarrierStep;
use crate::error::CoordError;
use crate::service::Coordinator;
use std::time::Duration;

impl Coordinator {
    /// Worker `node` at barrier `name` for the `count`-th time (see
    /// [`crate::engine::Engine::arrive`]): returns once every worker rank arrived.
    pub(crate) fn barrier(&self, node: u32, name: &str, count: u64) -> Result<(), CoordError> {
        let mut st = self.state.lock();
        let target = match st.arrive(node, name, count)? {
            BarrierStep::Passed => return Ok(()),
            BarrierStep::Made => {
                self.persist(&mut st, true);
                self.cv.notify_all();
                return Ok(());
            }
            BarrierStep::Wait { target } => target,
        };
        while !st.barrier_passed(name, target)? {
            self.park(&self.cv, &mut st, Duration::from_millis(200));
        }
        Ok(())
    }
}
