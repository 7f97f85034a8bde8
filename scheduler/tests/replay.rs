//! Behaviour of the replay simulator on small, hand-checked scenarios.

mod common;

use common::{cluster, job, start_time};
use std::sync::Arc;

use marshal_scheduler::domain::{Checkpointing, GpuDemand, Job, JobId, Topology};
use marshal_scheduler::framework::ReservationConfig;
use marshal_scheduler::policies;
use marshal_scheduler::sim::{FailureModel, LogEntry, LogKind, SimConfig, SimResult, run_replay};

fn run(
    policy: &str,
    topo: Arc<Topology>,
    jobs: &[Job],
    config: SimConfig,
) -> (SimResult, Vec<LogEntry>) {
    let p = policies::build(policy, jobs).unwrap();
    run_replay(&p, topo, jobs, "test", &config).unwrap()
}

#[test]
fn a_lone_job_runs_for_its_work_plus_restart_and_checkpoint_stalls() {
    let mut j = job(0, 1, 10.0, 3_600.0);
    j.checkpoint = Checkpointing {
        interval_s: 1_800.0,
        cost_s: 30.0,
        restart_s: 60.0,
        on_preempt: false,
    };
    let (r, _) = run("fifo", cluster(1, 8), &[j], SimConfig::replay(1));
    let expected = 60.0 + 3_600.0 * (1_830.0 / 1_800.0);
    assert!(
        (r.jct_mean_s.unwrap() - expected).abs() < 1e-6,
        "{:?}",
        r.jct_mean_s
    );
    assert_eq!(r.queue_mean_s, Some(0.0));
    assert_eq!(r.completed, 1);
}

#[test]
fn fifo_blocks_behind_the_head_while_backfilling_policies_do_not() {
    let jobs = [
        job(0, 4, 0.0, 1_000.0),
        job(1, 8, 1.0, 100.0),
        job(2, 1, 2.0, 100.0),
    ];
    let (_, fifo) = run("fifo", cluster(1, 8), &jobs, SimConfig::replay(1));
    assert_eq!(
        start_time(&fifo, 2),
        1_000.0 + 100.0,
        "waits for the 8-GPU head"
    );
    let (_, best_fit) = run("best-fit", cluster(1, 8), &jobs, SimConfig::replay(1));
    assert_eq!(start_time(&best_fit, 2), 2.0, "backfilled at once");
}

#[test]
fn priority_preempts_lower_priority_after_minimum_runtime_and_loses_uncheckpointed_work() {
    let mut low = job(0, 8, 0.0, 10_000.0);
    low.checkpoint.interval_s = 500.0;
    let mut high = job(1, 8, 1_200.0, 100.0);
    high.priority = 10;
    let (r, log) = run(
        "priority",
        cluster(1, 8),
        &[low.clone(), high.clone()],
        SimConfig::replay(1),
    );
    assert_eq!(r.preemptions, 1);
    assert_eq!(start_time(&log, 1), 1_200.0);
    // Two checkpoints (at 500 s and 1000 s of running) saved 1000 s; 200 s were lost.
    assert!(
        (r.lost_gpu_s - 200.0 * 8.0).abs() < 1e-6,
        "{}",
        r.lost_gpu_s
    );
    assert_eq!(r.completed, 2);

    // Before the ten-minute protection has passed, the high-priority job waits.
    high.submit_time = 300.0;
    let (r, log) = run(
        "priority",
        cluster(1, 8),
        &[low, high],
        SimConfig::replay(1),
    );
    assert_eq!(r.preemptions, 1);
    assert_eq!(
        start_time(&log, 1),
        600.0,
        "evicts as soon as the protection ends"
    );
}

#[test]
fn a_job_that_checkpoints_when_preempted_loses_nothing_but_a_failure_still_costs() {
    let mut low = job(0, 8, 0.0, 10_000.0);
    low.checkpoint.interval_s = 500.0;
    low.checkpoint.on_preempt = true;
    let mut high = job(1, 8, 1_200.0, 100.0);
    high.priority = 10;
    let (r, _) = run(
        "priority",
        cluster(1, 8),
        &[low.clone(), high],
        SimConfig::replay(1),
    );
    assert_eq!(r.preemptions, 1);
    assert_eq!(r.lost_gpu_s, 0.0);
    assert_eq!(r.completed, 2);
}

#[test]
fn tiresias_lets_a_new_job_overtake_one_that_has_used_its_first_queue() {
    // 4 GPUs × 900 s = 3,600 GPU-s: the first job leaves queue 0 at t = 900.
    let jobs = [job(0, 4, 0.0, 5_000.0), job(1, 4, 1_000.0, 100.0)];
    let (r, log) = run("tiresias", cluster(1, 4), &jobs, SimConfig::replay(1));
    assert_eq!(r.preemptions, 1);
    assert_eq!(start_time(&log, 1), 1_000.0);
    // And a new job arriving while the old one is still in queue 0 waits.
    let early = [job(0, 4, 0.0, 5_000.0), job(1, 4, 500.0, 100.0)];
    let (r, log) = run("tiresias", cluster(1, 4), &early, SimConfig::replay(1));
    assert_eq!(
        start_time(&log, 1),
        900.0,
        "preempted when the old job is demoted"
    );
    assert_eq!(r.preemptions, 1);
}

#[test]
fn the_oracle_runs_short_jobs_first() {
    let jobs = [
        job(0, 8, 0.0, 100.0),
        job(1, 8, 1.0, 5_000.0),
        job(2, 8, 2.0, 10.0),
    ];
    let (_, log) = run("sjf-oracle", cluster(1, 8), &jobs, SimConfig::replay(1));
    assert!(start_time(&log, 2) < start_time(&log, 1));
    let (_, log) = run("fifo", cluster(1, 8), &jobs, SimConfig::replay(1));
    assert!(start_time(&log, 1) < start_time(&log, 2));
}

#[test]
fn jobs_that_can_never_fit_are_rejected_with_a_reason() {
    let jobs = [job(0, 16, 0.0, 10.0), job(1, 1, 0.0, 10.0)];
    let (r, log) = run("best-fit", cluster(1, 8), &jobs, SimConfig::replay(1));
    assert_eq!((r.completed, r.rejected), (1, 1));
    let reason = log
        .iter()
        .find_map(|e| match &e.what {
            LogKind::Reject(why) => Some(why.clone()),
            _ => None,
        })
        .unwrap();
    assert!(reason.contains("no node can hold"), "{reason}");
}

#[test]
fn node_failures_requeue_jobs_and_every_job_still_finishes() {
    let jobs: Vec<Job> = (0..20)
        .map(|i| job(i, 2, i as f64 * 50.0, 20_000.0))
        .collect();
    let mut config = SimConfig::replay(7);
    config.failures = Some(FailureModel {
        mtbf_s: 30_000.0,
        repair_s: 3_000.0,
    });
    let (r, log) = run("topo-pack", cluster(4, 8), &jobs, config.clone());
    assert_eq!(r.completed, 20);
    assert!(r.failures > 0, "failures happen at this MTBF");
    assert!(log.iter().any(|e| e.what == LogKind::Fail));
    let (again, _) = run("topo-pack", cluster(4, 8), &jobs, config);
    assert_eq!(r.failures, again.failures, "failures are seeded");
}

#[test]
fn failures_too_frequent_for_any_job_to_finish_stop_the_replay_with_an_error() {
    // A failure per node every 36 s on average, against jobs that take 60 s to restart.
    let jobs: Vec<Job> = (0..4).map(|i| job(i, 8, 0.0, 20_000.0)).collect();
    let mut config = SimConfig::replay(7);
    config.failures = Some(FailureModel {
        mtbf_s: 36.0,
        repair_s: 36.0,
    });
    let p = policies::build("topo-pack", &jobs).unwrap();
    let err = run_replay(&p, cluster(4, 8), &jobs, "test", &config)
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("killed running jobs") && err.contains("cannot finish"),
        "{err}"
    );
}

#[test]
fn failure_times_under_a_second_or_beyond_a_trace_are_refused_before_the_replay() {
    // 1e-15 h used to make the replay spin for ever: a node came back and failed again
    // at the same instant, so nothing was ever placed or killed.
    for (mtbf_s, repair_s, what) in [
        (3.6e-12, 3_600.0, "failure MTBF"),
        (0.5, 3_600.0, "failure MTBF"),
        (3_600.0, f64::MAX, "failure repair time"),
        (3_600.0, 1e13, "failure repair time"),
    ] {
        let mut config = SimConfig::replay(7);
        config.failures = Some(FailureModel { mtbf_s, repair_s });
        let err = config.validate().unwrap_err().to_string();
        assert!(err.contains(what) && err.contains("between 1 s"), "{err}");
    }
    let mut config = SimConfig::replay(7);
    config.failures = Some(FailureModel {
        mtbf_s: 1.0,
        repair_s: 1.0,
    });
    assert!(config.validate().is_ok());
}

#[test]
fn co_tenants_on_a_shared_gpu_slow_each_other() {
    let mut a = job(0, 1, 0.0, 1_000.0);
    a.gpu = GpuDemand::Milli(500);
    let mut b = a.clone();
    b.id = JobId(1);
    let (alone, _) = run(
        "best-fit",
        cluster(1, 1),
        std::slice::from_ref(&a),
        SimConfig::replay(1),
    );
    let (shared, _) = run("best-fit", cluster(1, 1), &[a, b], SimConfig::replay(1));
    assert_eq!(alone.jct_mean_s, Some(1_000.0));
    // Both share the GPU the whole time at 90 % speed.
    assert!(
        (shared.jct_mean_s.unwrap() - 1_000.0 / 0.9).abs() < 1e-6,
        "{:?}",
        shared.jct_mean_s
    );
}

#[test]
fn spreading_a_gang_across_nodes_costs_time() {
    let mut gang = Job::whole_gpus(JobId(2), 2, 1.0, 1_000.0);
    gang.checkpoint = job(0, 1, 0.0, 0.0).checkpoint;
    let (packed, _) = run(
        "topo-pack",
        cluster(2, 4),
        std::slice::from_ref(&gang),
        SimConfig::replay(1),
    );
    assert_eq!(packed.jct_mean_s, Some(1_000.0));
    // Two 3-GPU jobs leave one GPU on each node: the 2-GPU gang must cross nodes.
    let jobs = [job(0, 3, 0.0, 1e6), job(1, 3, 0.0, 1e6), gang];
    let (_, log) = run("topo-pack", cluster(2, 4), &jobs, SimConfig::replay(1));
    let finish = log
        .iter()
        .find(|e| e.job == JobId(2) && e.what == LogKind::Finish)
        .unwrap()
        .time;
    assert!(finish - 1.0 > 1_000.0, "spread gang took {}", finish - 1.0);
}

/// Two 8-GPU nodes kept busy by a stream of one-GPU jobs, and an 8-GPU gang that
/// arrives while they run: with backfilling, every GPU that frees up goes to the next
/// small job, so the gang waits for the whole stream; with a reservation, nodes are
/// held for it once it has waited 50 s and it starts as soon as one node drains.
fn starving_gang() -> Vec<Job> {
    let mut jobs: Vec<Job> = (0..16)
        .map(|k| job(k, 1, 0.0, 100.0 + 10.0 * k as f64))
        .collect();
    jobs.push(job(16, 8, 1.0, 100.0));
    jobs.extend((17..217).map(|k| job(k, 1, 2.0, 100.0)));
    jobs
}

#[test]
fn a_reservation_stops_small_jobs_from_starving_a_waiting_gang() {
    let jobs = starving_gang();
    let (starved, without) = run("best-fit", cluster(2, 8), &jobs, SimConfig::replay(1));
    let late = start_time(&without, 16);
    assert!(starved.queue_max_s.unwrap() >= late - 1.0);
    assert!(
        late > 1_000.0,
        "the gang was not starved: started at {late}"
    );

    let mut policy = policies::build("best-fit", &jobs).unwrap();
    policy.reservation = Some(ReservationConfig {
        after_wait_s: 50.0,
        min_gpus: 8,
        max_share: 1.0,
    });
    let (r, with) =
        run_replay(&policy, cluster(2, 8), &jobs, "test", &SimConfig::replay(1)).unwrap();
    let early = start_time(&with, 16);
    // Node 0 holds the 8 shortest of the first wave (100..170 s); it drains by 170 s.
    assert!(
        early <= 260.0,
        "the gang started at {early} despite the reservation"
    );
    assert_eq!(r.completed, jobs.len() as u64);
    assert!(r.queue_max_s.unwrap() < starved.queue_max_s.unwrap());
    // Nothing small was started on the held node while it drained: the gang's node
    // ran only the first wave before it.
    let gang_node = with
        .iter()
        .find_map(|e| match &e.what {
            LogKind::Start(p) if e.job == JobId(16) => Some(p.workers[0].node),
            _ => None,
        })
        .unwrap();
    let small_on_gang_node_before = with.iter().any(|e| {
        e.job.0 >= 17
            && e.time < early
            && matches!(&e.what, LogKind::Start(p) if p.workers[0].node == gang_node)
    });
    assert!(!small_on_gang_node_before);
}

#[test]
fn no_reservation_is_made_before_the_wait_threshold_or_for_small_jobs() {
    let jobs = starving_gang();
    let mut policy = policies::build("best-fit", &jobs).unwrap();
    // The gang is below min_gpus: nothing is held and it starves as without.
    policy.reservation = Some(ReservationConfig {
        after_wait_s: 50.0,
        min_gpus: 16,
        max_share: 1.0,
    });
    let (_, log) =
        run_replay(&policy, cluster(2, 8), &jobs, "test", &SimConfig::replay(1)).unwrap();
    assert!(start_time(&log, 16) > 1_000.0);
    // A threshold longer than the whole stream: the same.
    policy.reservation = Some(ReservationConfig {
        after_wait_s: 1e6,
        min_gpus: 8,
        max_share: 1.0,
    });
    let (_, log) =
        run_replay(&policy, cluster(2, 8), &jobs, "test", &SimConfig::replay(1)).unwrap();
    assert!(start_time(&log, 16) > 1_000.0);
}
