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
use marshal_scheduler::domain::{ClusterState, Job, Topology};
use marshal_scheduler::framework::{Context, Placer, Policy};
use marshal_scheduler::policies::{self, Fgd, POLICY_NAMES};
use marshal_scheduler::sim::{self, SimConfig, SimResult, percentile};

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

#[path = "common/decision.rs"]
mod decision;
use decision::{DecisionSetup, PENDING_JOBS, POLICY_STREAM, rng};

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
