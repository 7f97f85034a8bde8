//! Scheduler benchmarks (criterion). Run with `cargo bench -p marshal-scheduler`.
//!
//! Two families, with names that the README quotes (keep them stable):
//!
//! - `sim/…`: whole simulator runs on bundled traces, the way `marshal sim` runs them.
//!   - `sim/replay_events`: a one-week Philly replay on `dgx-h100-64` under `best-fit`,
//!     reported as simulator events per second.
//!   - `sim/openb_inflation/<policy>`: one full FGD-style inflation run on openb
//!     (`best-fit`, `fgd`); target < 1 s per run.
//!   - `sim/philly_full_replay/topo-pack`: the whole 82,247-job Philly replay; target
//!     < 5 s.
//! - `decision/<policy>`, for every name in [`POLICY_NAMES`]: one placement decision on a
//!   10,000-GPU cluster that is about 60 % allocated, for a stream of 1,000 pending jobs.
//!   After the criterion group, a p50/p99 table of the same decisions, timed one by one,
//!   is printed to stderr: the target is p99 < 100 µs for the heuristics, and criterion
//!   reports means, not tails. Its "cold p99" column is the first (warm-up) pass.
//!
//! A full run takes about five minutes on two cores; `cargo bench -p marshal-scheduler
//! -- decision/` runs the decision benchmarks alone.

use std::hint::black_box;
use std::sync::Arc;
use std::time::{Duration, Instant};

use criterion::measurement::WallTime;
use criterion::{
    BatchSize, BenchmarkGroup, BenchmarkId, Criterion, SamplingMode, Throughput, criterion_group,
    criterion_main,
};
use marshal_scheduler::domain::{
    ClusterSpec, ClusterState, CommPattern, GpuDemand, Job, JobId, LinkSpec, NodeGroupSpec,
    Placement, Topology,
};
use marshal_scheduler::framework::{Context, Placer, Policy};
use marshal_scheduler::policies::{self, Fgd, POLICY_NAMES};
use marshal_scheduler::sim::{self, SimConfig, SimResult, percentile};
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;

/// Seed of every run and of every generated workload, so that numbers are comparable
/// between runs and machines.
const SEED: u64 = 42;

// ---------------------------------------------------------------------------------------
// Simulator runs
// ---------------------------------------------------------------------------------------

/// A bundled trace on a preset cluster, loaded once, outside any measurement.
#[derive(Debug)]
struct Experiment {
    trace: &'static str,
    topo: Arc<Topology>,
    jobs: Vec<Job>,
}

impl Experiment {
    fn load(trace: &'static str, cluster: &str) -> Experiment {
        let spec = marshal_datasets::cluster_preset(cluster)
            .unwrap_or_else(|e| panic!("cluster preset {cluster}: {e}"));
        let topo = Arc::new(
            Topology::build(&spec).unwrap_or_else(|e| panic!("building cluster {cluster}: {e}")),
        );
        let (jobs, _report) = marshal_datasets::load_trace(trace, &topo.catalog)
            .unwrap_or_else(|e| panic!("loading trace {trace}: {e}"));
        assert!(!jobs.is_empty(), "trace {trace} has no jobs");
        Experiment { trace, topo, jobs }
    }

    /// A fresh policy, as `marshal sim` builds one per run. Built in the un-timed setup
    /// of each iteration: `fgd` memoises node states, and a policy carried over from the
    /// previous iteration would make every run after the first a warm-cache run.
    fn policy(&self, name: &str) -> Policy {
        policies::build(name, &self.jobs).unwrap_or_else(|e| panic!("{e}"))
    }

    fn replay(&self, policy: &Policy) -> SimResult {
        sim::run_replay(
            policy,
            self.topo.clone(),
            &self.jobs,
            self.trace,
            &SimConfig::replay(SEED),
        )
        .unwrap_or_else(|e| panic!("replay of {} failed: {e}", self.trace))
        .0
    }

    fn inflation(&self, policy: &Policy) -> SimResult {
        sim::run_inflation(
            policy,
            self.topo.clone(),
            &self.jobs,
            self.trace,
            &SimConfig::inflation(SEED),
        )
        .unwrap_or_else(|e| panic!("inflation of {} failed: {e}", self.trace))
        .0
    }
}

/// Configures a group for runs that take a large fraction of a second or more: ten
/// samples of equal iteration counts (criterion's linear sampling would need 55 runs).
/// `measurement_time` must exceed ten runs, or criterion warns that it cannot complete
/// its samples; the values given leave about 1.5x headroom over runs on a 2-core
/// development machine. Criterion then takes at most twice that time.
fn long_running(group: &mut BenchmarkGroup<'_, WallTime>, measurement_time: Duration) {
    group
        .sample_size(10)
        .sampling_mode(SamplingMode::Flat)
        .measurement_time(measurement_time);
}

/// `sim/replay_events`: simulator throughput in events per second.
fn bench_replay_events(c: &mut Criterion) {
    const POLICY: &str = "best-fit";
    let exp = Experiment::load("philly-week4", "dgx-h100-64");
    // Criterion needs the element count before it measures; the count is deterministic
    // for a seed, so one run up front gives it.
    let result = exp.replay(&exp.policy(POLICY));
    let events = result.events;
    // The event rate depends on how deep the queue gets; say what this run looked like.
    eprintln!(
        "sim/replay_events: {} jobs, {events} events, mean queueing {:.0} s, {} GPUs",
        result.jobs,
        result.queue_mean_s.unwrap_or(0.0),
        result.gpus
    );
    let mut group = c.benchmark_group("sim");
    group.throughput(Throughput::Elements(events));
    long_running(&mut group, Duration::from_secs(25));
    group.bench_function("replay_events", |b| {
        b.iter_batched(
            || exp.policy(POLICY),
            |policy| exp.replay(&policy),
            BatchSize::PerIteration,
        );
    });
    group.finish();
}

/// `sim/openb_inflation/<policy>`: one full inflation run (tasks arrive until 130 % of
/// capacity is requested). Target: < 1 s per run.
fn bench_openb_inflation(c: &mut Criterion) {
    let exp = Experiment::load("openb", "openb");
    let mut group = c.benchmark_group("sim");
    long_running(&mut group, Duration::from_secs(15));
    for policy in ["best-fit", "fgd"] {
        group.bench_function(BenchmarkId::new("openb_inflation", policy), |b| {
            b.iter_batched(
                || exp.policy(policy),
                |policy| exp.inflation(&policy),
                BatchSize::PerIteration,
            );
        });
    }
    group.finish();
}

/// `sim/philly_full_replay/topo-pack`: the full Philly trace on the Philly cluster.
/// Target: < 5 s per run.
fn bench_philly_full_replay(c: &mut Criterion) {
    const POLICY: &str = "topo-pack";
    let exp = Experiment::load("philly", "philly");
    let mut group = c.benchmark_group("sim");
    long_running(&mut group, Duration::from_secs(40));
    group.bench_function(BenchmarkId::new("philly_full_replay", POLICY), |b| {
        b.iter_batched(
            || exp.policy(POLICY),
            |policy| exp.replay(&policy),
            BatchSize::PerIteration,
        );
    });
    group.finish();
}

// ---------------------------------------------------------------------------------------
// Decision latency
// ---------------------------------------------------------------------------------------

/// Pending jobs the decisions cycle through.
const PENDING_JOBS: usize = 1_000;
/// Share of GPU capacity allocated before decisions are measured.
const TARGET_ALLOCATION: f64 = 0.60;
/// Departures-and-arrivals rounds after the initial fill, per running job. Filling an
/// empty cluster with best fit and no departures packs the low node ids solid and leaves
/// the rest idle, which is the easiest state to score; a running cluster has holes
/// everywhere, so jobs leave at random and new ones are placed until the state looks
/// like that.
const CHURN_PER_RUNNING_JOB: usize = 2;

/// ChaCha8 streams of [`SEED`], one per purpose, so that changing how one is drawn does
/// not change the others.
const PENDING_STREAM: u64 = 0;
const PREFILL_STREAM: u64 = 1;
const POLICY_STREAM: u64 = 2;

fn rng(stream: u64) -> ChaCha8Rng {
    let mut rng = ChaCha8Rng::seed_from_u64(SEED);
    rng.set_stream(stream);
    rng
}

/// 1,250 DGX H100-class nodes (8 GPUs in one NVLink island, 224 cores, 2 TiB): 10,000
/// GPUs in 79 racks under 10 spines.
fn decision_cluster() -> ClusterSpec {
    ClusterSpec {
        name: "bench-h100-10k".into(),
        nodes_per_rack: 16,
        racks_per_spine: 8,
        links: LinkSpec::default(),
        gpu_models: Vec::new(),
        node_groups: vec![NodeGroupSpec {
            count: 1_250,
            name_prefix: Some("h100".into()),
            names: Vec::new(),
            gpu_model: Some("H100".into()),
            gpus: 8,
            nvlink_domain: 8,
            cpu_milli: 224_000,
            memory_mib: 2 * 1024 * 1024,
        }],
    }
}

/// One job of a mixed GPU-sharing/training workload: 40 % GPU shares, 58 % single-node
/// whole-GPU jobs of 1–8 GPUs, 2 % multi-node gangs of 2–4 full nodes; 2–16 cores and
/// 8–64 GiB per worker.
///
/// Sizes come from coarse menus (shares in tenths of a GPU, cores and memory in steps of
/// 2 and 8), as people request them; openb, for one, has 91 distinct task shapes in 8,152
/// pods. Uniform values over the ranges would make nearly every job a shape of its own,
/// and `fgd`, whose target workload is the set of shapes covering 95 % of the jobs and
/// whose cost grows with it, would then score against ~950 shapes instead of tens.
fn mixed_job(id: u32, rng: &mut ChaCha8Rng) -> Job {
    let (workers, gpu) = match rng.random_range(0..100u32) {
        0..40 => (1, GpuDemand::Milli(100 * rng.random_range(1..=9))),
        40..75 => (1, GpuDemand::Whole(1)),
        75..85 => (1, GpuDemand::Whole(2)),
        85..93 => (1, GpuDemand::Whole(4)),
        93..98 => (1, GpuDemand::Whole(8)),
        _ => (rng.random_range(2..=4), GpuDemand::Whole(8)),
    };
    let mut job = Job::whole_gpus(JobId(id), workers, 0.0, 3_600.0);
    job.workers = workers;
    job.gpu = gpu;
    job.cpu_milli = 2_000 * rng.random_range(1..=8);
    job.memory_mib = 8 * 1024 * rng.random_range(1..=8);
    job.comm = if job.gpu_count() > 1 {
        CommPattern::DataParallel
    } else {
        CommPattern::None
    };
    job
}

/// The cluster, its pre-filled state and the pending jobs every policy decides on.
#[derive(Debug)]
struct DecisionSetup {
    state: ClusterState,
    pending: Vec<Job>,
}

impl DecisionSetup {
    fn new() -> DecisionSetup {
        let topo = Arc::new(Topology::build(&decision_cluster()).expect("valid bench cluster"));
        let mut pending_rng = rng(PENDING_STREAM);
        let pending: Vec<Job> = (0..PENDING_JOBS as u32)
            .map(|id| mixed_job(id, &mut pending_rng))
            .collect();
        let state = prefill(ClusterState::new(topo));
        DecisionSetup { state, pending }
    }
}

/// Brings `state` to about [`TARGET_ALLOCATION`] with jobs of the same mix, placed by
/// `best-fit` and allocated, then churns it (random departures, new arrivals) so that
/// free capacity is scattered over the cluster.
fn prefill(mut state: ClusterState) -> ClusterState {
    let placer = policies::build("best-fit", &[])
        .expect("best-fit exists")
        .placer;
    let mut rng = rng(PREFILL_STREAM);
    let target = (state.capacity_milli() as f64 * TARGET_ALLOCATION) as u64;
    let mut running: Vec<(Job, Placement)> = Vec::new();
    // Ids above the pending jobs' so that no two jobs share one.
    let mut next_id = PENDING_JOBS as u32;
    let mut fill =
        |state: &mut ClusterState, running: &mut Vec<(Job, Placement)>, rng: &mut ChaCha8Rng| {
            let mut misses = 0;
            while state.allocated_milli() < target {
                let job = mixed_job(next_id, rng);
                next_id += 1;
                let mut ctx = Context::new(0.0, rng);
                match placer.place(&job, state, &mut ctx) {
                    Ok(placement) => {
                        state
                            .allocate(&job, &placement)
                            .expect("a placement the placer returned fits");
                        running.push((job, placement));
                    }
                    // Near the target, large gangs may not fit; a bounded number of misses
                    // keeps a pathological mix from looping forever.
                    Err(_) => {
                        misses += 1;
                        assert!(
                            misses < 10_000,
                            "cannot reach {TARGET_ALLOCATION} allocation"
                        );
                    }
                }
            }
        };
    fill(&mut state, &mut running, &mut rng);
    for _ in 0..running.len() * CHURN_PER_RUNNING_JOB {
        let (job, placement) = running.swap_remove(rng.random_range(0..running.len()));
        state.release(&job, &placement);
        fill(&mut state, &mut running, &mut rng);
    }
    state
        .check_consistency()
        .expect("pre-filled state is consistent");
    state
}

/// One line about the state decisions run on, so that a reader of the numbers knows
/// what "60 % allocated" looked like.
fn describe(state: &ClusterState) -> String {
    let topo = state.topology();
    let (mut idle, mut full) = (0, 0);
    for node in topo.node_ids() {
        if state.node_idle_gpus(node) == topo.node(node).gpu_count() {
            idle += 1;
        } else if state.node_free_milli(node) == 0 {
            full += 1;
        }
    }
    format!(
        "{} GPUs, {:.1} % allocated; nodes: {idle} idle, {full} with no free GPU, {} partly used",
        topo.gpu_count(),
        state.allocated_milli() as f64 / state.capacity_milli() as f64 * 100.0,
        topo.nodes().len() - idle - full,
    )
}

/// `decision/<policy>`: one `place()` call, for the next pending job in turn. `place()`
/// leaves the state as it found it (placers reserve a gang worker by worker and release
/// it before returning), so nothing needs resetting between iterations and plain `iter`
/// measures exactly one decision.
fn bench_decisions(c: &mut Criterion) {
    let setup = DecisionSetup::new();
    eprintln!("decision benchmarks: {}", describe(&setup.state));
    let mut ran: Vec<&str> = Vec::new();
    let mut group = c.benchmark_group("decision");
    for &name in POLICY_NAMES {
        // FGD derives its target workload from the jobs being scheduled.
        let policy = policies::build(name, &setup.pending).expect("listed policy builds");
        let mut state = setup.state.clone();
        let mut rng = rng(POLICY_STREAM);
        let mut next = 0usize;
        let mut did_run = false;
        group.bench_function(name, |b| {
            did_run = true;
            let mut ctx = Context::new(0.0, &mut rng);
            b.iter(|| {
                let job = &setup.pending[next % PENDING_JOBS];
                next += 1;
                policy.placer.place(black_box(job), &mut state, &mut ctx)
            });
        });
        if did_run {
            ran.push(name);
        }
    }
    group.finish();
    // Criterion's `--test` mode (`cargo test --benches`) runs each benchmark once; the
    // table would then time a few hundred thousand decisions for nothing.
    if bench_mode() && !ran.is_empty() {
        print_latency_table(&setup, &ran);
    }
}

/// Whether criterion is measuring (`cargo bench`), as opposed to testing or listing.
fn bench_mode() -> bool {
    let args: Vec<String> = std::env::args().collect();
    let has = |flag: &str| args.iter().any(|a| a == flag);
    has("--bench") && !has("--test") && !has("--list")
}

/// Decision-latency percentiles of the policies called `names`, each decision timed on its own.
fn print_latency_table(setup: &DecisionSetup, names: &[&str]) {
    eprintln!(
        "\ndecision latency: {} decisions per policy, each timed alone; {}",
        PENDING_JOBS,
        describe(&setup.state)
    );
    eprintln!(
        "fgd target workload: {} task shapes",
        Fgd::from_workload(&setup.pending).target_shapes()
    );
    eprintln!(
        "{:<16} {:>9} {:>9} {:>9} {:>9} {:>13} {:>7}",
        "policy", "p50 µs", "p99 µs", "max µs", "mean µs", "cold p99 µs", "placed"
    );
    for &name in names {
        let policy = policies::build(name, &setup.pending).expect("listed policy builds");
        let mut state = setup.state.clone();
        let mut rng = rng(POLICY_STREAM);
        let mut ctx = Context::new(0.0, &mut rng);
        // Warm-up pass, reported separately as "cold". It matters most for `fgd`, which
        // memoises each (node state, task shape) it scores: the first pass fills the
        // memo, later passes mostly hit it, as a long-running scheduler would. It also
        // warms caches and the allocator for the other policies.
        let (mut cold, _) = time_decisions(&*policy.placer, &setup.pending, &mut state, &mut ctx);
        let (mut warm, placed) =
            time_decisions(&*policy.placer, &setup.pending, &mut state, &mut ctx);
        assert_eq!(
            state.allocated_milli(),
            setup.state.allocated_milli(),
            "{name}: place() changed the state"
        );
        let mean = warm.iter().sum::<f64>() / warm.len() as f64;
        let pct = |values: &mut [f64], q: f64| percentile(values, q).expect("non-empty");
        eprintln!(
            "{:<16} {:>9.1} {:>9.1} {:>9.1} {:>9.1} {:>13.1} {:>7}",
            name,
            pct(&mut warm, 0.50),
            pct(&mut warm, 0.99),
            pct(&mut warm, 1.0),
            mean,
            pct(&mut cold, 0.99),
            placed,
        );
    }
    eprintln!("(placed: decisions that found a placement; the rest are Unschedulable)");
}

/// Times one `place()` per job, in µs, and counts the jobs that got a placement.
fn time_decisions(
    placer: &dyn Placer,
    jobs: &[Job],
    state: &mut ClusterState,
    ctx: &mut Context,
) -> (Vec<f64>, usize) {
    let mut placed = 0;
    let micros = jobs
        .iter()
        .map(|job| {
            let started = Instant::now();
            // The result is dropped inside the timed region, as in the criterion loop.
            let ok = black_box(placer.place(black_box(job), state, ctx)).is_ok();
            let elapsed = started.elapsed();
            placed += usize::from(ok);
            elapsed.as_secs_f64() * 1e6
        })
        .collect();
    (micros, placed)
}

criterion_group!(
    benches,
    bench_replay_events,
    bench_openb_inflation,
    bench_philly_full_replay,
    bench_decisions,
);
criterion_main!(benches);
