//! `marshal sim`.

use std::sync::Arc;

use anyhow::{Context as _, bail};
use clap::{Args, ValueEnum};
use marshal_datasets::WorkloadLibrary;
use marshal_scheduler::domain::{Job, Topology};
use marshal_scheduler::framework::{
    ConsolidateConfig, QuotaConfig, RebalanceConfig, RemainingEstimate, ReservationConfig,
};
use marshal_scheduler::policies;
use marshal_scheduler::sim::{self, FailureModel, Mode, SimConfig, SimResult, SpeedModel};

use crate::cli::output::{self, Format};

#[derive(Copy, Clone, Debug, PartialEq, Eq, ValueEnum)]
pub enum ModeArg {
    Replay,
    Inflation,
}

/// How jobs learn what they run (see `marshal_datasets::WorkloadLibrary`).
#[derive(Copy, Clone, Debug, PartialEq, Eq, ValueEnum)]
pub enum WorkloadsArg {
    /// Pollux jobs get their application; every other GPU job draws one of Gavel's job
    /// types for its gang size (per seed); work keeps recorded durations on the recorded
    /// hardware; the speed model uses each kind's measured throughputs.
    Measured,
    /// No kinds: one generic data-parallel job per gang, GPU classes only.
    None,
}

#[derive(Debug, Args)]
pub struct SimArgs {
    /// Cluster: a preset name (see `marshal list`), a TOML spec or an openb-style node CSV.
    /// Defaults to the trace's own cluster (openb traces: `openb`, Philly: `philly`).
    #[arg(long)]
    pub cluster: Option<String>,
    /// An openb-style node list CSV to use as the cluster (instead of --cluster).
    #[arg(long, conflicts_with = "cluster")]
    pub nodes: Option<String>,
    /// Trace: a bundled name (see `marshal list`) or a path to an openb or Philly CSV.
    #[arg(long)]
    pub trace: String,
    /// Policies, comma-separated (see `marshal list`).
    #[arg(long, value_delimiter = ',', required = true)]
    pub policy: Vec<String>,
    #[arg(long, value_enum, default_value_t = ModeArg::Replay)]
    pub mode: ModeArg,
    /// Seed of the (first) run.
    #[arg(long, allow_negative_numbers = true, default_value_t = 42)]
    pub seed: u64,
    /// Number of seeds, from --seed upwards; prints the mean over seeds and each run.
    #[arg(long, allow_negative_numbers = true, default_value_t = 1)]
    pub seeds: u64,
    #[arg(long, value_enum, default_value_t = Format::Table)]
    pub format: Format,
    /// Inflation mode: stop arriving tasks at this % of GPU capacity.
    #[arg(long, allow_negative_numbers = true, default_value_t = 130.0)]
    pub max_arrived_pct: f64,
    /// Replay mode: mean time between failures of each node, in hours (off when absent).
    #[arg(long, allow_negative_numbers = true)]
    pub mtbf_hours: Option<f64>,
    /// GPU model the trace's durations were measured on: each job's work is set so that
    /// it lasts its recorded time on that hardware (with `--workloads measured`, at its
    /// kind's measured throughput there; else at the model's class). Defaults to what the
    /// trace's source says (A100-40 for `itp-195job`), else the reference class.
    #[arg(long)]
    pub trace_gpu: Option<String>,
    /// Replay mode: mean repair time of a failed node, in hours.
    #[arg(long, allow_negative_numbers = true, default_value_t = 4.0)]
    pub repair_hours: f64,
    /// Replay mode: workload enrichment.
    #[arg(long, value_enum, default_value_t = WorkloadsArg::Measured)]
    pub workloads: WorkloadsArg,
    /// The `learned` policy's artifact directory (default: `models/policy-default`).
    #[arg(long)]
    pub model: Option<std::path::PathBuf>,
    /// The `learned` policy's fallback heuristic (default: the artifact's for the mode).
    #[arg(long)]
    pub fallback: Option<String>,
    /// Hold nodes for a whole-GPU gang that has waited this many seconds and still
    /// cannot start (pre-allocation; off when absent).
    #[arg(long, allow_negative_numbers = true, value_name = "SECONDS")]
    pub reserve_after: Option<f64>,
    /// Only gangs of at least this many GPUs in all get nodes held for them.
    #[arg(
        long,
        allow_negative_numbers = true,
        default_value_t = 8,
        requires = "reserve_after"
    )]
    pub reserve_min_gpus: u32,
    /// ... and of at most this share of the cluster's GPUs.
    #[arg(
        long,
        allow_negative_numbers = true,
        default_value_t = 0.25,
        requires = "reserve_after"
    )]
    pub reserve_max_share: f64,
    /// Migrate running jobs so that a whole-GPU gang that has waited this many seconds
    /// and is blocked only by fragmentation fits (rebalancing; off when absent).
    #[arg(long, allow_negative_numbers = true, value_name = "SECONDS")]
    pub rebalance_after: Option<f64>,
    /// Jobs moved for one gang at most.
    #[arg(
        long,
        allow_negative_numbers = true,
        default_value_t = 4,
        requires = "rebalance_after"
    )]
    pub rebalance_max_moves: u32,
    /// Seconds a job must have run in its placement before it may be moved.
    #[arg(
        long,
        allow_negative_numbers = true,
        default_value_t = 600.0,
        requires = "rebalance_after"
    )]
    pub rebalance_min_runtime: f64,
    /// Jobs that would lose more than this many seconds of work are not moved.
    #[arg(
        long,
        allow_negative_numbers = true,
        value_name = "SECONDS",
        requires = "rebalance_after"
    )]
    pub rebalance_max_lost: Option<f64>,
    /// Move running gangs onto a tighter placement when the predicted gain (speed-up ×
    /// estimated remaining time) exceeds the move's cost × the safety factor
    /// (consolidation; off when absent).
    #[arg(long)]
    pub consolidate: bool,
    /// Seconds between consolidation passes while a gang runs looser than it could.
    #[arg(
        long,
        allow_negative_numbers = true,
        default_value_t = 600.0,
        requires = "consolidate"
    )]
    pub consolidate_interval: f64,
    /// The predicted gain must exceed the move's cost times this.
    #[arg(
        long,
        allow_negative_numbers = true,
        default_value_t = 2.0,
        requires = "consolidate"
    )]
    pub consolidate_safety: f64,
    /// Gangs moved per cycle at most.
    #[arg(
        long,
        allow_negative_numbers = true,
        default_value_t = 2,
        requires = "consolidate"
    )]
    pub consolidate_max_moves: u32,
    /// Seconds after a gang starts (or moves) during which it is not moved.
    #[arg(
        long,
        allow_negative_numbers = true,
        default_value_t = 3600.0,
        requires = "consolidate"
    )]
    pub consolidate_protect: f64,
    /// How the remaining run time is estimated: `elapsed` (the time run so far) or
    /// `oracle` (the true remaining work; a clairvoyant reference).
    #[arg(long, value_enum, default_value_t = RemainingArg::Elapsed, requires = "consolidate")]
    pub consolidate_remaining: RemainingArg,
    /// Keep CPU-only jobs off GPU nodes while a CPU-only node can take them (what a
    /// `PreferNoSchedule` taint on GPU nodes does in Kubernetes), for every policy.
    #[arg(long)]
    pub cpu_nodes_first: bool,
    /// Per-tenant limits for every policy run: a TOML file with `[default]` and
    /// `[tenants.NAME]` tables, each with `gpus` and `cpu_cores` (a job's tenant is
    /// Philly's virtual cluster, openb's QoS class, Chronus' user).
    #[arg(long, value_name = "FILE")]
    pub quota: Option<std::path::PathBuf>,
}

/// The quota file at `path`, checked.
fn read_quota(path: &std::path::Path) -> anyhow::Result<QuotaConfig> {
    let text = std::fs::read_to_string(path)
        .with_context(|| format!("reading the quota file {}", path.display()))?;
    QuotaConfig::from_toml(&text).map_err(|e| anyhow::anyhow!("quota file {}: {e}", path.display()))
}

#[derive(Copy, Clone, Debug, PartialEq, Eq, ValueEnum)]
pub enum RemainingArg {
    Elapsed,
    Oracle,
}

impl SimArgs {
    /// A replay of `trace` under `policies` with every other option at its default (the
    /// values the command line gives when they are left out).
    pub fn replay(trace: &str, cluster: Option<String>, policies: Vec<String>, seed: u64) -> Self {
        SimArgs {
            cluster,
            nodes: None,
            trace: trace.to_string(),
            policy: policies,
            mode: ModeArg::Replay,
            seed,
            seeds: 1,
            format: Format::Table,
            max_arrived_pct: 130.0,
            mtbf_hours: None,
            repair_hours: 4.0,
            trace_gpu: None,
            workloads: WorkloadsArg::Measured,
            model: None,
            fallback: None,
            reserve_after: None,
            reserve_min_gpus: 8,
            reserve_max_share: 0.25,
            rebalance_after: None,
            rebalance_max_moves: 4,
            rebalance_min_runtime: 600.0,
            rebalance_max_lost: None,
            consolidate: false,
            consolidate_interval: 600.0,
            consolidate_safety: 2.0,
            consolidate_max_moves: 2,
            consolidate_protect: 3600.0,
            consolidate_remaining: RemainingArg::Elapsed,
            quota: None,
            cpu_nodes_first: false,
        }
    }
}

pub fn run(args: SimArgs) -> anyhow::Result<()> {
    let experiment = Experiment::load(&args)?;
    let groups = experiment.run_all(&args.policy, args.seed, args.seeds)?;
    output::print(&groups, args.format, &mut std::io::stdout().lock())?;
    Ok(())
}

/// One simulation's result and, in replay mode, every completed job's JCT in seconds.
#[derive(Debug)]
pub struct Run {
    pub result: SimResult,
    pub jcts_s: Vec<f64>,
}

/// A trace on a cluster under one configuration, ready to run policies on.
#[derive(Debug)]
pub struct Experiment {
    pub trace: String,
    pub topo: Arc<Topology>,
    /// As parsed (and scaled to the recorded hardware when there is no enrichment).
    pub jobs: Vec<Job>,
    pub config: SimConfig,
    enrichment: Option<Enrichment>,
    /// The `learned` policy's model and fallback, when it is among the policies.
    pub learned: Option<crate::cli::policy::LearnedSetup>,
    /// Given to every policy run (`--reserve-after`).
    pub reservation: Option<ReservationConfig>,
    /// Given to every policy run (`--rebalance-after`).
    pub rebalance: Option<RebalanceConfig>,
    /// Given to every policy run (`--consolidate`).
    pub consolidate: Option<ConsolidateConfig>,
    /// Every policy run keeps CPU-only jobs on CPU-only nodes first (`--cpu-nodes-first`).
    pub cpu_nodes_first: bool,
    /// Given to every policy run (`--quota`).
    pub quota: Option<QuotaConfig>,
}

#[derive(Debug)]
struct Enrichment {
    library: WorkloadLibrary,
    recorded_on: Option<String>,
}

/// The most seeds one command runs: every run's results are kept in memory until all
/// are done (a JCT per job per run in replay mode).
pub const MAX_SEEDS: u64 = 10_000;

/// `seeds` seeds from `seed` upwards, or why not: none, more than [`MAX_SEEDS`], or past
/// the largest seed.
fn seed_range(seed: u64, seeds: u64) -> anyhow::Result<std::ops::RangeInclusive<u64>> {
    if !(1..=MAX_SEEDS).contains(&seeds) {
        anyhow::bail!("--seeds {seeds}: must be 1 ..= {MAX_SEEDS}");
    }
    match seed.checked_add(seeds - 1) {
        Some(last) => Ok(seed..=last),
        None => anyhow::bail!(
            "--seed {seed} with --seeds {seeds} runs past the largest seed {}",
            u64::MAX
        ),
    }
}

impl Experiment {
    pub fn load(args: &SimArgs) -> anyhow::Result<Experiment> {
        let cluster_arg = args
            .nodes
            .clone()
            .or_else(|| args.cluster.clone())
            .unwrap_or_else(|| default_cluster_for(&args.trace).to_string());
        let spec = marshal_datasets::load_cluster(&cluster_arg)
            .with_context(|| format!("loading cluster {cluster_arg}"))?;
        let topo = Arc::new(
            Topology::build(&spec).with_context(|| format!("building cluster {cluster_arg}"))?,
        );
        let (jobs, report) = marshal_datasets::load_trace(&args.trace, &topo.catalog)
            .with_context(|| format!("loading trace {}", args.trace))?;
        if report.rows_skipped > 0 {
            eprintln!(
                "warning: {}: {} rows read, {} skipped:",
                report.source, report.rows_read, report.rows_skipped
            );
            for row in &report.skipped {
                eprintln!("  {}: {row}", report.source);
            }
            if report.skipped.len() < report.rows_skipped {
                eprintln!(
                    "  … and {} more",
                    report.rows_skipped - report.skipped.len()
                );
            }
        }
        if jobs.is_empty() {
            bail!("trace {} has no jobs", args.trace);
        }
        let trace_gpu = args
            .trace_gpu
            .as_deref()
            .or_else(|| marshal_datasets::trace_gpu_model(&args.trace));
        let mut jobs = jobs;
        let class = trace_gpu
            .map(|model| {
                topo.catalog
                    .id(model)
                    .map(|id| topo.catalog.get(id).throughput)
                    .with_context(|| format!("--trace-gpu {model}: not a GPU model of the catalog"))
            })
            .transpose()?;
        let enrich = args.mode == ModeArg::Replay && args.workloads == WorkloadsArg::Measured;
        let mut speed = SpeedModel::default();
        let enrichment = if enrich {
            let library = WorkloadLibrary::bundled(&speed)?;
            speed.workloads = library.catalog.clone();
            Some(Enrichment {
                library,
                recorded_on: trace_gpu.map(String::from),
            })
        } else {
            if let Some(class) = class {
                for job in &mut jobs {
                    job.total_work *= class;
                }
            }
            None
        };
        if args.mode == ModeArg::Replay
            && enrichment.is_none()
            && jobs.iter().all(|j| j.total_work == 0.0)
        {
            bail!(
                "trace {} records no job durations, so a replay would be meaningless \
                 without --workloads measured (which gives Pollux and Sia jobs their \
                 application's duration); --mode inflation works without them",
                args.trace
            );
        }
        let mode = match args.mode {
            ModeArg::Replay => Mode::Replay,
            ModeArg::Inflation => Mode::Inflation {
                max_arrived_pct: args.max_arrived_pct,
            },
        };
        let failures = match args.mtbf_hours {
            Some(h) => Some(FailureModel {
                mtbf_s: hours_to_s("--mtbf-hours", h)?,
                repair_s: hours_to_s("--repair-hours", args.repair_hours)?,
            }),
            None => None,
        };
        let config = SimConfig {
            mode,
            failures,
            speed,
            ..SimConfig::replay(args.seed)
        };
        config.validate()?;
        let reservation = args.reserve_after.map(|after_wait_s| ReservationConfig {
            after_wait_s,
            min_gpus: args.reserve_min_gpus,
            max_share: args.reserve_max_share,
        });
        if let Some(r) = &reservation {
            r.validate()
                .map_err(|e| anyhow::anyhow!("--reserve-after: {e}"))?;
        }
        let rebalance = args.rebalance_after.map(|after_wait_s| RebalanceConfig {
            after_wait_s,
            max_moves: args.rebalance_max_moves,
            min_runtime_s: args.rebalance_min_runtime,
            max_lost_s: args.rebalance_max_lost,
        });
        if let Some(r) = &rebalance {
            r.validate()
                .map_err(|e| anyhow::anyhow!("--rebalance-after: {e}"))?;
        }
        let consolidate = args.consolidate.then_some(ConsolidateConfig {
            interval_s: args.consolidate_interval,
            safety_factor: args.consolidate_safety,
            max_moves: args.consolidate_max_moves,
            protect_s: args.consolidate_protect,
            remaining: match args.consolidate_remaining {
                RemainingArg::Elapsed => RemainingEstimate::Elapsed,
                RemainingArg::Oracle => RemainingEstimate::Oracle,
            },
        });
        if let Some(c) = &consolidate {
            c.validate()
                .map_err(|e| anyhow::anyhow!("--consolidate: {e}"))?;
        }
        let quota = args.quota.as_deref().map(read_quota).transpose()?;
        let experiment = Experiment {
            cpu_nodes_first: args.cpu_nodes_first,
            quota,
            reservation,
            rebalance,
            consolidate,
            trace: args.trace.clone(),
            topo,
            jobs,
            config,
            enrichment,
            learned: args
                .policy
                .iter()
                .any(|p| p == policies::learned::LEARNED)
                .then(|| {
                    crate::cli::policy::load_setup(
                        args.model.as_deref(),
                        args.fallback.as_deref(),
                        args.mode,
                    )
                }),
        };
        // Fail now, not in a worker thread, if a job cannot be enriched.
        experiment.jobs_for(args.seed)?;
        Ok(experiment)
    }

    /// The jobs as a run with `seed` sees them: enriched with that seed's draw of kinds.
    pub fn jobs_for(&self, seed: u64) -> anyhow::Result<std::borrow::Cow<'_, [Job]>> {
        let Some(e) = &self.enrichment else {
            return Ok(std::borrow::Cow::Borrowed(&self.jobs));
        };
        let mut jobs = self.jobs.clone();
        e.library
            .enrich(
                &mut jobs,
                seed,
                &self.topo.catalog,
                e.recorded_on.as_deref(),
                &self.config.speed,
            )
            .with_context(|| format!("enriching trace {}", self.trace))?;
        Ok(std::borrow::Cow::Owned(jobs))
    }

    /// One run, with each completed job's JCT (replay mode; empty in inflation mode).
    pub fn run_detailed(&self, policy: &str, seed: u64) -> anyhow::Result<Run> {
        let jobs = self.jobs_for(seed)?;
        let jobs = jobs.as_ref();
        let (mut policy, gate) =
            crate::cli::policy::build_policy(policy, jobs, self.learned.as_ref())?;
        policy.reservation = self.reservation;
        policy.rebalance = self.rebalance;
        policy.consolidate = self.consolidate;
        policy.quota = self.quota.clone();
        if self.cpu_nodes_first {
            policy = policy.with_cpu_nodes_first();
        }
        let config = SimConfig {
            seed,
            ..self.config.clone()
        };
        let mut run = match config.mode {
            Mode::Replay => {
                let (result, log) =
                    sim::run_replay(&policy, self.topo.clone(), jobs, &self.trace, &config)?;
                let submit: std::collections::HashMap<_, _> =
                    jobs.iter().map(|j| (j.id, j.submit_time)).collect();
                let jcts_s = log
                    .iter()
                    .filter(|e| matches!(e.what, sim::LogKind::Finish))
                    .filter_map(|e| Some(e.time - submit.get(&e.job)?))
                    .collect();
                Run { result, jcts_s }
            }
            Mode::Inflation { .. } => Run {
                result: sim::run_inflation(&policy, self.topo.clone(), jobs, &self.trace, &config)?
                    .0,
                jcts_s: Vec::new(),
            },
        };
        run.result.fallback_rate = gate.as_ref().map(|g| g.snapshot().fallback_rate());
        let head = self.learned.as_ref().and_then(|l| l.decline.as_ref());
        let counts = gate.map(|g| g.snapshot());
        run.result.declined_shares = (counts.as_ref())
            .map(|c| c.declines)
            .filter(|&n| n > 0 || head.is_some());
        run.result.sum_of_squares_ties = (counts.as_ref())
            .map(|c| c.sum_of_squares_ties)
            .filter(|&n| n > 0 || head.is_some_and(|h| h.share_ties.is_some()));
        Ok(run)
    }

    /// Runs every (policy, seed) pair, spread over the machine's cores, and groups the
    /// results by policy in the order given.
    pub fn run_all(
        &self,
        policies: &[String],
        seed: u64,
        seeds: u64,
    ) -> anyhow::Result<Vec<Vec<SimResult>>> {
        Ok(self
            .run_all_detailed(policies, seed, seeds)?
            .into_iter()
            .map(|runs| runs.into_iter().map(|r| r.result).collect())
            .collect())
    }

    /// As [`Experiment::run_all`], keeping each run's JCTs.
    pub fn run_all_detailed(
        &self,
        policies: &[String],
        seed: u64,
        seeds: u64,
    ) -> anyhow::Result<Vec<Vec<Run>>> {
        for p in policies {
            crate::cli::policy::check_name(p)?;
        }
        let seeds = seed_range(seed, seeds)?;
        let tasks: Vec<(usize, u64)> = (0..policies.len())
            .flat_map(|p| seeds.clone().map(move |s| (p, s)))
            .collect();
        let workers = std::thread::available_parallelism()
            .map_or(1, |n| n.get())
            .min(tasks.len());
        let next = std::sync::atomic::AtomicUsize::new(0);
        let results: std::sync::Mutex<Vec<Option<anyhow::Result<Run>>>> =
            std::sync::Mutex::new((0..tasks.len()).map(|_| None).collect());
        std::thread::scope(|scope| {
            for _ in 0..workers {
                scope.spawn(|| {
                    loop {
                        let i = next.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                        let Some(&(p, s)) = tasks.get(i) else { break };
                        let r = self.run_detailed(&policies[p], s);
                        results.lock().unwrap_or_else(|e| e.into_inner())[i] = Some(r);
                    }
                });
            }
        });
        let mut groups: Vec<Vec<Run>> = (0..policies.len()).map(|_| Vec::new()).collect();
        for (&(p, _), r) in tasks
            .iter()
            .zip(results.into_inner().unwrap_or_else(|e| e.into_inner()))
        {
            groups[p].push(r.expect("every task ran")?);
        }
        Ok(groups)
    }
}

pub fn default_cluster_for(trace: &str) -> &'static str {
    if trace.starts_with("pollux") || trace.starts_with("sia") {
        "pollux-64"
    } else if trace.starts_with("itp-195job") {
        "elasticflow-128"
    } else if trace.starts_with("philly") {
        "philly"
    } else if trace == "dlrm" {
        "dlrm-peak"
    } else {
        "openb"
    }
}

/// An hours option in seconds, refused by name when it is outside what the simulator's
/// failure model takes (1 s ..= 10^12 s); a huge value would otherwise overflow to an
/// infinite time and be reported as `inf h`.
fn hours_to_s(flag: &str, hours: f64) -> anyhow::Result<f64> {
    let s = hours * 3600.0;
    if !(s.is_finite() && (1.0..=1e12).contains(&s)) {
        // As typed for everyday magnitudes; 1e308 in scientific notation, not 309 digits.
        let given = if hours == 0.0 || (1e-3..1e9).contains(&hours.abs()) {
            hours.to_string()
        } else {
            format!("{hours:e}")
        };
        bail!("{flag} {given}: must be between 1 s and 10^12 s (1/3600 h to about 2.8e8 h)");
    }
    Ok(s)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn failure_hours_outside_the_model_s_range_are_refused_by_name() {
        assert_eq!(hours_to_s("--mtbf-hours", 2.0).unwrap(), 7200.0);
        for (h, shown) in [
            (1e308, "1e308"),
            (f64::INFINITY, "inf"),
            (f64::NAN, "NaN"),
            (-1.0, "-1"),
            (0.0, "0"),
            (1e-4, "1e-4"),
            (3e8, "300000000"),
        ] {
            let e = hours_to_s("--repair-hours", h).unwrap_err().to_string();
            assert!(
                e.starts_with(&format!("--repair-hours {shown}: must be between 1 s")),
                "{h}: {e}"
            );
        }
    }

    #[test]
    fn seed_ranges_are_refused_when_empty_too_many_or_past_the_largest_seed() {
        assert_eq!(seed_range(42, 3).unwrap(), 42..=44);
        assert_eq!(
            seed_range(u64::MAX - 1, 2).unwrap(),
            u64::MAX - 1..=u64::MAX
        );
        for (seed, seeds, says) in [
            (42, 0, "must be 1 ..= 10000"),
            (42, MAX_SEEDS + 1, "must be 1 ..= 10000"),
            (u64::MAX, 2, "runs past the largest seed"),
            (u64::MAX - 1, 3, "runs past the largest seed"),
        ] {
            let e = seed_range(seed, seeds).unwrap_err().to_string();
            assert!(e.contains(says), "{seed} {seeds}: {e}");
        }
    }
}
