//! Which path decided each of Marshal's placements.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use crate::domain::{ClusterState, Job, JobId, Placement};
use crate::framework::{Context, Placer, Status};
use crate::policies::learned::{DecisionPath, GateCounts, GateStats};

/// Wraps a policy's placer and notes, for each job, the decision path of its first
/// successful placement: `heuristic:<policy>` for a heuristic; for the learned policy
/// `learned`, or `fallback:<reason>` when its gate let the fallback heuristic decide
/// (`no-model`, `low-margin`, `out-of-distribution`, `scoring-error`, `share-ties`; plain `fallback`
/// when there was nothing to choose between).
#[derive(Debug)]
pub struct PathTracer {
    policy: String,
    gate: Option<Arc<GateStats>>,
    paths: Arc<Mutex<HashMap<JobId, String>>>,
}

#[derive(Debug)]
struct Traced {
    tracer: PathTracer,
    inner: Box<dyn Placer>,
}

impl PathTracer {
    pub fn new(policy: String, gate: Option<Arc<GateStats>>) -> Self {
        PathTracer {
            policy,
            gate,
            paths: Arc::default(),
        }
    }

    /// The paths noted so far, shared with the wrapped placer.
    pub fn paths(&self) -> Arc<Mutex<HashMap<JobId, String>>> {
        self.paths.clone()
    }

    pub fn wrap(self, inner: Box<dyn Placer>) -> impl Placer {
        Traced {
            tracer: self,
            inner,
        }
    }

    fn label(&self, before: Option<GateCounts>) -> String {
        let (Some(gate), Some(b)) = (&self.gate, before) else {
            return format!("heuristic:{}", self.policy);
        };
        let a = gate.snapshot();
        if a.learned > b.learned {
            "learned".into()
        } else if a.no_model > b.no_model {
            "fallback:no-model".into()
        } else if a.low_margin > b.low_margin {
            "fallback:low-margin".into()
        } else if a.out_of_distribution > b.out_of_distribution {
            "fallback:out-of-distribution".into()
        } else if a.scoring_error > b.scoring_error {
            "fallback:scoring-error".into()
        } else if a.sum_of_squares_ties > b.sum_of_squares_ties {
            DecisionPath::ShareTies.label().into()
        } else {
            "fallback".into()
        }
    }
}

impl Placer for Traced {
    fn place(
        &self,
        job: &Job,
        state: &mut ClusterState,
        ctx: &mut Context,
    ) -> Result<Placement, Status> {
        let before = self.tracer.gate.as_ref().map(|g| g.snapshot());
        let result = self.inner.place(job, state, ctx);
        if result.is_ok() {
            let mut paths = self.tracer.paths.lock().unwrap_or_else(|e| e.into_inner());
            paths
                .entry(job.id)
                .or_insert_with(|| self.tracer.label(before));
        }
        result
    }
}
