//! Rebalancing (`framework::rebalance`) in the replay simulator: running jobs migrate so
//! that a gang blocked only by fragmentation starts, all or nothing. Consolidation
//! (`framework::consolidate`): a running gang moves onto a tighter placement when the
//! predicted gain exceeds the cost.

mod common;

use common::{cluster, job, start_time};
use marshal_scheduler::domain::{Checkpointing, Job, JobId};
use marshal_scheduler::framework::{ConsolidateConfig, RebalanceConfig, RemainingEstimate};
use marshal_scheduler::policies;
use marshal_scheduler::sim::{LogEntry, LogKind, SimConfig, SimResult, run_replay};

const LONG: f64 = 100_000.0;

/// Two 8-GPU nodes each left with four long one-GPU jobs on every other GPU (the short
/// ones between them end at 100 s), and an 8-GPU gang (one worker) arriving at 200 s:
/// 8 GPUs are idle, but no node has 8.
fn fragmented() -> Vec<Job> {
    let mut jobs: Vec<Job> = (0..16)
        .map(|k| job(k, 1, 0.0, if k % 2 == 0 { LONG } else { 100.0 }))
        .collect();
    jobs.push(job(16, 8, 200.0, 1_000.0));
    jobs
}

fn run(jobs: &[Job], rebalance: Option<RebalanceConfig>) -> (SimResult, Vec<LogEntry>) {
    let mut policy = policies::build("best-fit", jobs).unwrap();
    policy.rebalance = rebalance;
    run_replay(&policy, cluster(2, 8), jobs, "test", &SimConfig::replay(1)).unwrap()
}

fn config(after_wait_s: f64, min_runtime_s: f64) -> RebalanceConfig {
    RebalanceConfig {
        after_wait_s,
        max_moves: 4,
        min_runtime_s,
        max_lost_s: None,
    }
}

fn gang_node(log: &[LogEntry]) -> u32 {
    log.iter()
        .find_map(|e| match &e.what {
            LogKind::Start(p) if e.job == JobId(16) => Some(p.workers[0].node.0),
            _ => None,
        })
        .unwrap()
}

#[test]
fn without_rebalancing_the_gang_waits_for_the_long_jobs() {
    let jobs = fragmented();
    let (r, log) = run(&jobs, None);
    assert!(start_time(&log, 16) >= LONG, "{}", start_time(&log, 16));
    assert_eq!(r.migrations, 0);
    assert!(!log.iter().any(|e| e.what == LogKind::Migrate));
}

#[test]
fn four_small_jobs_move_to_the_other_node_and_the_gang_starts_at_once() {
    let jobs = fragmented();
    let (r, log) = run(&jobs, Some(config(0.0, 0.0)));
    assert_eq!(start_time(&log, 16), 200.0, "started in its arrival cycle");
    assert_eq!(r.migrations, 4);
    assert_eq!(r.preemptions, 0);
    assert_eq!(r.completed, jobs.len() as u64);
    let gang = gang_node(&log);
    let moved: Vec<&LogEntry> = log.iter().filter(|e| e.what == LogKind::Migrate).collect();
    assert_eq!(moved.len(), 4);
    for m in &moved {
        assert_eq!(m.time, 200.0);
        // Each was long and on the gang's node, and starts again on the other one.
        assert_eq!(m.job.0 % 2, 0);
        let restart = log
            .iter()
            .filter(|e| e.job == m.job && e.time == 200.0)
            .find_map(|e| match &e.what {
                LogKind::Start(p) => Some(p.workers[0].node.0),
                _ => None,
            })
            .expect("started again at once");
        assert_ne!(restart, gang);
    }
    // Each lost the 200 s it ran since it started (no checkpoint yet), on one GPU.
    assert!(
        (r.lost_gpu_s - 4.0 * 200.0).abs() < 1e-6,
        "{}",
        r.lost_gpu_s
    );
    // The jobs that stayed are untouched: nobody else was stopped.
    assert_eq!(log.iter().filter(|e| e.what == LogKind::Preempt).count(), 0);
    // Same seed, same schedule.
    let (_, again) = run(&jobs, Some(config(0.0, 0.0)));
    assert_eq!(log, again);
}

#[test]
fn a_gang_is_served_when_its_wait_reaches_the_threshold_even_if_nothing_else_happens() {
    let jobs = fragmented();
    let (r, log) = run(&jobs, Some(config(60.0, 0.0)));
    assert_eq!(start_time(&log, 16), 260.0);
    assert_eq!(r.migrations, 4);
    // Jobs that have not run `min_runtime_s` in their placement stay: the gang is
    // served when the protection of the running jobs (started at 0) ends.
    let (r, log) = run(&jobs, Some(config(0.0, 500.0)));
    assert_eq!(start_time(&log, 16), 500.0);
    assert_eq!(r.migrations, 4);
}

#[test]
fn non_preemptible_jobs_never_move() {
    let mut jobs = fragmented();
    for j in &mut jobs[..16] {
        j.preemptible = false;
    }
    let (r, log) = run(&jobs, Some(config(0.0, 0.0)));
    assert_eq!(r.migrations, 0);
    assert!(start_time(&log, 16) >= LONG);
    assert_eq!(r.completed, jobs.len() as u64);
}

#[test]
fn moves_that_cannot_all_fit_are_not_made_at_all() {
    // The long jobs need so much memory that a node holds only four of them: those on
    // one node have nowhere to go, so nothing moves (no partial migration).
    let mut jobs = fragmented();
    for j in jobs[..16].iter_mut().filter(|j| j.id.0 % 2 == 0) {
        j.memory_mib = 60_000;
    }
    let (r, log) = run(&jobs, Some(config(0.0, 0.0)));
    assert_eq!(r.migrations, 0);
    assert!(!log.iter().any(|e| e.what == LogKind::Migrate));
    assert!(start_time(&log, 16) >= LONG);
    assert_eq!(r.completed, jobs.len() as u64);

    // Four moves are needed; three are allowed: nothing moves either.
    let jobs = fragmented();
    let (r, log) = run(
        &jobs,
        Some(RebalanceConfig {
            max_moves: 3,
            ..config(0.0, 0.0)
        }),
    );
    assert_eq!(r.migrations, 0);
    assert!(start_time(&log, 16) >= LONG);
}

#[test]
fn a_larger_job_may_move_for_a_larger_gang_but_not_one_that_would_lose_too_much() {
    // A 4-GPU job per node leaves 4 + 4 idle GPUs; the 8-GPU gang cannot fit. Moving
    // one 4-GPU job (smaller than the gang) makes room.
    let jobs = vec![
        job(0, 4, 0.0, LONG),
        job(1, 4, 0.0, 100.0),
        job(2, 4, 0.0, LONG),
        job(3, 4, 0.0, 100.0),
        job(4, 8, 200.0, 1_000.0),
    ];
    let (r, log) = run(&jobs, Some(config(0.0, 0.0)));
    assert_eq!(r.migrations, 1);
    assert_eq!(start_time(&log, 4), 200.0);
    // It has run 200 s since its last checkpoint: with `max_lost_s` below that it stays.
    let (r, log) = run(
        &jobs,
        Some(RebalanceConfig {
            max_lost_s: Some(150.0),
            ..config(0.0, 0.0)
        }),
    );
    assert_eq!(r.migrations, 0);
    assert!(start_time(&log, 4) >= LONG);
    // A job that checkpoints when stopped loses nothing, so it may move again.
    let mut saving = jobs.clone();
    for j in &mut saving {
        j.checkpoint.on_preempt = true;
    }
    let (r, _) = run(
        &saving,
        Some(RebalanceConfig {
            max_lost_s: Some(150.0),
            ..config(0.0, 0.0)
        }),
    );
    assert_eq!(r.migrations, 1);
    assert_eq!(r.lost_gpu_s, 0.0);
}

/// Two 8-GPU nodes in one rack: a 6-GPU job on each (the one on node 0 ends at 5,000 s,
/// the other runs long), and a data-parallel gang of four one-GPU workers arriving at
/// 1 s that can only be spread, two GPUs per node (rack level). From 5,000 s node 0 could
/// hold it. The gang checkpoints when stopped (a move loses no work) and pays `restart_s`
/// on each start.
fn spread_gang(work: f64, restart_s: f64) -> Vec<Job> {
    let mut gang = Job::whole_gpus(JobId(2), 4, 1.0, work);
    gang.checkpoint = Checkpointing {
        interval_s: 1e9,
        cost_s: 0.0,
        restart_s,
        on_preempt: true,
    };
    vec![job(0, 6, 0.0, 5_000.0), job(1, 6, 0.0, LONG), gang]
}

fn consolidating(protect_s: f64) -> ConsolidateConfig {
    ConsolidateConfig {
        interval_s: 600.0,
        safety_factor: 2.0,
        max_moves: 2,
        protect_s,
        remaining: RemainingEstimate::Elapsed,
    }
}

fn run_consolidating(
    jobs: &[Job],
    consolidate: Option<ConsolidateConfig>,
) -> (SimResult, Vec<LogEntry>) {
    let mut policy = policies::build("best-fit", jobs).unwrap();
    policy.consolidate = consolidate;
    run_replay(&policy, cluster(2, 8), jobs, "test", &SimConfig::replay(7)).unwrap()
}

/// The gang's placements, in order, as (time, nodes it spans).
fn gang_starts(log: &[LogEntry]) -> Vec<(f64, Vec<u32>)> {
    log.iter()
        .filter(|e| e.job == JobId(2))
        .filter_map(|e| match &e.what {
            LogKind::Start(p) => {
                let mut nodes: Vec<u32> = p.workers.iter().map(|w| w.node.0).collect();
                nodes.sort_unstable();
                nodes.dedup();
                Some((e.time, nodes))
            }
            _ => None,
        })
        .collect()
}

fn finish_time(log: &[LogEntry], id: u32) -> f64 {
    log.iter()
        .find(|e| e.job == JobId(id) && e.what == LogKind::Finish)
        .map(|e| e.time)
        .expect("finished")
}

#[test]
fn a_spread_gang_moves_onto_the_node_that_frees_up_and_finishes_sooner() {
    let jobs = spread_gang(100_000.0, 60.0);
    let (r, log) = run_consolidating(&jobs, None);
    assert_eq!(r.migrations, 0);
    assert_eq!(
        gang_starts(&log),
        vec![(1.0, vec![0, 1])],
        "spread over both nodes"
    );
    let spread_finish = finish_time(&log, 2);

    let (r, log) = run_consolidating(&jobs, Some(consolidating(1_000.0)));
    // When the 6-GPU job on node 0 ends, the gang (run 4,999 s: the estimate of what
    // is left; rack → NVLink speeds it up by 13 %, ~640 s > 2 × 60 s) moves there,
    // once: it is then as tight as the cluster allows.
    assert_eq!(
        gang_starts(&log),
        vec![(1.0, vec![0, 1]), (5_000.0, vec![0])]
    );
    assert_eq!(r.migrations, 1);
    assert_eq!(r.preemptions, 0);
    assert_eq!(r.lost_gpu_s, 0.0, "it checkpoints when stopped");
    assert_eq!(r.completed, jobs.len() as u64);
    let moved = log
        .iter()
        .find(|e| e.what == LogKind::Migrate)
        .expect("a migration is logged");
    assert_eq!((moved.job, moved.time), (JobId(2), 5_000.0));
    let tight_finish = finish_time(&log, 2);
    assert!(
        tight_finish < spread_finish - 10_000.0,
        "{tight_finish} vs {spread_finish}"
    );
    // Same seed, same schedule.
    let (_, again) = run_consolidating(&jobs, Some(consolidating(1_000.0)));
    assert_eq!(log, again);
}

#[test]
fn a_gang_with_too_little_time_left_stays_spread() {
    // Restarting costs 400 s, so the move needs a predicted gain above 800 s: the gang
    // must have run ~6,240 s for the elapsed-time estimate to promise it. This one
    // finishes at ~6,140 s, before that: it is never moved.
    let jobs = spread_gang(5_000.0, 400.0);
    let (r, log) = run_consolidating(&jobs, Some(consolidating(1_000.0)));
    assert_eq!(r.migrations, 0);
    assert_eq!(gang_starts(&log).len(), 1);
    assert!(finish_time(&log, 2) < 6_240.0, "{}", finish_time(&log, 2));

    // A long one is moved as soon as a periodic pass finds the gain large enough:
    // not when node 0 frees up (641 s < 800 s), but at a later wake-up with no other
    // event, after it has run ~6,240 s.
    let jobs = spread_gang(100_000.0, 400.0);
    let (r, log) = run_consolidating(&jobs, Some(consolidating(1_000.0)));
    assert_eq!(r.migrations, 1);
    let starts = gang_starts(&log);
    assert_eq!(starts.len(), 2);
    assert!(
        starts[1].0 > 6_240.0 && starts[1].0 < 6_240.0 + 600.0,
        "{:?}",
        starts
    );
    assert_eq!(starts[1].1, vec![0]);

    // The oracle knows the true remaining work: a gang with about 2,000 s left at
    // 5,000 s (250–290 s to gain) is not moved for a 400 s restart (800 s with the
    // safety factor), and is for a 60 s one (120 s).
    let oracle = ConsolidateConfig {
        remaining: RemainingEstimate::Oracle,
        ..consolidating(1_000.0)
    };
    let (r, _) = run_consolidating(&spread_gang(6_000.0, 400.0), Some(oracle));
    assert_eq!(r.migrations, 0);
    let (r, log) = run_consolidating(&spread_gang(6_000.0, 60.0), Some(oracle));
    assert_eq!(r.migrations, 1);
    assert_eq!(gang_starts(&log)[1].0, 5_000.0);
}

#[test]
fn a_gang_is_not_moved_within_its_protection_window() {
    // Started at 1 s and protected for 10,000 s: node 0 frees up at 5,000 s, but the
    // gang moves only when its protection ends (a wake-up with no other event).
    let jobs = spread_gang(100_000.0, 60.0);
    let (r, log) = run_consolidating(&jobs, Some(consolidating(10_000.0)));
    assert_eq!(r.migrations, 1);
    assert_eq!(
        gang_starts(&log),
        vec![(1.0, vec![0, 1]), (10_001.0, vec![0])]
    );
    // A move is a restart: the window starts again, and the gang (already as tight as
    // possible) is never moved a second time, however many passes run.
    let (r, _) = run_consolidating(
        &jobs,
        Some(ConsolidateConfig {
            interval_s: 1.0,
            ..consolidating(0.0)
        }),
    );
    assert_eq!(r.migrations, 1);
}

#[test]
fn non_preemptible_gangs_are_not_consolidated() {
    let mut jobs = spread_gang(100_000.0, 60.0);
    jobs[2].preemptible = false;
    let (r, log) = run_consolidating(&jobs, Some(consolidating(1_000.0)));
    assert_eq!(r.migrations, 0);
    assert_eq!(gang_starts(&log).len(), 1);
}
