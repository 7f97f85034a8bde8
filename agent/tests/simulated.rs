//! Simulated telemetry follows the replay and the speed model it came from.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::sync::atomic::AtomicBool;
use std::time::Duration;

use marshal_agent::{ManualClock, SimTelemetryOptions, SimulatedTelemetry, run_sampling_loop};
use marshal_scheduler::domain::{
    ClusterSpec, CommPattern, Job, JobId, Topology, WorkloadCatalog, WorkloadId, WorkloadKind,
};
use marshal_scheduler::policies;
use marshal_scheduler::sim::{SimConfig, SpeedModel, run_replay};
use marshal_telemetry::{
    Health, MemPhase, Query, SinkConfig, TelemetryKind, TelemetrySink, read_all,
};

fn topo() -> Arc<Topology> {
    // Two racks of two nodes, 4 V100 each on NVLink.
    let spec = ClusterSpec::from_toml(
        "name='t'\nnodes_per_rack=2\n[[nodes]]\ncount=4\ngpu_model='V100M32'\ngpus=4\n\
         nvlink_domain=4\ncpu_milli=64000\nmemory_mib=256000\n",
    )
    .unwrap();
    Arc::new(Topology::build(&spec).unwrap())
}

fn speed() -> SpeedModel {
    let kind = WorkloadKind {
        name: "resnet".into(),
        family: "ResNet-50".into(),
        comm: CommPattern::DataParallel,
        relative_throughput: BTreeMap::new(),
        comm_share: 0.4,
        comm_share_by_local_batch: vec![],
        colocation_speed: 0.7,
        reference_step_time_s: Some(0.25),
        memory: vec![],
        source: "test".into(),
    };
    SpeedModel {
        workloads: WorkloadCatalog::new(vec![kind]).unwrap(),
        ..SpeedModel::default()
    }
}

fn job(id: u32, gpus: u32, submit: f64, work: f64) -> Job {
    let mut j = Job::whole_gpus(JobId(id), gpus, submit, work);
    j.workload = Some(WorkloadId(0));
    j
}

fn telemetry(jobs: Vec<Job>, opts: SimTelemetryOptions) -> SimulatedTelemetry {
    let topo = topo();
    let config = SimConfig {
        speed: speed(),
        ..SimConfig::replay(1)
    };
    let policy = policies::build("topo-pack", &jobs).unwrap();
    let (_, log) = run_replay(&policy, topo.clone(), &jobs, "t", &config).unwrap();
    SimulatedTelemetry::new(topo, jobs, &log, speed(), opts).unwrap()
}

#[test]
fn samples_follow_the_jobs_phases() {
    let opts = SimTelemetryOptions {
        noise: 0.0,
        ..SimTelemetryOptions::default()
    };
    let mut sim = telemetry(vec![job(0, 4, 0.0, 20_000.0)], opts);
    assert_eq!(sim.sample_at(0.0).len(), 16, "every GPU of the cluster");
    let busy = |samples: &[marshal_telemetry::GpuSample]| {
        samples
            .iter()
            .filter(|s| s.job_id.is_some())
            .cloned()
            .collect::<Vec<_>>()
    };
    let warm = busy(&sim.sample_at(30.0));
    assert_eq!(warm.len(), 4);
    assert!(warm.iter().all(|s| s.mem_phase == Some(MemPhase::Warmup)));
    let steady = busy(&sim.sample_at(600.0));
    assert!(steady.iter().all(|s| s.mem_phase == Some(MemPhase::Steady)));
    // Packed on one NVLink island: little time communicating, busy SMs, NVLink traffic.
    let s = &steady[0];
    assert!(s.sm_util_pct.unwrap() > 80.0, "{:?}", s.sm_util_pct);
    assert!(s.mem_used_bytes.unwrap() > warm[0].mem_used_bytes.unwrap());
    assert!(s.nvlink_tx_kib.unwrap() > 0);
    // The first checkpoint stall: 1800 s of work after the 60 s restart.
    let ckpt = busy(&sim.sample_at(60.0 + 1_800.0 + 10.0));
    assert!(
        ckpt.iter()
            .all(|s| s.mem_phase == Some(MemPhase::Checkpoint))
    );
    assert!(ckpt[0].sm_util_pct.unwrap() < 10.0);
    // Idle GPUs report nothing running.
    let idle: Vec<_> = sim
        .sample_at(600.0)
        .into_iter()
        .filter(|s| s.job_id.is_none())
        .collect();
    assert_eq!(idle.len(), 12);
    assert!(
        idle.iter()
            .all(|s| s.sm_util_pct == Some(0.0) && s.mem_used_bytes == Some(0))
    );
}

#[test]
fn step_profiles_carry_the_speed_models_step_time() {
    let mut sim = telemetry(
        vec![job(0, 4, 0.0, 20_000.0)],
        SimTelemetryOptions::default(),
    );
    let profiles = sim.step_profiles_at(600.0);
    assert_eq!(profiles.len(), 1);
    let p = &profiles[0];
    assert!(
        (p.step_time_s - 0.25).abs() < 1e-12,
        "packed: the reference step time"
    );
    assert_eq!((p.num_gpus, p.placement.as_ref()), (4, "1x4"));
    assert_eq!(p.model.as_deref(), Some("resnet"));
    assert_eq!(p.comm.as_deref(), Some("data-parallel"));
    assert_eq!(p.span.as_deref(), Some("nvlink-island"));
    assert_eq!(p.tenants, Some(1));
    assert!(p.gpu_util_pct.unwrap() > 80.0, "{:?}", p.gpu_util_pct);
    assert!(p.step > 0);
    let _ = sim.sample_at(601.0);
}

#[test]
fn stragglers_and_degraded_links_slow_jobs_and_show_in_the_samples() {
    let clean = telemetry(
        vec![job(0, 4, 0.0, 20_000.0)],
        SimTelemetryOptions::default(),
    );
    let faulty_opts = SimTelemetryOptions {
        noise: 0.0,
        straggler_fraction: 1.0,
        degraded_node_fraction: 1.0,
        ..SimTelemetryOptions::default()
    };
    let mut faulty = telemetry(vec![job(0, 4, 0.0, 20_000.0)], faulty_opts);
    let slow = faulty.step_profiles_at(600.0)[0].step_time_s;
    let fast = clean.step_profiles_at(600.0)[0].step_time_s;
    assert!(slow > fast / 0.7 * 0.999, "{slow} vs {fast}");
    let samples: Vec<_> = faulty
        .sample_at(600.0)
        .into_iter()
        .filter(|s| s.job_id.is_some())
        .collect();
    assert!(samples.iter().all(|s| s.health == Health::Degraded));
    let mut utils: Vec<f32> = samples.iter().map(|s| s.sm_util_pct.unwrap()).collect();
    utils.sort_by(f32::total_cmp);
    // Three GPUs wait for the straggler.
    assert!(utils[0] < utils[3] * 0.8, "{utils:?}");
    assert_eq!(utils[0], utils[2]);
}

#[test]
fn the_same_seed_gives_the_same_series_in_any_order() {
    let jobs = vec![
        job(0, 4, 0.0, 9_000.0),
        job(1, 8, 100.0, 9_000.0),
        job(2, 1, 200.0, 500.0),
    ];
    let mut a = telemetry(jobs.clone(), SimTelemetryOptions::default());
    let mut b = telemetry(jobs.clone(), SimTelemetryOptions::default());
    let ticks = [300.0, 900.0, 1500.0];
    let from_a: Vec<_> = ticks.iter().map(|&t| a.sample_at(t)).collect();
    let from_b: Vec<_> = ticks.iter().map(|&t| b.sample_at(t)).collect();
    assert_eq!(from_a, from_b);
    let mut c = telemetry(
        jobs,
        SimTelemetryOptions {
            seed: 7,
            ..SimTelemetryOptions::default()
        },
    );
    let from_c: Vec<_> = ticks.iter().map(|&t| c.sample_at(t)).collect();
    assert_ne!(from_a, from_c);
}

#[test]
fn the_loop_writes_a_nodes_samples_until_stopped() {
    let dir = tempfile::tempdir().unwrap();
    let mut sim = telemetry(
        vec![job(0, 4, 0.0, 5_000.0)],
        SimTelemetryOptions::default(),
    );
    let node = topo().nodes()[0].name.clone();
    sim.only_node(&node).unwrap();
    assert!(sim.only_node("nope").is_err());
    let sink = TelemetrySink::open(SinkConfig::new(dir.path())).unwrap();
    // The host sampler reads this machine's /proc (fields it cannot read stay null).
    let mut host = Some(marshal_agent::HostSampler::new("t", &node));
    let stop = AtomicBool::new(false);
    let mut clock = ManualClock {
        now_us: SimTelemetryOptions::default().epoch_us,
    };
    let stats = run_sampling_loop(
        &mut sim,
        host.as_mut(),
        &sink,
        Duration::from_secs(10),
        &stop,
        &mut clock,
        Some(30),
    )
    .unwrap();
    assert_eq!((stats.ticks, stats.rows, stats.node_rows), (30, 30 * 4, 30));
    sink.finish().unwrap();
    let (rows, report): (Vec<marshal_telemetry::GpuSample>, _) =
        read_all(dir.path(), Query::new(TelemetryKind::Gpu)).unwrap();
    assert!(report.errors.is_empty());
    assert_eq!(rows.len(), 120);
    // A stop request ends the loop before its first tick.
    let sink = TelemetrySink::open(SinkConfig::new(dir.path().join("b"))).unwrap();
    let stop = AtomicBool::new(true);
    let mut host = None;
    let stats = run_sampling_loop(
        &mut sim,
        host.as_mut(),
        &sink,
        Duration::from_secs(1),
        &stop,
        &mut clock,
        None,
    )
    .unwrap();
    assert_eq!(stats.ticks, 0);
}

#[test]
fn the_loop_keeps_its_pace_when_the_sink_takes_no_rows_and_counts_what_it_drops() {
    use marshal_telemetry::faults::{FaultOp, NO_SPACE, inject};
    let dir = tempfile::tempdir().unwrap();
    let mut sim = telemetry(
        vec![job(0, 4, 0.0, 5_000.0)],
        SimTelemetryOptions::default(),
    );
    sim.only_node(&topo().nodes()[0].name.clone()).unwrap();
    let mut cfg = SinkConfig::new(dir.path());
    cfg.max_buffered_rows = 8;
    cfg.channel_capacity = 1;
    let sink = TelemetrySink::open(cfg).unwrap();
    let full = inject(dir.path(), FaultOp::Create, NO_SPACE);
    let stop = AtomicBool::new(false);
    let mut clock = ManualClock {
        now_us: SimTelemetryOptions::default().epoch_us,
    };
    // The wait for room is real time, bounded by the interval.
    let stats = run_sampling_loop(
        &mut sim,
        None,
        &sink,
        Duration::from_millis(20),
        &stop,
        &mut clock,
        Some(20),
    )
    .unwrap();
    assert_eq!((stats.ticks, stats.rows), (20, 80), "every tick sampled");
    assert!(
        stats.rows_refused >= 40,
        "a sink stalled at 8 rows takes a few ticks, then none: {stats:?}"
    );
    assert!(sink.stats().stall.is_some());
    drop(full);
    let sink_stats = sink.finish().unwrap();
    assert_eq!(sink_stats.rows_dropped, 0);
    assert_eq!(sink_stats.rows_written, stats.rows - stats.rows_refused);
    let (rows, _): (Vec<marshal_telemetry::GpuSample>, _) =
        read_all(dir.path(), Query::new(TelemetryKind::Gpu)).unwrap();
    assert_eq!(rows.len() as u64, stats.rows - stats.rows_refused);
}
