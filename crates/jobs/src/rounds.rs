//! The worker side of the coordinator's model-parallel block rounds
//! ([`downpour_core::blocks::BlockRounds`]), shared by `train mf` and `train lda`.

use anyhow::Result;
use downpour_core::blocks::{wire, BlockPlan, BlockRounds, Round};
use downpour_core::proto;
use downpour_worker::WorkerSession;
use std::time::{Duration, Instant};

/// This worker's place in the job's rounds.
pub(crate) struct Rounds {
    plan: BlockPlan,
    finished: u64,
    /// Time spent waiting for the next round (the others' work and the call).
    pub waited: Duration,
}

impl Rounds {
    /// Checks `plan` (the error names the flag `strata_flag`) and starts before round 1.
    pub fn new(plan: BlockPlan, strata_flag: &str) -> Result<Self> {
        BlockRounds::new(plan).map_err(|e| anyhow::anyhow!("{strata_flag} {}: {e}", plan.rows))?;
        Ok(Rounds { plan, finished: 0, waited: Duration::ZERO })
    }

    /// The plan.
    pub fn plan(&self) -> &BlockPlan {
        &self.plan
    }

    /// Reports the round just finished with its blocks' update magnitudes (nothing before
    /// the first) and returns this worker's next round, once every worker finished this one.
    pub fn next(&mut self, s: &mut WorkerSession, magnitudes: &[(usize, f64)]) -> Result<Round> {
        let t = Instant::now();
        let req = proto::BlocksRequest {
            plan: Some(wire::plan_to_proto(&self.plan)),
            finished: self.finished,
            magnitudes: magnitudes.iter().map(|&(b, m)| proto::BlockMagnitude { block: b as u32, magnitude: m }).collect(),
        };
        let reply = s.blocks(&req)?;
        let round = wire::round_from_proto(&reply, &self.plan)?;
        anyhow::ensure!(round.number == self.finished + 1, "the coordinator answered round {} after round {}", round.number, self.finished);
        self.finished = round.number;
        self.waited += t.elapsed();
        Ok(round)
    }
}
