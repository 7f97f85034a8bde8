//! Shadow mode: what Marshal would have done beside another scheduler, and the estimated
//! effect. It never acts.
//!
//! [`run_shadow`] replays a recorded log twice on the same cluster, in the simulator:
//! - **incumbent**: each job the log says was scheduled arrives at its *recorded* start
//!   time and is placed at once if it fits (on its recorded node when the log names
//!   one, else by a stated heuristic placer: [`recorded_policy`]). It therefore never
//!   starts before its recorded time; a start the cluster model cannot honour (no room
//!   then) waits until it can and is counted as delayed, never hidden.
//! - **marshal**: the same jobs arrive at their *creation* time and Marshal's policy
//!   decides when and where they start.
//!
//! Both replays run each job for its recorded run time (`deletion − scheduled`) wherever
//! it is placed ([`crate::sim::SpeedModel::recorded_durations`]), so the difference
//! between the two is the decisions alone. Jobs the incumbent never scheduled have no
//! recorded run time and are left out of both replays (and listed as such).
//!
//! The recorded log is a trace with the incumbent's times, or a live advisor's shadow log
//! joined with the incumbent's outcomes ([`join_live`]).

mod live;
mod outcome;
mod paths;
mod recorded;

pub use live::{
    Advice, IncumbentOutcome, LiveJoin, LiveReport, RecommendationVsIncumbent, join_live,
};
pub use outcome::{JobRow, ShadowReport, SideSummary, allocation_series};
pub use paths::PathTracer;
pub use recorded::{INCUMBENT, Recorded, RecordedPlacer, recorded_policy, shadow_jobs};

use std::sync::Arc;

use crate::domain::{DomainError, Job, Topology};
use crate::framework::Policy;
use crate::policies::learned::GateStats;
use crate::sim::{LogEntry, SimConfig, SpeedModel, run_replay};

/// Marshal's side: its policy and, for the learned policy, its decision counters.
#[derive(Debug)]
pub struct MarshalPolicy {
    pub policy: Policy,
    pub gate: Option<Arc<GateStats>>,
}

/// Everything one shadow run produced.
#[derive(Debug)]
pub struct Shadow {
    pub report: ShadowReport,
    /// One row per job of the log, in log order.
    pub rows: Vec<JobRow>,
    /// `(hour since the first creation, incumbent %, marshal %)` of GPU capacity allocated.
    pub allocation: Vec<(u64, f64, f64)>,
}

/// Replays `jobs` (submit time = creation) with what the incumbent did (`recorded`, one
/// per job) under the incumbent's recorded decisions and under `marshal`, on `topo`.
/// `incumbent_placer` places jobs whose log names no node (its queue order and
/// preemption are not used). Deterministic for a seed.
pub fn run_shadow(
    topo: Arc<Topology>,
    jobs: &[Job],
    recorded: &[Recorded],
    marshal: MarshalPolicy,
    incumbent_placer: Policy,
    trace: &str,
    seed: u64,
) -> Result<Shadow, DomainError> {
    if jobs.len() != recorded.len() {
        return Err(DomainError::Invalid(format!(
            "{} jobs but {} recorded runs",
            jobs.len(),
            recorded.len()
        )));
    }
    let prepared = shadow_jobs(jobs, recorded)?;
    let config = SimConfig {
        speed: SpeedModel {
            recorded_durations: true,
            ..SpeedModel::default()
        },
        ..SimConfig::replay(seed)
    };
    let (incumbent, unknown_nodes) = recorded_policy(&topo, &prepared, incumbent_placer);
    let incumbent_name = incumbent.placer_name.clone();
    let (_, incumbent_log) = run_replay(
        &incumbent.policy,
        topo.clone(),
        &prepared.incumbent,
        trace,
        &config,
    )?;
    let tracer = PathTracer::new(marshal.policy.name.clone(), marshal.gate.clone());
    let paths = tracer.paths();
    let policy_name = marshal.policy.name.clone();
    let policy = Policy {
        placer: Box::new(tracer.wrap(marshal.policy.placer)),
        ..marshal.policy
    };
    let (_, marshal_log) = run_replay(&policy, topo.clone(), &prepared.marshal, trace, &config)?;
    let paths = paths.lock().unwrap_or_else(|e| e.into_inner()).clone();
    let sides = outcome::Sides {
        topo: &topo,
        jobs,
        recorded,
        prepared: &prepared,
        incumbent: &incumbent_log,
        marshal: &marshal_log,
        paths: &paths,
    };
    let rows = sides.rows();
    let mut report = sides.report(trace, seed, &policy_name, &incumbent_name, &rows);
    report.incumbent_recorded_node_unknown = unknown_nodes;
    report.fallback_rate = marshal.gate.map(|g| g.snapshot().fallback_rate());
    let allocation = allocation_series(&topo, jobs, &[&incumbent_log, &marshal_log]);
    Ok(Shadow {
        report,
        rows,
        allocation,
    })
}

/// The start of the first job's life: the common origin of both replays' windows.
fn origin(jobs: &[Job]) -> f64 {
    jobs.iter()
        .map(|j| j.submit_time)
        .fold(f64::INFINITY, f64::min)
}

/// Logs of the two replays, side by side.
type Logs<'a> = [&'a [LogEntry]; 2];
