//! The measured choice of a decode batch bucket.
//!
//! The smallest bucket that holds the rows is not always the fastest: a plugin can compile a
//! one-row step worse than a two- or eight-row one (XLA CPU runs one-row matmuls as
//! single-threaded loops; measured 95 ms/step at batch 1 against 47 ms at batch 2 for SmolLM2
//! on the lammps plugin, the other way round on xla-cpu-pjrt). So the smallest runs
//! [`DECODE_STEPS_BEFORE_TRYING`] steps first, then each of the next [`DECODE_BUCKETS_TRIED`]
//! buckets up is tried for two steps (the first one's time left out, it can carry one-time work),
//! and the fastest measured is used from then on.

use std::collections::HashMap;
use std::time::Duration;

use crate::executor::{Ladder, LadderPoint};
use tlaloc_artifact::LadderError;

/// How many decode batch buckets, from the smallest that holds the rows up, are tried (each for
/// two steps) before the fastest measured is used. Two: the next bucket up is the one a plugin
/// most often compiles better (a one-row matmul as a matrix-vector loop, two rows as a
/// multithreaded GEMM), and every bucket tried costs its first execution (0.4-0.6 s on a CPU).
pub const DECODE_BUCKETS_TRIED: usize = 2;

/// Decode steps the smallest bucket runs before a larger one is tried.
pub const DECODE_STEPS_BEFORE_TRYING: u32 = 16;

/// Measured decode step costs per entry, and the choice they make.
#[derive(Debug, Clone)]
pub struct DecodeBuckets {
    /// Per decode entry: steps observed, and the wall time of one step (an exponential average
    /// that leaves out the first step, which can carry one-time work of a first execution).
    costs: HashMap<LadderPoint, (u32, Duration)>,
    explore: bool,
}

impl Default for DecodeBuckets {
    fn default() -> Self {
        Self {
            costs: HashMap::new(),
            explore: true,
        }
    }
}

impl DecodeBuckets {
    /// Whether buckets larger than the smallest that fits may be tried (on by default; off when
    /// trying one would compile it first).
    pub fn set_exploration(&mut self, on: bool) {
        self.explore = on;
    }

    /// Records the wall time of one step of the decode entry `entry`.
    pub fn observe(&mut self, entry: LadderPoint, per_step: Duration) {
        let (seen, cost) = self.costs.entry(entry).or_insert((0, per_step));
        *cost = match *seen {
            0 | 1 => per_step,
            _ => (*cost * 3 + per_step) / 4,
        };
        *seen = seen.saturating_add(1);
    }

    /// The decode entry for `rows` rows and `context` tokens: among the smallest batch bucket
    /// that holds the rows and the next [`DECODE_BUCKETS_TRIED`]` - 1` up, all at the smallest
    /// context bucket that fits: the smallest until it has run [`DECODE_STEPS_BEFORE_TRYING`]
    /// steps, then the first not yet measured, else the fastest.
    pub fn choose(
        &self,
        ladder: &Ladder,
        rows: usize,
        context: usize,
    ) -> Result<LadderPoint, LadderError> {
        let smallest = ladder.decode_entry(rows, context)?;
        if !self.explore {
            return Ok(smallest);
        }
        let seen = |e: &LadderPoint| self.costs.get(e).map_or(0, |&(seen, _)| seen);
        // The smallest runs a while first, so that a short generation never pays for trying
        // another bucket.
        if seen(&smallest) < DECODE_STEPS_BEFORE_TRYING {
            return Ok(smallest);
        }
        let candidates: Vec<LadderPoint> = ladder
            .decode_points_from(smallest)
            .take(DECODE_BUCKETS_TRIED)
            .collect();
        let measured = |e: &LadderPoint| match self.costs.get(e) {
            Some(&(seen, cost)) if seen >= 2 => Some(cost),
            _ => None,
        };
        if let Some(unmeasured) = candidates.iter().find(|e| measured(e).is_none()) {
            return Ok(*unmeasured);
        }
        Ok(candidates
            .into_iter()
            .min_by_key(|e| (measured(e), e.batch))
            .unwrap_or(smallest))
    }
}
