//! How far can one step of rollout planning take FGD on openb's `default` inflation
//! experiment? The learned policy's expert iteration imitates exactly this planner (its
//! rollout labels), so the planner's result bounds what that training can reach with the
//! same candidates, futures and horizon (README, "Learned placement policy", "The rollout
//! planner's ceiling").
//!
//! At every arrival whose arrived load lies in `[FROM, TO)` % and that has at least two
//! candidates (the learned placer's: FGD's choice, FGD's and best fit's best nodes), each
//! candidate is applied to a copy of the simulator and continued with FGD on `FUTURES`
//! futures of `HORIZON` arrivals resampled from the trace (never the episode's own
//! arrivals, which an online scheduler cannot know); the candidate after which the least
//! GPU capacity fails to fit, summed over the futures, is taken (FGD's on ties). Every
//! other arrival is placed by FGD. Reported per seed: FGD's and the planner's unallocated
//! GPUs at 100 % arrived load, the decisions planned and how many left FGD's choice.
//!
//! With `CANDIDATES` = `wide` (default `learned`), a one-worker task also gets candidates
//! far from FGD's and best fit's rankings: for every class of place it could go — for a
//! share, (GPU model, the GPU's free capacity, the node's idle GPUs); for whole GPUs,
//! (GPU model, the node's idle GPUs, its partly used GPUs, its free CPU in 8-core steps) —
//! the first node of the episode's node order in that class, tightest classes first, up
//! to `WIDE` (default 24) more candidates: the learned placer's wide candidate set
//! (`candidates::class_firsts`) without its limit of 16 candidates in all.
//!
//! With `CANDIDATES` = `decline`, a share (a fraction of one GPU) also gets the choice
//! of not being placed at all, which counts its GPU fraction as failed at once (in the
//! inflation experiment nothing leaves, so a declined task never runs): whether keeping
//! capacity free pays, judged by the same rollouts.
//!
//! `cargo run --release -p marshal-trainer --example rollout_ceiling -- FIRST SEEDS FROM TO FUTURES HORIZON [THREADS [CANDIDATES [WIDE]]]`

use std::sync::Arc;
use std::time::Instant;

use marshal_scheduler::domain::{
    ClusterState, GpuDemand, Job, Placement, Topology, WorkerPlacement,
};
use marshal_scheduler::framework::{Context, feasible_nodes};
use marshal_scheduler::policies::learned::candidates::class_firsts;
use marshal_scheduler::policies::learned::{Choice, Gate, LearnedPlacer};
use marshal_scheduler::policies::{self, Fgd};
use marshal_scheduler::sim::{ArrivalCurve, InflationRun, SimConfig, run_inflation};
use marshal_trainer::policy::{best_of, resample, rollout_failures};
use rand::SeedableRng;
use rand_chacha::ChaCha8Rng;

fn arg<T: std::str::FromStr>(args: &[String], i: usize, name: &str) -> T {
    args.get(i).and_then(|s| s.parse().ok()).unwrap_or_else(|| {
        panic!("argument {i} ({name}) missing or malformed; see the module docs")
    })
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let first: u64 = arg(&args, 1, "FIRST");
    let seeds: u64 = arg(&args, 2, "SEEDS");
    let from: f64 = arg(&args, 3, "FROM");
    let to: f64 = arg(&args, 4, "TO");
    let futures: usize = arg(&args, 5, "FUTURES");
    let horizon: usize = arg(&args, 6, "HORIZON");
    let threads: usize = args.get(7).map_or(1, |s| s.parse().expect("THREADS"));
    let candidates = args.get(8).map_or("learned", String::as_str);
    let wide = match candidates {
        "learned" | "decline" => 0,
        "wide" => args.get(9).map_or(24, |s| s.parse().expect("WIDE")),
        other => panic!("CANDIDATES must be `learned`, `wide` or `decline`, not {other:?}"),
    };
    let decline = candidates == "decline";
    let spec = marshal_datasets::cluster_preset("openb").expect("openb preset");
    let topo = Arc::new(Topology::build(&spec).expect("openb topology"));
    let (pods, _) =
        marshal_datasets::load_trace("openb-default", &topo.catalog).expect("openb-default");
    let fgd = policies::build("fgd", &pods).expect("fgd");
    let planner = LearnedPlacer::new(
        policies::build("fgd", &pods).expect("fgd").placer,
        &pods,
        Err("rollout planner: candidates only".into()),
        Gate {
            margin_threshold: 0.0,
            distance_limit: f32::INFINITY,
        },
    );
    // FGD's GPU choice for the whole-GPU classes, from the trace's target workload.
    let classes = Fgd::from_workload(&pods);
    let gpus = topo.gpu_count() as f64;
    println!("seed\tfgd\tplanner\tplanned\tchanged\tseconds");
    let (mut sum_fgd, mut sum_plan) = (0.0, 0.0);
    for seed in first..first + seeds {
        let started = Instant::now();
        let config = SimConfig::inflation(seed);
        let (reference, _) =
            run_inflation(&fgd, topo.clone(), &pods, "openb-default", &config).expect("fgd run");
        let mut run = InflationRun::new(topo.clone(), &pods, &config).expect("episode");
        let capacity = run.state().capacity_milli() as f64;
        let mut curve = ArrivalCurve::default();
        let (mut planned, mut changed) = (0u64, 0u64);
        while run.arrived_pct() < 100.5 && run.next_task().is_some() {
            let pct = run.arrived_pct();
            let decision = if (from..to).contains(&pct) {
                let pos = run.position();
                let mut probe = run.clone();
                probe
                    .with_next(|job, state, ctx| {
                        let fb = planner.fallback_place(job, state, ctx);
                        let (mut choices, _) = planner.decision(job, state, ctx, &fb)?;
                        if wide > 0 {
                            add_wide(job, state, ctx, &classes, wide, &mut choices);
                        }
                        let share = matches!(job.gpu, GpuDemand::Milli(_));
                        if decline && share && !choices.iter().any(|c| matches!(c, Choice::Wait)) {
                            choices.push(Choice::Wait);
                        }
                        Some((choices, ()))
                    })
                    .flatten()
                    .filter(|(choices, _)| choices.len() >= 2)
                    .map(|(choices, _)| {
                        let mut failed = vec![0u64; choices.len()];
                        let mut rng = ChaCha8Rng::seed_from_u64(seed << 32 | pos as u64);
                        for _ in 0..futures {
                            let future = resample(&run.tasks()[pos], &pods, horizon, &mut rng);
                            let end = future.len();
                            let alt = run.with_future(future);
                            let f = rollout_failures(
                                &alt,
                                &choices,
                                fgd.placer.as_ref(),
                                100.5,
                                end,
                                threads,
                            );
                            for (s, f) in failed.iter_mut().zip(f) {
                                *s += f;
                            }
                        }
                        let fallback = choices
                            .iter()
                            .position(|c| matches!(c, Choice::Place { fallback: true, .. }))
                            .unwrap_or(0);
                        let best = best_of(&failed, fallback);
                        (choices, best, fallback)
                    })
            } else {
                None
            };
            match decision {
                Some((choices, best, fallback)) => {
                    planned += 1;
                    changed += u64::from(best != fallback);
                    let placement = match &choices[best] {
                        Choice::Place { placement, .. } => Some(placement),
                        Choice::Wait => None,
                    };
                    run.apply(placement);
                }
                None => {
                    run.step(fgd.placer.as_ref());
                }
            }
            curve.points.push((
                run.arrived_pct(),
                run.state().allocated_milli() as f64 / capacity * 100.0,
            ));
        }
        let at_100 = |c: &ArrivalCurve| gpus * (1.0 - c.alloc_at(100).unwrap_or(f64::NAN) / 100.0);
        let fgd_left = reference.unallocated_gpus_at_100.unwrap_or(f64::NAN);
        let plan_left = at_100(&curve);
        sum_fgd += fgd_left;
        sum_plan += plan_left;
        println!(
            "{seed}\t{fgd_left:.1}\t{plan_left:.1}\t{planned}\t{changed}\t{:.0}",
            started.elapsed().as_secs_f64()
        );
    }
    let n = seeds as f64;
    println!("mean\t{:.1}\t{:.1}", sum_fgd / n, sum_plan / n);
}

/// Up to `limit` more one-worker candidates, one per class of place (the learned
/// placer's wide set, without its slot limit), tightest first.
fn add_wide(
    job: &Job,
    state: &mut ClusterState,
    ctx: &mut Context,
    fgd: &Fgd,
    limit: usize,
    choices: &mut Vec<Choice>,
) {
    if job.workers != 1 {
        return;
    }
    let nodes = feasible_nodes(job, state, ctx);
    let mut added = 0;
    for (node, gpus) in class_firsts(job, state, ctx, fgd, &nodes, usize::MAX) {
        if added == limit {
            break;
        }
        let placement = Placement {
            workers: vec![WorkerPlacement { node, gpus }],
        };
        let known = choices
            .iter()
            .any(|c| matches!(c, Choice::Place { placement: p, .. } if *p == placement));
        if !known {
            choices.push(Choice::Place {
                placement,
                fallback: false,
            });
            added += 1;
        }
    }
}
