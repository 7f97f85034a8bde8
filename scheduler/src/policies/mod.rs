//! Baseline policies, each a composition of framework plugins, selectable by name.
//!
//! | name | queue | placement | preemption |
//! |---|---|---|---|
//! | `random` | FIFO, backfill | uniform among feasible nodes | – |
//! | `fifo` | FIFO, strict (head-of-line blocks) | first fit | – |
//! | `best-fit` | FIFO, backfill | least CPU+GPU left | – |
//! | `dot-product` | FIFO, backfill | smallest free·request | – |
//! | `gpu-packing` | FIFO, backfill | used GPUs, then used nodes | – |
//! | `gpu-clustering` | FIFO, backfill | nodes running the same task kind | – |
//! | `fgd` | FIFO, backfill | least fragmentation growth | – |
//! | `fgd-sumsq` | FIFO, backfill | FGD, ties by the sum-of-squares rule | – |
//! | `topo-pack` | FIFO, backfill | tightest topology domain | – |
//! | `tiresias` | 2D-LAS | tightest topology domain | lower LAS queues |
//! | `priority` | priority, then age | tightest topology domain | lower priority |
//! | `sjf-oracle` | true remaining work | tightest topology domain | – |

mod fgd;
pub mod learned;
mod order;
mod preempt;
mod scorers;
mod sumsq;
mod topo;

pub use fgd::Fgd;
pub use order::{DiscretizedLas, Fifo, PriorityAge, ShortestRemaining};
pub use preempt::PreemptLowerRank;
pub use scorers::{
    BestFit, DotProduct, FirstFit, GpuClustering, GpuPacking, NodeSpecMax, RandomScore,
};
pub use sumsq::{SumOfSquares, gap_counts, sum_of_squares_gain};
pub use topo::TopoPack;

use crate::domain::Job;
use crate::framework::{Placer, Policy, QueueOrder, ScoredPlacer, TieBreak};

/// Every policy name [`build`] accepts.
pub const POLICY_NAMES: &[&str] = &[
    "random",
    "fifo",
    "best-fit",
    "dot-product",
    "gpu-packing",
    "gpu-clustering",
    "fgd",
    "fgd-sumsq",
    "topo-pack",
    "tiresias",
    "priority",
    "sjf-oracle",
];

/// Minimum run before a priority preemption may evict a job: ten minutes, so that a
/// job gets to its first checkpoint-sized unit of progress.
const PRIORITY_MIN_RUNTIME_S: f64 = 600.0;

#[derive(Debug, thiserror::Error, PartialEq)]
#[error("unknown policy {name:?}; known policies: {}", POLICY_NAMES.join(", "))]
pub struct UnknownPolicy {
    pub name: String,
}

/// Builds the policy called `name`. `workload` is the trace being scheduled; FGD derives
/// its target workload from it.
pub fn build(name: &str, workload: &[Job]) -> Result<Policy, UnknownPolicy> {
    let scored = |placer: Box<dyn Placer>| (Box::new(Fifo) as Box<dyn QueueOrder>, placer);
    let (order, placer): (Box<dyn QueueOrder>, Box<dyn Placer>) = match name {
        "random" => scored(Box::new(ScoredPlacer::new(RandomScore, TieBreak::Random))),
        "fifo" => scored(Box::new(ScoredPlacer::new(FirstFit, TieBreak::First))),
        // Ties go to the first node listed; see `scorers` for why.
        "best-fit" => scored(Box::new(ScoredPlacer::new(BestFit, TieBreak::First))),
        "dot-product" => scored(Box::new(ScoredPlacer::new(DotProduct, TieBreak::First))),
        "gpu-packing" => scored(Box::new(ScoredPlacer::new(GpuPacking, TieBreak::First))),
        "gpu-clustering" => scored(Box::new(ScoredPlacer::new(GpuClustering, TieBreak::First))),
        "fgd" => scored(Box::new(ScoredPlacer::new(
            Fgd::from_workload(workload),
            TieBreak::First,
        ))),
        "fgd-sumsq" => scored(Box::new(ScoredPlacer::new(
            SumOfSquares::tie_break_of(Fgd::from_workload(workload)),
            TieBreak::First,
        ))),
        "topo-pack" => scored(Box::new(TopoPack)),
        "tiresias" => (Box::new(DiscretizedLas::default()), Box::new(TopoPack)),
        "priority" => (Box::new(PriorityAge), Box::new(TopoPack)),
        "sjf-oracle" => (Box::new(ShortestRemaining), Box::new(TopoPack)),
        _ => {
            return Err(UnknownPolicy {
                name: name.to_string(),
            });
        }
    };
    let preemptor: Option<Box<dyn crate::framework::Preemptor>> = match name {
        "tiresias" => Some(Box::new(PreemptLowerRank { min_runtime_s: 0.0 })),
        "priority" => Some(Box::new(PreemptLowerRank {
            min_runtime_s: PRIORITY_MIN_RUNTIME_S,
        })),
        _ => None,
    };
    Ok(Policy {
        name: name.to_string(),
        order,
        placer,
        preemptor,
        blocking: name == "fifo",
        reservation: None,
        rebalance: None,
        consolidate: None,
        quota: None,
    })
}

/// Whether a policy reads the true job durations (and so is a reference, not a baseline).
pub fn is_clairvoyant(name: &str) -> bool {
    name == "sjf-oracle"
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_listed_name_builds_and_unknown_names_say_what_exists() {
        for name in POLICY_NAMES {
            assert_eq!(build(name, &[]).unwrap().name, *name);
        }
        let err = build("bestfit", &[]).unwrap_err().to_string();
        assert!(
            err.contains("best-fit") && err.contains("\"bestfit\""),
            "{err}"
        );
    }
}
