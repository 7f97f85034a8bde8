//! Where the unallocated GPUs of openb's `default` inflation experiment come from, and
//! what placement could save (README, "Learned placement policy", "How far below FGD
//! can placement go on openb?"). Three studies, each over seeds `FIRST..FIRST+SEEDS`:
//!
//! * `failures POLICY FIRST SEEDS [TRACE]` (POLICY: a heuristic, `reserve-…` or
//!   `learned[-sumsq][-nonet]`, the artifact in `$MODEL`, by default
//!   `models/policy-default`): every task that fails before 100 % arrived
//!   load, by shape (a task a `reserve-…` rule declined is listed as declined), and where
//!   the free GPUs sit at 100 % by their node's free CPU;
//! * `bound SEED`: how well the shares that arrive before 100 % could be packed offline
//!   (first-fit decreasing; CPU, nodes and GPU models ignored), all of them or leaving
//!   the largest out;
//! * `variants FIRST SEEDS [NAME|all] [TRACE]`: unallocated GPUs at 100 % for FGD and
//!   for FGD with its ties broken by the sum-of-squares rule of online bin packing
//!   (`fgd-sumsq`), with ablations of that rule (alone, weighted, per node or per GPU
//!   only), on `openb-default` or another openb pod list (`openb-gpushare40`, … from the
//!   traces directory); NAME `learned[-sumsq][-nonet]` (not in `all`) is the shipped
//!   learned policy behind FGD or `fgd-sumsq`, with the gate closed for `-nonet`
//!   (only the decline head learned); NAME `reserve-M-T` (not in `all`) is FGD declining shares of at
//!   least M milli that would open an idle GPU once T of the capacity is allocated
//!   (`reserve-model-M-T`: T of its GPU model's capacity; `reserve-free-M-T`: only shares
//!   that accept any model; `reserve-press-W-M-T`: only while a whole-GPU task that the
//!   GPU's model could serve failed within the last W arrivals; `reserve-fore-R`: while
//!   the whole-GPU demand the workload's mix forecasts before 100 % is at least R times
//!   the idle GPUs of the share's model that could serve it, `reserve-foreall-R`: of the
//!   cluster, `reserve-foreallcpu-R`: that, and only while the GPU's node has the cores
//!   of a whole-GPU task of the workload's mean CPU per GPU; `reserve-foreallwide-K-R` /
//!   `reserve-foreallnarrow-K-R`: only while the GPU's node has at least / at most K
//!   idle GPUs); any `fore…` rule takes `+OPTION`s (`+sumsq`: on `fgd-sumsq`, not FGD;
//!   `+slope=K`, `+cpuslope=K`, `+usable`, `+keep=M`, `+at=M:R`, `+sumsqfrom=P`, `+spare`: see
//!   `ForecastRule`).
//!
//! `cargo run -p marshal-scheduler --example inflation_study -- bound 42`

use std::collections::BTreeMap;
use std::path::Path;
use std::sync::Arc;

use marshal_scheduler::domain::{
    ClusterState, GpuDemand, GpuShare, Job, NodeId, Placement, Topology,
};
use marshal_scheduler::framework::{
    Context, NodeScorer, Placer, Policy, ScoredPlacer, Status, TieBreak,
};
use marshal_scheduler::policies::learned::decline::{
    MAX_WHOLE_GPU_PRESSURE, WorkloadMix, whole_gpu_pressure,
};
use marshal_scheduler::policies::learned::{LearnedPlacer, LearnedSetup};
use marshal_scheduler::policies::{self, Fgd, SumOfSquares};
use marshal_scheduler::sim::{InflationRun, SimConfig, run_inflation};

fn gpu_room(job: &Job, state: &ClusterState, node: NodeId) -> bool {
    let topo_node = state.topology().node(node);
    if !topo_node.model.is_some_and(|m| job.gpu_models.allows(m)) && job.gpu != GpuDemand::None {
        return false;
    }
    match job.gpu {
        GpuDemand::None => true,
        GpuDemand::Whole(n) => {
            topo_node
                .gpu_ids()
                .filter(|&g| state.free_milli(g) == 1000)
                .count()
                >= n as usize
        }
        GpuDemand::Milli(m) => topo_node.gpu_ids().any(|g| state.free_milli(g) >= m),
        GpuDemand::Mig { .. } => false,
    }
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    if args.get(1).map(String::as_str) == Some("bound") {
        return bound(args[2].parse().unwrap());
    }
    if args.get(1).map(String::as_str) == Some("variants") {
        return variants(&args[2..]);
    }
    assert_eq!(
        args.get(1).map(String::as_str),
        Some("failures"),
        "usage: inflation_study failures|bound|variants …"
    );
    let policy_name = args.get(2).map_or("fgd", String::as_str);
    let first: u64 = args.get(3).map_or(42, |s| s.parse().unwrap());
    let seeds: u64 = args.get(4).map_or(1, |s| s.parse().unwrap());
    let spec = marshal_datasets::cluster_preset("openb").unwrap();
    let topo = Arc::new(Topology::build(&spec).unwrap());
    let trace = args.get(5).map_or("openb-default", String::as_str);
    let (pods, _) = marshal_datasets::load_trace(trace, &topo.catalog).unwrap();
    let policy = match policy_name.strip_prefix("reserve-") {
        Some(params) => reserve(&pods, params, policy_name),
        None if policy_name.starts_with("learned") => learned(&pods, policy_name),
        None => policies::build(policy_name, &pods).unwrap(),
    };
    // (shape, reason) → (count, milli)
    let mut failures: BTreeMap<(String, &str), (u64, u64)> = BTreeMap::new();
    let mut total_failed = 0u64;
    for seed in first..first + seeds {
        let mut run = InflationRun::new(topo.clone(), &pods, &SimConfig::inflation(seed)).unwrap();
        while run.arrived_pct() < 100.0 {
            let Some(task) = run.next_task().cloned() else {
                break;
            };
            let answer = run
                .with_next(|task, state, ctx| policy.placer.place(task, state, ctx))
                .unwrap();
            let declined = matches!(answer, Err(Status::Deferred(_)));
            let placed = run.apply(answer.ok().as_ref()).unwrap();
            if placed {
                continue;
            }
            let state = run.state();
            let nodes: Vec<_> = state.topology().node_ids().collect();
            let gpu_ok = nodes.iter().any(|&n| gpu_room(&task, state, n));
            let cpu_ok = nodes
                .iter()
                .any(|&n| state.node_cpu_free(n) >= task.cpu_milli);
            let reason = match (gpu_ok, cpu_ok) {
                _ if declined => "declined",
                (false, _) => "no GPU room",
                (true, false) => "no CPU room",
                (true, true) => "GPU and CPU apart",
            };
            let models: Vec<String> = task
                .gpu_models
                .ids()
                .map(|m| state.topology().catalog.get(m).name.clone())
                .collect();
            let shape = format!(
                "{:?} cpu {} models {}",
                task.gpu,
                task.cpu_milli,
                if task.gpu_models.is_any() {
                    "any".into()
                } else {
                    models.join("|")
                }
            );
            let e = failures.entry((shape, reason)).or_default();
            e.0 += 1;
            e.1 += task.gpu_milli();
            total_failed += task.gpu_milli();
        }
    }
    let mut rows: Vec<_> = failures.into_iter().collect();
    // Where the free GPUs of the first seed's state sit at 100 %, by their node's free CPU.
    {
        let mut run = InflationRun::new(topo.clone(), &pods, &SimConfig::inflation(first)).unwrap();
        while run.arrived_pct() < 100.0 && run.step(policy.placer.as_ref()).is_some() {}
        let state = run.state();
        let mut buckets: BTreeMap<u32, (f64, u32, f64)> = BTreeMap::new();
        for n in state.topology().node_ids() {
            let free: u32 = state
                .topology()
                .node(n)
                .gpu_ids()
                .map(|g| state.free_milli(g) as u32)
                .sum();
            let whole = state
                .topology()
                .node(n)
                .gpu_ids()
                .filter(|&g| state.free_milli(g) == 1000)
                .count() as f64;
            let cores = state.node_cpu_free(n) / 1000;
            let key = match cores {
                0..2 => 0,
                2..4 => 2,
                4..8 => 4,
                8..12 => 8,
                12..16 => 12,
                16..32 => 16,
                _ => 32,
            };
            let e = buckets.entry(key).or_default();
            e.0 += free as f64 / 1000.0;
            e.1 += 1;
            e.2 += whole;
        }
        println!("seed {first} at 100 %: free GPUs by the node's free cores (>=)");
        for (k, (gpus, nodes, whole)) in buckets {
            println!("  >= {k:>2} cores: {gpus:7.1} GPUs free ({whole:.0} whole) on {nodes} nodes");
        }
    }
    {
        let (mut cpu, mut gpu) = (0f64, 0f64);
        for p in &pods {
            cpu += p.cpu_milli as f64 * p.workers as f64;
            gpu += p.gpu_milli() as f64;
        }
        let cap_cpu: f64 = topo.node_ids().map(|n| topo.node(n).cpu_milli as f64).sum();
        println!(
            "trace: {:.2} cores per GPU requested; cluster: {:.2} cores per GPU",
            cpu / gpu,
            cap_cpu / topo.gpu_count() as f64 / 1000.0
        );
    }
    rows.sort_by_key(|(_, (_, milli))| std::cmp::Reverse(*milli));
    println!(
        "{policy_name}: failed GPU milli before 100 % per seed: {:.0}",
        total_failed as f64 / seeds as f64
    );
    for ((shape, reason), (count, milli)) in rows.iter().take(30) {
        println!(
            "{:>8.1} GPUs {:>6.1} tasks  {reason:<18} {shape}",
            *milli as f64 / 1000.0 / seeds as f64,
            *count as f64 / seeds as f64
        );
    }
}

fn scored<S: NodeScorer + 'static>(scorer: S, name: &str) -> Policy {
    policy_of(Box::new(ScoredPlacer::new(scorer, TieBreak::First)), name)
}

fn policy_of(placer: Box<dyn Placer>, name: &str) -> Policy {
    let mut p = policies::build("fgd", &[]).unwrap();
    p.placer = placer;
    p.name = name.into();
    p
}

fn variants(args: &[String]) {
    let first: u64 = args.first().map_or(42, |s| s.parse().unwrap());
    let seeds: u64 = args.get(1).map_or(3, |s| s.parse().unwrap());
    let only: Option<&str> = args.get(2).map(String::as_str).filter(|&o| o != "all");
    let trace = args.get(3).map_or("openb-default", String::as_str);
    let spec = marshal_datasets::cluster_preset("openb").unwrap();
    let topo = Arc::new(Topology::build(&spec).unwrap());
    let (pods, _) = marshal_datasets::load_trace(trace, &topo.catalog).unwrap();
    let fgd = || Fgd::from_workload(&pods);
    let rule = |weight, per_model| SumOfSquares {
        inner: fgd(),
        weight,
        per_model,
        spare_idle_nodes: false,
    };
    let mut candidates: Vec<Policy> = vec![
        policies::build("fgd", &pods).unwrap(),
        scored(rule(1e-5, true), "fgd-sumsq"),
        policy_of(
            Box::new(ScoredPlacer::new(fgd(), TieBreak::Random)),
            "fgd-random-ties",
        ),
        scored(rule(1000.0, true), "sumsq-then-fgd"),
        scored(rule(1000.0, false), "sumsq-all-models-then-fgd"),
        scored(
            OneChoice {
                rule: rule(1e-5, true),
                on_node: false,
            },
            "fgd-sumsq-gpu-only",
        ),
        scored(
            OneChoice {
                rule: rule(1e-5, true),
                on_node: true,
            },
            "fgd-sumsq-node-only",
        ),
    ];
    // `reserve-M-T`: FGD declining shares of at least M milli that would open an idle GPU
    // once T of the capacity is allocated.
    // `reserve-model-M-T`: the same, with T the allocated share of the GPU model the
    // share would go to.
    if let Some(name) = only.filter(|o| o.starts_with("reserve-")) {
        candidates.push(reserve(&pods, name.trim_start_matches("reserve-"), name));
    }
    if let Some(name) = only.filter(|o| o.starts_with("learned")) {
        candidates.push(learned(&pods, name));
    }
    for w in [0.003, 0.01, 0.03, 0.1, 0.3] {
        candidates.push(scored(rule(w, true), &format!("fgd+{w}sumsq")));
        candidates.push(scored(rule(w, false), &format!("fgd+{w}sumsq-all-models")));
    }
    for policy in candidates {
        if only.is_some_and(|o| o != policy.name) {
            continue;
        }
        let values: Vec<f64> = (first..first + seeds)
            .map(|seed| {
                run_inflation(
                    &policy,
                    topo.clone(),
                    &pods,
                    "openb",
                    &SimConfig::inflation(seed),
                )
                .unwrap()
                .0
                .unallocated_gpus_at_100
                .unwrap()
            })
            .collect();
        let mean = values.iter().sum::<f64>() / values.len() as f64;
        println!("{:<16} {mean:7.1}  {values:.0?}", policy.name);
    }
}

/// `fgd-sumsq` (FGD with its ties broken by the per-model sum-of-squares rule) as a
/// placer; `spare_idle_nodes`: see [`SumOfSquares`].
fn fgd_sumsq(pods: &[Job], spare_idle_nodes: bool) -> Box<dyn Placer> {
    Box::new(ScoredPlacer::new(
        SumOfSquares {
            inner: Fgd::from_workload(pods),
            weight: 1e-5,
            per_model: true,
            spare_idle_nodes,
        },
        TieBreak::First,
    ))
}

/// `learned[-sumsq][-nonet]`: the model in `$MODEL` (default `models/policy-default`;
/// network and decline head) behind FGD or `fgd-sumsq` as its fallback; `-nonet`: the
/// gate closed, so the fallback ranks and only the decline head is learned.
fn learned(pods: &[Job], name: &str) -> Policy {
    let (sumsq, nonet) = match name {
        "learned" => (false, false),
        "learned-sumsq" => (true, false),
        "learned-nonet" => (false, true),
        "learned-sumsq-nonet" => (true, true),
        _ => panic!("{name}: learned, learned-sumsq, learned-nonet or learned-sumsq-nonet"),
    };
    let dir = std::env::var("MODEL").unwrap_or_else(|_| "models/policy-default".into());
    let mut setup = LearnedSetup::load(Path::new(&dir), None, "inflation");
    for warning in [&setup.gate_warning, &setup.decline_warning] {
        assert!(warning.is_none(), "{warning:?}");
    }
    assert!(setup.decline.is_some(), "{dir} has no decline head");
    if nonet {
        setup.gate.margin_threshold = f32::INFINITY;
    }
    let fallback = if sumsq {
        fgd_sumsq(pods, false)
    } else {
        policies::build("fgd", pods).unwrap().placer
    };
    let placer = LearnedPlacer::new(fallback, pods, setup.model.scorer.clone(), setup.gate)
        .with_candidates(setup.model.candidates)
        .with_decline(setup.decline.clone(), pods);
    policy_of(Box::new(placer), name)
}

/// `reserve-[model-|free-|press-W-]M-T`, `reserve-fore[all|allcpu]-R`,
/// `reserve-foreall[wide|narrow]-K-R`, each with optional `+OPTION`s (see
/// [`ForecastRule`]), as a policy named `name` (`params`: without the `reserve-`).
fn reserve(pods: &[Job], params: &str, name: &str) -> Policy {
    if let Some(forecast) = ForecastRule::parse(params) {
        return policy_of(Box::new(forecast.build(pods)), name);
    }
    let per_model = params.starts_with("model-");
    let any_model_only = params.starts_with("free-");
    // `press-W-`: only while a whole-GPU task that this GPU's model could have served
    // failed within the last W arrivals.
    let (window, params) = match params.strip_prefix("press-") {
        Some(rest) => {
            let (w, rest) = rest.split_once('-').expect("press-W-M-T");
            (Some(w.parse::<u64>().expect("W: an integer")), rest)
        }
        None => (None, params),
    };
    let params = params
        .trim_start_matches("model-")
        .trim_start_matches("free-");
    let (min_share, threshold) = params
        .split_once('-')
        .expect("reserve-[model-|free-]MILLI-SHARE, e.g. reserve-1-0.86");
    policy_of(
        Box::new(Reserve {
            inner: policies::build("fgd", pods).unwrap().placer,
            min_share: min_share.parse().expect("MILLI: an integer"),
            threshold: threshold.parse().expect("SHARE: a number"),
            per_model,
            any_model_only,
            window,
            recent: Default::default(),
        }),
        name,
    )
}

/// `inner`, except that a share of at least `min_share` milli that would open an idle
/// GPU is declined once `threshold` of the capacity is allocated: it waits, keeping the
/// GPU whole for a whole-GPU task (in the inflation experiment, where nothing leaves,
/// it counts as failed).
#[derive(Debug)]
struct Reserve {
    inner: Box<dyn Placer>,
    min_share: u16,
    threshold: f64,
    /// The threshold is on the share's GPU model's capacity, not the cluster's.
    per_model: bool,
    /// Only shares that accept every GPU model are declined.
    any_model_only: bool,
    /// Only while a whole-GPU task the share's GPU model could serve failed within this
    /// many calls.
    window: Option<u64>,
    /// (call, models) of whole-GPU tasks that did not fit, and the number of calls.
    recent: std::sync::Mutex<(
        std::collections::VecDeque<(u64, marshal_scheduler::domain::GpuModelSet)>,
        u64,
    )>,
}

impl Reserve {
    /// The allocated share of the capacity the threshold is on, for a share on `gpu`.
    fn allocated(&self, state: &ClusterState, gpu: marshal_scheduler::domain::GpuId) -> f64 {
        if !self.per_model {
            return state.allocated_milli() as f64 / state.capacity_milli() as f64;
        }
        let topo = state.topology();
        let model = topo.gpu(gpu).model;
        let (mut used, mut all) = (0u64, 0u64);
        for (i, g) in topo.gpus().iter().enumerate() {
            if g.model == model {
                let id = marshal_scheduler::domain::GpuId(i as u32);
                used += u64::from(1000 - state.free_milli(id));
                all += 1000;
            }
        }
        used as f64 / all.max(1) as f64
    }
}

impl Placer for Reserve {
    fn place(
        &self,
        job: &Job,
        state: &mut ClusterState,
        ctx: &mut Context,
    ) -> Result<Placement, Status> {
        let answer = self.inner.place(job, state, ctx);
        let pressed = {
            let mut recent = self.recent.lock().unwrap();
            recent.1 += 1;
            let call = recent.1;
            if answer.is_err() && matches!(job.gpu, GpuDemand::Whole(_)) {
                recent.0.push_back((call, job.gpu_models));
            }
            let window = self.window.unwrap_or(u64::MAX);
            while recent.0.front().is_some_and(|&(c, _)| c + window < call) {
                recent.0.pop_front();
            }
            let models: Vec<_> = recent.0.iter().map(|&(_, m)| m).collect();
            move |model| self.window.is_none() || models.iter().any(|m| m.allows(model))
        };
        let placement = answer?;
        if let GpuDemand::Milli(m) = job.gpu
            && m >= self.min_share
            && (!self.any_model_only || job.gpu_models.is_any())
            && let Some(idle) = placement.gpu_ids().find(|&g| state.free_milli(g) == 1000)
            && self.allocated(state, idle) >= self.threshold
            && pressed(state.topology().gpu(idle).model)
        {
            return Err(Status::Deferred("kept whole for a whole-GPU task".into()));
        }
        Ok(placement)
    }
}

/// Shares of a workload's GPU demand held by whole-GPU tasks.
#[derive(Debug)]
struct WholeMix {
    /// Of tasks that accept any GPU model.
    any_model: f64,
    /// Of tasks that ask for given models, and their model sets.
    given: Vec<(marshal_scheduler::domain::GpuModelSet, f64)>,
    /// Mean CPU milli per GPU of whole-GPU tasks.
    cpu_per_gpu: f64,
}

impl WholeMix {
    fn of(pods: &[Job]) -> WholeMix {
        let all: u64 = pods.iter().map(Job::gpu_milli).sum::<u64>().max(1);
        let mut any = 0u64;
        let (mut cpu, mut gpus) = (0f64, 0f64);
        let mut given: BTreeMap<String, (marshal_scheduler::domain::GpuModelSet, u64)> =
            BTreeMap::new();
        for p in pods {
            if let GpuDemand::Whole(n) = p.gpu {
                cpu += p.cpu_milli as f64;
                gpus += f64::from(n);
                if p.gpu_models.is_any() {
                    any += p.gpu_milli();
                } else {
                    given
                        .entry(format!("{:?}", p.gpu_models))
                        .or_insert((p.gpu_models, 0))
                        .1 += p.gpu_milli();
                }
            }
        }
        WholeMix {
            any_model: any as f64 / all as f64,
            given: given
                .into_values()
                .map(|(m, milli)| (m, milli as f64 / all as f64))
                .collect(),
            cpu_per_gpu: cpu / gpus.max(1.0),
        }
    }
}

/// FGD declining a share that would open an idle GPU while the whole-GPU demand still
/// to arrive before 100 % arrived load, as the workload's mix forecasts it, is at least
/// `ratio` times the idle GPUs that could serve it: of the share's GPU model
/// (`per_model`; whole tasks that accept any model counted in proportion to that
/// model's share of the idle GPUs) or of the cluster.
#[derive(Debug, Default)]
struct ForecastRule {
    ratio: f64,
    per_model: bool,
    /// Only while the GPU's node keeps CPU room for a whole-GPU task of the workload's
    /// mean CPU per GPU (`foreallcpu-R`).
    cpu_room: bool,
    /// Only while the GPU's node has at least (`true`) or at most (`false`) this many
    /// idle GPUs, the opened one included.
    node_idle: Option<(usize, bool)>,
    /// `+slope=K`: the ratio rises by K times the GPU a share leaves free (negative:
    /// small shares are declined at a lower pressure).
    share_slope: f64,
    /// `+cpuslope=K`: the ratio rises by K times (1 − the share's CPU per GPU over the
    /// cluster's): CPU-heavy shares are declined at a lower pressure.
    cpu_slope: f64,
    /// `+usable`: idle GPUs count only as far as their node's free cores serve
    /// whole-GPU tasks of the workload's mean CPU per GPU.
    usable_idle: bool,
    /// `+keep=M`: shares of M milli are never declined.
    keep: Option<u16>,
    /// `+at=M:R`: shares of M milli are declined from pressure R (the slopes do not
    /// apply to them).
    at: Vec<(u16, f64)>,
    /// `+sumsq`: places with FGD whose ties the sum-of-squares rule breaks
    /// (`fgd-sumsq`), not FGD.
    sumsq: bool,
    /// `+sumsqfrom=P`: `fgd-sumsq` only while the cluster's pressure is at least P.
    sumsq_from: Option<f64>,
    /// `+spare`: `fgd-sumsq` puts a node whose GPUs are all idle last among ties.
    spare_idle_nodes: bool,
}

impl ForecastRule {
    /// `fore-R`, `foreall-R`, `foreallcpu-R`, `foreall[wide|narrow]-K-R`, each optionally
    /// followed by `+OPTION`s; `None` for other `reserve-` rules.
    fn parse(params: &str) -> Option<ForecastRule> {
        let mut parts = params.split('+');
        let head = parts.next()?;
        let mut rule = ForecastRule::default();
        let ratio = if let Some(ratio) = head.strip_prefix("fore-") {
            rule.per_model = true;
            ratio
        } else if let Some(ratio) = head.strip_prefix("foreallcpu-") {
            rule.cpu_room = true;
            ratio
        } else if let Some((rest, wide)) = head
            .strip_prefix("foreallwide-")
            .map(|r| (r, true))
            .or_else(|| head.strip_prefix("foreallnarrow-").map(|r| (r, false)))
        {
            let (k, ratio) = rest.split_once('-').expect("K-R");
            rule.node_idle = Some((k.parse().expect("K: an integer"), wide));
            ratio
        } else {
            head.strip_prefix("foreall-")?
        };
        rule.ratio = ratio.parse().expect("R: a number");
        for option in parts {
            let (key, value) = option.split_once('=').unwrap_or((option, ""));
            let number = || value.parse::<f64>().expect("+OPTION=a number");
            match key {
                "slope" => rule.share_slope = number(),
                "cpuslope" => rule.cpu_slope = number(),
                "usable" => rule.usable_idle = true,
                "keep" => rule.keep = Some(value.parse().expect("keep=MILLI")),
                "at" => {
                    let (m, r) = value.split_once(':').expect("at=MILLI:R");
                    let m = m.parse().expect("at=MILLI:R: MILLI an integer");
                    rule.at
                        .push((m, r.parse().expect("at=MILLI:R: R a number")));
                }
                "sumsq" => rule.sumsq = true,
                "sumsqfrom" => rule.sumsq_from = Some(number()),
                "spare" => rule.spare_idle_nodes = true,
                _ => panic!("unknown option +{option}"),
            }
        }
        assert!(
            !(rule.per_model && rule.usable_idle),
            "+usable counts the cluster's idle GPUs: use it with foreall-R, not fore-R"
        );
        Some(rule)
    }

    fn build(self, pods: &[Job]) -> Forecast {
        let sumsq = || fgd_sumsq(pods, self.spare_idle_nodes);
        let fgd = policies::build("fgd", pods).unwrap().placer;
        Forecast {
            inner: if self.sumsq { sumsq() } else { fgd },
            late: self.sumsq_from.map(|from| (sumsq(), from)),
            mix: WholeMix::of(pods),
            workload: WorkloadMix::of(pods),
            rule: self,
        }
    }
}

#[derive(Debug)]
struct Forecast {
    rule: ForecastRule,
    inner: Box<dyn Placer>,
    /// Places with this placer instead of `inner` from the given pressure on.
    late: Option<(Box<dyn Placer>, f64)>,
    mix: WholeMix,
    workload: WorkloadMix,
}

impl Forecast {
    /// Forecast whole-GPU demand over idle GPUs, for a share that would open `gpu`.
    fn pressure(
        &self,
        state: &ClusterState,
        gpu: marshal_scheduler::domain::GpuId,
        arrived: u64,
    ) -> f64 {
        let remaining = state.capacity_milli().saturating_sub(arrived) as f64 / 1000.0;
        let topo = state.topology();
        if self.rule.usable_idle {
            let whole = f64::from(self.workload.whole_any_model + self.workload.whole_given_models);
            let usable: f64 = topo
                .node_ids()
                .map(|n| {
                    let idle = topo.node(n).gpu_ids().filter(|&g| state.is_idle(g)).count();
                    let by_cpu = state.node_cpu_free(n) as f64 / self.mix.cpu_per_gpu.max(1.0);
                    (idle as f64).min(by_cpu.floor())
                })
                .sum();
            return (remaining * whole / usable.max(1.0)).min(f64::from(MAX_WHOLE_GPU_PRESSURE));
        }
        if !self.rule.per_model {
            // The decline head's input, so that the rule measures what the head sees.
            return f64::from(whole_gpu_pressure(state, Some(arrived), self.workload));
        }
        let model = topo.gpu(gpu).model;
        let (mut idle_model, mut idle_all) = (0f64, 0f64);
        for (i, g) in topo.gpus().iter().enumerate() {
            if state.is_idle(marshal_scheduler::domain::GpuId(i as u32)) {
                idle_all += 1.0;
                if g.model == model {
                    idle_model += 1.0;
                }
            }
        }
        let named: f64 = self
            .mix
            .given
            .iter()
            .filter(|(m, _)| m.allows(model))
            .map(|&(m, share)| share / m.ids().count().max(1) as f64)
            .sum();
        let demand = remaining * (self.mix.any_model * idle_model / idle_all.max(1.0) + named);
        demand / idle_model.max(1.0)
    }

    /// The pressure at which `job`, a share, is declined.
    fn threshold(&self, job: &Job, state: &ClusterState) -> f64 {
        if let Some(&(_, r)) = self
            .rule
            .at
            .iter()
            .find(|(m, _)| *m == job.gpu.milli() as u16)
        {
            return r;
        }
        let share = job.gpu.milli() as f64 / 1000.0;
        let mut threshold = self.rule.ratio + self.rule.share_slope * (1.0 - share);
        if self.rule.cpu_slope != 0.0 {
            let topo = state.topology();
            let cluster_cpu: f64 = topo.node_ids().map(|n| topo.node(n).cpu_milli as f64).sum();
            let per_gpu = cluster_cpu / topo.gpu_count().max(1) as f64;
            let cpu_ratio = job.cpu_milli as f64 / share.max(1e-3) / per_gpu.max(1.0);
            threshold += self.rule.cpu_slope * (1.0 - cpu_ratio);
        }
        threshold
    }

    /// Whether the opened `idle` GPU's node passes the rule's node conditions.
    fn node_allows(&self, state: &ClusterState, idle: marshal_scheduler::domain::GpuId) -> bool {
        let node = state.topology().gpu(idle).node;
        let cpu_ok =
            !self.rule.cpu_room || state.node_cpu_free(node) as f64 >= self.mix.cpu_per_gpu;
        cpu_ok
            && self.rule.node_idle.is_none_or(|(k, wide)| {
                let n = state
                    .topology()
                    .node(node)
                    .gpu_ids()
                    .filter(|&g| state.is_idle(g))
                    .count();
                if wide { n >= k } else { n <= k }
            })
    }
}

impl Placer for Forecast {
    fn place(
        &self,
        job: &Job,
        state: &mut ClusterState,
        ctx: &mut Context,
    ) -> Result<Placement, Status> {
        let arrived = ctx
            .arrived_milli
            .expect("the study runs inflation episodes, which pass the arrived load");
        let inner = match &self.late {
            Some((late, from))
                if f64::from(whole_gpu_pressure(state, Some(arrived), self.workload)) >= *from =>
            {
                late
            }
            _ => &self.inner,
        };
        let placement = inner.place(job, state, ctx)?;
        if let GpuDemand::Milli(milli) = job.gpu
            && self.rule.keep != Some(milli)
            && let Some(idle) = placement.gpu_ids().find(|&g| state.free_milli(g) == 1000)
            && self.pressure(state, idle, arrived) >= self.threshold(job, state)
            && self.node_allows(state, idle)
        {
            return Err(Status::Deferred(
                "kept whole for forecast whole-GPU demand".into(),
            ));
        }
        Ok(placement)
    }
}

/// The rule for one of the two choices only: the node (`on_node`, the GPU inside it is
/// `T`'s choice) or the GPU inside `T`'s chosen node.
#[derive(Debug)]
struct OneChoice<T> {
    rule: SumOfSquares<T>,
    on_node: bool,
}

impl<T: NodeScorer> OneChoice<T> {
    /// Who ranks the nodes and who picks the GPUs inside the chosen one.
    fn roles(&self) -> (&dyn NodeScorer, &dyn NodeScorer) {
        if self.on_node {
            (&self.rule, &self.rule.inner)
        } else {
            (&self.rule.inner, &self.rule)
        }
    }
}

impl<T: NodeScorer> NodeScorer for OneChoice<T> {
    fn score(&self, job: &Job, node: NodeId, state: &ClusterState, ctx: &mut Context) -> f64 {
        self.roles().0.score(job, node, state, ctx)
    }

    fn score_nodes(
        &self,
        job: &Job,
        nodes: &[NodeId],
        state: &ClusterState,
        ctx: &mut Context,
        scores: &mut Vec<f64>,
    ) {
        self.roles().0.score_nodes(job, nodes, state, ctx, scores)
    }

    fn pick_gpus(
        &self,
        job: &Job,
        node: NodeId,
        state: &ClusterState,
        ctx: &mut Context,
    ) -> Option<Vec<GpuShare>> {
        self.roles().1.pick_gpus(job, node, state, ctx)
    }
}

/// Packs `shares` (milli) first-fit decreasing; returns the GPUs used and their slivers
/// (GPUs).
fn ffd(shares: &[u32]) -> (usize, f64) {
    let mut sorted = shares.to_vec();
    sorted.sort_unstable_by(|a, b| b.cmp(a));
    let mut bins: Vec<u32> = Vec::new();
    for s in &sorted {
        match bins.iter_mut().find(|b| **b + s <= 1000) {
            Some(b) => *b += s,
            None => bins.push(*s),
        }
    }
    let used: u64 = shares.iter().map(|&s| s as u64).sum();
    (bins.len(), bins.len() as f64 - used as f64 / 1000.0)
}

/// Offline first-fit-decreasing packing of the shares that arrive before 100 %, against
/// what FGD leaves: the sliver waste no placement order avoids (ignoring CPU, nodes and
/// GPU models, which only add to it).
fn bound(seed: u64) {
    let spec = marshal_datasets::cluster_preset("openb").unwrap();
    let topo = Arc::new(Topology::build(&spec).unwrap());
    let (pods, _) = marshal_datasets::load_trace("openb-default", &topo.catalog).unwrap();
    let mut run = InflationRun::new(topo.clone(), &pods, &SimConfig::inflation(seed)).unwrap();
    let gpus = topo.gpu_count() as u64;
    let mut shares: Vec<u32> = Vec::new();
    let mut whole = 0u64;
    let mut hist: BTreeMap<u32, u32> = BTreeMap::new();
    let mut arrived = 0u64;
    for t in run.tasks() {
        if arrived >= gpus * 1000 {
            break;
        }
        arrived += t.gpu_milli();
        match t.gpu {
            GpuDemand::Milli(m) => {
                shares.push(m as u32);
                *hist.entry(m as u32).or_default() += 1;
            }
            GpuDemand::Whole(n) => whole += n as u64 * t.workers as u64,
            _ => {}
        }
    }
    let (bins, slivers) = ffd(&shares);
    let requested: f64 = shares.iter().map(|&s| s as f64).sum::<f64>() / 1000.0;
    println!(
        "seed {seed}: {} shares ({requested:.1} GPUs) need {bins} GPUs by FFD, {slivers:.1} of \
         them slivers; with {whole} whole GPUs requested, {} GPUs in all",
        shares.len(),
        gpus
    );
    // Offline a task could also be left out: leave the k largest shares out, pack the
    // rest by FFD and give the whole-GPU tasks what is left.
    let mut sorted = shares.clone();
    sorted.sort_unstable_by(|a, b| b.cmp(a));
    let mut best = (f64::INFINITY, 0usize);
    for k in (0..sorted.len()).step_by(5) {
        let (bins, _) = ffd(&sorted[k..]);
        if bins as u64 > gpus {
            continue;
        }
        let placed: f64 = sorted[k..].iter().map(|&s| s as f64).sum::<f64>() / 1000.0;
        let unallocated = gpus as f64 - placed - whole.min(gpus - bins as u64) as f64;
        if unallocated < best.0 {
            best = (unallocated, k);
        }
    }
    println!(
        "seed {seed}: offline, leaving the {} largest shares out: {:.1} GPUs unallocated",
        best.1, best.0
    );
    // What FGD does with the same arrivals.
    let policy = policies::build("fgd", &pods).unwrap();
    let mut placed_shares = Vec::new();
    while run.arrived_pct() < 100.0 {
        let Some(task) = run.next_task().cloned() else {
            break;
        };
        if run.step(policy.placer.as_ref()) == Some(true)
            && let GpuDemand::Milli(m) = task.gpu
        {
            placed_shares.push(m as u32);
        }
    }
    let state = run.state();
    let (mut idle, mut fgd_slivers) = (0u32, 0f64);
    for n in state.topology().node_ids() {
        for g in state.topology().node(n).gpu_ids() {
            match state.free_milli(g) {
                1000 => idle += 1,
                free => fgd_slivers += free as f64 / 1000.0,
            }
        }
    }
    let (_, packed) = ffd(&placed_shares);
    println!(
        "seed {seed}: fgd leaves {:.1} GPUs: {fgd_slivers:.1} of slivers and {idle} idle GPUs; \
         its {} placed shares packed by FFD would leave {packed:.1} of slivers",
        fgd_slivers + idle as f64,
        placed_shares.len()
    );
    let mut top: Vec<_> = hist.into_iter().collect();
    top.sort_by_key(|&(_, c)| std::cmp::Reverse(c));
    println!(
        "most common shares (milli, count): {:?}",
        &top[..top.len().min(12)]
    );
}
