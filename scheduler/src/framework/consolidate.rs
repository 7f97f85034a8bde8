//! Consolidation: migrating a running gang onto a tighter placement when the predicted
//! gain exceeds the cost of the move.
//!
//! Placers spread a gang of one-GPU workers over whatever GPUs are idle when it starts;
//! when capacity frees up later, a node (or NVLink island) may hold the whole gang, and
//! the gang would run faster there (the speed model's locality factor). Every cycle,
//! after the queue has been served, each running whole-GPU gang placed across a looser
//! topology level than the cluster needs for it is considered: with the gang's own GPUs
//! released, a topology search ([`TopoPack`], the tightest domain first, whatever the
//! policy's placer is: a locality-blind placer would spread it again) looks for a
//! strictly tighter placement in the capacity that is idle *now*; nobody else moves.
//!
//! Gain versus cost (DESIGN's "when the predicted gain exceeds the migration cost"), in
//! seconds of the gang's run time (its GPUs scale both sides alike):
//! - *gain* = remaining run time × (1 − speed now / speed after), with the speeds from
//!   the same [`SpeedModel`] that sets a job's rate in the simulator (GPU class ×
//!   locality by link level and the job kind's communication share × interference);
//! - *cost* = the restart delay plus the work since the last checkpoint that the move
//!   throws away (none for a job that checkpoints when stopped), redone at the new speed;
//! - the move happens only when gain > cost × [`ConsolidateConfig::safety_factor`].
//!
//! The remaining run time is what the scheduler knows ([`RemainingEstimate`]): by
//! default the time the job has already run (the least-attained-service assumption: in
//! heavy-tailed deep-learning workloads a job that has run for *t* is expected to run
//! about *t* more), so a job that has just started is never moved for a small gain.
//! `Oracle` uses the true remaining work, which only the simulator has: a clairvoyant
//! reference, as `sjf-oracle` is for queue order.
//!
//! Bounds: at most [`ConsolidateConfig::max_moves`] gangs per cycle (largest predicted
//! net gain first), and a gang that started or moved less than
//! [`ConsolidateConfig::protect_s`] ago stays put, so no job ping-pongs.

use serde::{Deserialize, Serialize};

use crate::domain::{ClusterState, GpuDemand, Job, Placement, TopoLevel};
use crate::framework::{Candidate, Context, Placer};
use crate::policies::TopoPack;
use crate::sim::SpeedModel;

/// How the remaining run time of a running job is estimated.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, Default)]
#[serde(rename_all = "kebab-case")]
pub enum RemainingEstimate {
    /// The time it has run so far (all attempts): least-attained-service's assumption.
    #[default]
    Elapsed,
    /// The true remaining work (simulator only; clairvoyant reference).
    Oracle,
}

#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ConsolidateConfig {
    /// Seconds between consolidation passes when nothing else happens: the simulator
    /// wakes this often while a gang runs looser than it could (its estimated gain grows
    /// with the time it has run).
    #[serde(default = "default_interval_s")]
    pub interval_s: f64,
    /// The predicted gain must exceed the move's cost times this.
    #[serde(default = "default_safety_factor")]
    pub safety_factor: f64,
    /// Gangs moved per cycle at most.
    #[serde(default = "default_max_moves")]
    pub max_moves: u32,
    /// A gang that started (or was moved) less than this many seconds ago is not moved.
    #[serde(default = "default_protect_s")]
    pub protect_s: f64,
    #[serde(default)]
    pub remaining: RemainingEstimate,
}

fn default_interval_s() -> f64 {
    600.0
}

fn default_safety_factor() -> f64 {
    2.0
}

fn default_max_moves() -> u32 {
    2
}

fn default_protect_s() -> f64 {
    3600.0
}

impl Default for ConsolidateConfig {
    fn default() -> Self {
        ConsolidateConfig {
            interval_s: default_interval_s(),
            safety_factor: default_safety_factor(),
            max_moves: default_max_moves(),
            protect_s: default_protect_s(),
            remaining: RemainingEstimate::default(),
        }
    }
}

impl ConsolidateConfig {
    pub fn validate(&self) -> Result<(), String> {
        if !(self.interval_s.is_finite() && self.interval_s >= 1.0) {
            return Err(format!(
                "consolidate interval_s must be a finite number of seconds ≥ 1, not {}",
                self.interval_s
            ));
        }
        if !(self.protect_s.is_finite() && self.protect_s >= 0.0) {
            return Err(format!(
                "consolidate protect_s must be a non-negative number of seconds, not {}",
                self.protect_s
            ));
        }
        // Below 1 a move could be predicted to lose time and still happen.
        if !(self.safety_factor.is_finite() && self.safety_factor >= 1.0) {
            return Err(format!(
                "consolidate safety_factor must be a finite number ≥ 1, not {}",
                self.safety_factor
            ));
        }
        if !(1..=64).contains(&self.max_moves) {
            return Err(format!(
                "consolidate max_moves must be 1..=64, not {}",
                self.max_moves
            ));
        }
        Ok(())
    }

    /// Whether `c` may be considered at `now`: a preemptible whole-GPU gang of two or
    /// more GPUs, out of its protection window.
    fn movable(&self, c: &Candidate<'_>, now: f64) -> bool {
        let j = c.running.job;
        j.preemptible
            && matches!(j.gpu, GpuDemand::Whole(_))
            && j.gpu_count() >= 2
            && now - c.running.started_at >= self.protect_s
    }

    /// Whether `c` runs looser than the cluster could ever place it (so that a move may
    /// speed it up): see [`ConsolidateConfig::is_loose_placement`].
    pub fn is_loose(&self, c: &Candidate<'_>, state: &ClusterState) -> bool {
        Self::is_loose_placement(c.running.job, c.running.placement, state)
    }

    /// Whether `job`, running on `placement`, is a preemptible whole-GPU gang whose
    /// placement spans a level above the tightest that holds its GPUs. Callers that run
    /// cycles only when something happens (the simulator's wake-ups, the service with
    /// an empty queue) ask this to know whether a pass could move anything.
    pub fn is_loose_placement(job: &Job, placement: &Placement, state: &ClusterState) -> bool {
        if !matches!(job.gpu, GpuDemand::Whole(_)) || job.gpu_count() < 2 || !job.preemptible {
            return false;
        }
        placement.span(state.topology()) > best_level(state, job.gpu_count())
    }
}

fn best_level(state: &ClusterState, gpus: u32) -> TopoLevel {
    state
        .topology()
        .tightest_level_for(gpus)
        .max(TopoLevel::NvlinkIsland)
}

/// One consolidation decided in a cycle: a decision record with its reasons.
#[derive(Debug, Clone, PartialEq)]
pub struct Consolidation {
    /// Index into the cycle's `running` slice.
    pub running: usize,
    pub to: Placement,
    pub from_span: TopoLevel,
    pub to_span: TopoLevel,
    /// Predicted seconds saved over the rest of the run.
    pub gain_s: f64,
    /// Seconds the move costs (restart plus lost work redone).
    pub cost_s: f64,
}

/// The predicted gain and cost, in seconds, of moving `c` from speed `before` to speed
/// `after` (both [`SpeedModel::speed`], without the checkpoint duty cycle, which is the
/// same on both placements and cancels out except in the oracle's run-time estimate).
pub fn gain_and_cost(
    config: &ConsolidateConfig,
    c: &Candidate<'_>,
    before: f64,
    after: f64,
) -> (f64, f64) {
    let r = &c.running;
    let job = r.job;
    let ckpt = &job.checkpoint;
    let duty = ckpt.interval_s / (ckpt.interval_s + ckpt.cost_s);
    let remaining_s = match config.remaining {
        RemainingEstimate::Elapsed => r.stats.attained_gpu_s / job.gpu_count().max(1) as f64,
        RemainingEstimate::Oracle => r.stats.remaining_work / (before * duty).max(1e-9),
    };
    let gain = remaining_s * (1.0 - before / after.max(1e-9));
    let cost = ckpt.restart_s + r.lost_work_s / (after * duty).max(1e-9);
    (gain, cost)
}

/// Decides and applies this cycle's consolidations: for each movable, loose gang in
/// `candidates` (the jobs still running after this cycle's preemptions and migrations,
/// `index` their positions in the cycle's `running` slice), a tighter placement in the
/// capacity idle now, kept when gain > cost × safety factor. `state` has the moves
/// applied (old placement released, new one allocated); a gang not moved is exactly
/// where it was.
pub(crate) fn consolidate(
    config: &ConsolidateConfig,
    candidates: &[Candidate<'_>],
    index: &[usize],
    state: &mut ClusterState,
    ctx: &mut Context,
) -> Vec<Consolidation> {
    let default_speed = SpeedModel::default();
    let speed = ctx.speed.unwrap_or(&default_speed);
    let now = ctx.now;
    // A gang on a node marked down (held for a starving gang in this cycle, or failed
    // and not yet evicted) stays: its placement could not be allocated again there.
    let loose: Vec<usize> = (0..candidates.len())
        .filter(|&i| {
            let c = &candidates[i];
            config.movable(c, now)
                && config.is_loose(c, state)
                && c.running
                    .placement
                    .workers
                    .iter()
                    .all(|w| state.node_is_up(w.node))
        })
        .collect();
    if loose.is_empty() || state.idle_gpus() == 0 {
        return Vec::new();
    }
    // Evaluated one by one on the real state (release, search, put back): each search
    // sees the moves already made, and nothing is left half-done.
    let mut found: Vec<(f64, Consolidation)> = Vec::new();
    for &i in &loose {
        let c = &candidates[i];
        let r = &c.running;
        let topo = state.topology_arc().clone();
        let from_span = r.placement.span(&topo);
        let before = speed.speed(r.job, r.placement, state);
        state.release(r.job, r.placement);
        let tighter = TopoPack
            .place(r.job, state, ctx)
            .ok()
            .filter(|p| p.span(&topo) < from_span);
        let decision = tighter.and_then(|to| {
            state.allocate(r.job, &to).ok()?;
            let after = speed.speed(r.job, &to, state);
            state.release(r.job, &to);
            let (gain_s, cost_s) = gain_and_cost(config, c, before, after);
            (after > before && gain_s > cost_s * config.safety_factor).then(|| Consolidation {
                running: index[i],
                to_span: to.span(&topo),
                to,
                from_span,
                gain_s,
                cost_s,
            })
        });
        state
            .allocate(r.job, r.placement)
            .expect("a released placement fits again");
        if let Some(d) = decision {
            let net = (d.gain_s - d.cost_s) * r.job.gpu_count() as f64;
            found.push((net, d));
        }
    }
    // The largest net gains first (GPU-seconds), ties by position for determinism;
    // each is searched again on the state as the earlier moves left it.
    found.sort_by(|(a, da), (b, db)| b.total_cmp(a).then(da.running.cmp(&db.running)));
    let mut moved = Vec::new();
    for (_, planned) in found {
        if moved.len() >= config.max_moves as usize {
            break;
        }
        let Some(i) = index.iter().position(|&k| k == planned.running) else {
            continue;
        };
        let c = &candidates[i];
        let r = &c.running;
        let topo = state.topology_arc().clone();
        let before = speed.speed(r.job, r.placement, state);
        state.release(r.job, r.placement);
        let kept = TopoPack
            .place(r.job, state, ctx)
            .ok()
            .filter(|p| p.span(&topo) < planned.from_span)
            .and_then(|to| {
                state.allocate(r.job, &to).ok()?;
                let after = speed.speed(r.job, &to, state);
                let (gain_s, cost_s) = gain_and_cost(config, c, before, after);
                if after > before && gain_s > cost_s * config.safety_factor {
                    Some(Consolidation {
                        running: planned.running,
                        to_span: to.span(&topo),
                        to,
                        from_span: planned.from_span,
                        gain_s,
                        cost_s,
                    })
                } else {
                    state.release(r.job, &to);
                    None
                }
            });
        match kept {
            Some(d) => moved.push(d),
            None => state
                .allocate(r.job, r.placement)
                .expect("a released placement fits again"),
        }
    }
    moved
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::domain::{Job, JobId};
    use crate::framework::{JobStats, Running};

    #[test]
    fn bad_values_are_named() {
        assert!(ConsolidateConfig::default().validate().is_ok());
        let base = ConsolidateConfig::default();
        let bad = |c: ConsolidateConfig| c.validate().unwrap_err();
        assert!(
            bad(ConsolidateConfig {
                interval_s: 0.0,
                ..base
            })
            .contains("interval_s")
        );
        assert!(
            bad(ConsolidateConfig {
                protect_s: f64::NAN,
                ..base
            })
            .contains("protect_s")
        );
        assert!(
            bad(ConsolidateConfig {
                safety_factor: 0.5,
                ..base
            })
            .contains("safety_factor")
        );
        assert!(
            bad(ConsolidateConfig {
                max_moves: 0,
                ..base
            })
            .contains("max_moves")
        );
    }

    fn candidate<'a>(job: &'a Job, p: &'a Placement, ran_s: f64, lost: f64) -> Candidate<'a> {
        Candidate {
            running: Running {
                job,
                placement: p,
                stats: JobStats {
                    attained_gpu_s: ran_s * job.gpu_count() as f64,
                    remaining_work: 10_000.0,
                    ..JobStats::default()
                },
                started_at: 0.0,
                lost_work_s: lost,
            },
            rank: (0, 0.0),
        }
    }

    #[test]
    fn gain_scales_with_the_time_run_and_cost_with_restart_and_lost_work() {
        let mut job = Job::whole_gpus(JobId(1), 4, 0.0, 1.0);
        job.checkpoint.restart_s = 60.0;
        job.checkpoint.cost_s = 0.0;
        let p = Placement::default();
        let c = ConsolidateConfig::default();
        // Speed 0.8 → 1.0 saves a fifth of the remaining time.
        let (gain, cost) = gain_and_cost(&c, &candidate(&job, &p, 1000.0, 0.0), 0.8, 1.0);
        assert!((gain - 200.0).abs() < 1e-9, "{gain}");
        assert!((cost - 60.0).abs() < 1e-9, "{cost}");
        let (gain, cost) = gain_and_cost(&c, &candidate(&job, &p, 2000.0, 100.0), 0.8, 1.0);
        assert!((gain - 400.0).abs() < 1e-9);
        assert!((cost - 160.0).abs() < 1e-9, "lost work is redone: {cost}");
        // The oracle uses the remaining work at the current speed: 10,000 / 0.8.
        let oracle = ConsolidateConfig {
            remaining: RemainingEstimate::Oracle,
            ..c
        };
        let (gain, _) = gain_and_cost(&oracle, &candidate(&job, &p, 1.0, 0.0), 0.8, 1.0);
        assert!((gain - 2500.0).abs() < 1e-6, "{gain}");
    }

    /// Two 8-GPU nodes in one rack, with a 4-GPU gang spread 2 + 2 and node 0
    /// otherwise idle.
    fn spread_on_two_nodes(gang: &Job) -> (ClusterState, Placement) {
        use crate::domain::{ClusterSpec, GpuId, GpuShare, NodeId, Topology, WorkerPlacement};
        let spec = ClusterSpec::from_toml(
            "name='c'\nnodes_per_rack=2\n[[nodes]]\ncount=2\ngpu_model='V100M32'\ngpus=8\n\
             nvlink_domain=8\ncpu_milli=64000\nmemory_mib=262144\n",
        )
        .unwrap();
        let mut state = ClusterState::new(std::sync::Arc::new(Topology::build(&spec).unwrap()));
        let mut filler = Job::whole_gpus(JobId(9), 1, 0.0, 1.0);
        filler.gpu = GpuDemand::Whole(6);
        let on_node1 = Placement {
            workers: vec![WorkerPlacement {
                node: NodeId(1),
                gpus: (8..14).map(|g| GpuShare::whole(GpuId(g))).collect(),
            }],
        };
        state.allocate(&filler, &on_node1).unwrap();
        let spread = Placement {
            workers: [0u32, 1, 14, 15]
                .iter()
                .map(|&g| WorkerPlacement {
                    node: NodeId(g / 8),
                    gpus: vec![GpuShare::whole(GpuId(g))],
                })
                .collect(),
        };
        state.allocate(gang, &spread).unwrap();
        (state, spread)
    }

    #[test]
    fn a_spread_gang_moves_onto_the_idle_node_unless_a_node_of_it_is_held() {
        use rand::SeedableRng;
        let mut gang = Job::whole_gpus(JobId(1), 4, 0.0, 1e6);
        gang.checkpoint.restart_s = 60.0;
        let (mut state, spread) = spread_on_two_nodes(&gang);
        let c = candidate(&gang, &spread, 10_000.0, 0.0);
        let config = ConsolidateConfig::default();
        let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(1);
        let mut ctx = Context::new(1e6, &mut rng);
        assert!(config.is_loose(&c, &state));
        let moved = consolidate(&config, &[c], &[3], &mut state, &mut ctx);
        assert_eq!(moved.len(), 1);
        assert_eq!(moved[0].running, 3, "indexed into the cycle's running jobs");
        assert_eq!(
            (moved[0].from_span, moved[0].to_span),
            (TopoLevel::Rack, TopoLevel::NvlinkIsland)
        );
        assert!(moved[0].to.workers.iter().all(|w| w.node.0 == 0));
        assert!(moved[0].gain_s > 2.0 * moved[0].cost_s);
        state.check_consistency().unwrap();
        assert_eq!(state.idle_gpus(), 16 - 6 - 4);

        // Node 1 held for a starving gang (marked down for the cycle): the gang stays,
        // and the state is as it was.
        let (mut state, spread) = spread_on_two_nodes(&gang);
        state.set_node_up(crate::domain::NodeId(1), false);
        let before = state.clone();
        let c = candidate(&gang, &spread, 10_000.0, 0.0);
        assert!(consolidate(&config, &[c], &[0], &mut state, &mut ctx).is_empty());
        assert_eq!(state.idle_gpus(), before.idle_gpus());
        state.check_consistency().unwrap();
    }

    #[test]
    fn only_preemptible_whole_gpu_gangs_out_of_protection_move() {
        let c = ConsolidateConfig {
            protect_s: 100.0,
            ..ConsolidateConfig::default()
        };
        let p = Placement::default();
        let gang = Job::whole_gpus(JobId(1), 4, 0.0, 1.0);
        assert!(c.movable(&candidate(&gang, &p, 0.0, 0.0), 100.0));
        assert!(!c.movable(&candidate(&gang, &p, 0.0, 0.0), 99.0));
        let single = Job::whole_gpus(JobId(2), 1, 0.0, 1.0);
        assert!(!c.movable(&candidate(&single, &p, 0.0, 0.0), 1000.0));
        let mut pinned = gang.clone();
        pinned.preemptible = false;
        assert!(!c.movable(&candidate(&pinned, &p, 0.0, 0.0), 1000.0));
    }
}
