//! DESIGN.md's invariants, property-tested for every policy: no GPU, MIG slice or share
//! is allocated beyond capacity; gangs are placed whole; hard constraints hold; the same
//! seed gives the same schedule.

use std::collections::HashMap;
use std::sync::Arc;

use marshal_scheduler::domain::{
    ClusterSpec, GpuDemand, GpuModelSet, Job, JobId, MigLayoutSpec, MigMode, NodeGroupSpec,
    Topology,
};
use marshal_scheduler::framework::Policy;
use marshal_scheduler::policies::{self, POLICY_NAMES};
use marshal_scheduler::sim::{
    FailureModel, LogEntry, LogKind, SimConfig, run_inflation, run_replay,
};
use proptest::prelude::*;

const MODELS: [&str; 3] = ["T4", "V100M32", "A100-40"];

/// The fixed MIG instances of MIG mode 3: of the MIG sizes drawn below, 7g.40gb has no
/// instance here and 1g.5gb two.
const LAYOUT: [&str; 4] = ["3g.20gb", "2g.10gb", "1g.5gb", "1g.5gb"];

/// Node groups: (count, GPUs per node, model index, MIG modes). MIG modes: 0 left open,
/// 1 every GPU out of MIG mode, 2 the odd-numbered GPUs in MIG mode (on A100s; models
/// without MIG are always out of it), 3 as 2 with [`LAYOUT`] made on them.
fn gpu_groups_strategy() -> impl Strategy<Value = Vec<(u32, u16, usize, u8)>> {
    prop::collection::vec(
        (
            1u32..4,
            prop::sample::select(vec![1u16, 2, 4, 8]),
            0usize..3,
            0u8..4,
        ),
        1..4,
    )
}

/// The GPU node groups, then `cpu_nodes` CPU-only nodes.
fn topology(groups: Vec<(u32, u16, usize, u8)>, cpu_nodes: u32) -> Arc<Topology> {
    let node = |count, gpu_model: Option<&str>, gpus: u16| NodeGroupSpec {
        count,
        name_prefix: None,
        names: vec![],
        gpu_model: gpu_model.map(Into::into),
        gpus,
        nvlink_domain: if gpus >= 4 { gpus / 2 } else { 0 },
        cpu_milli: 32_000,
        memory_mib: 131_072,
        mig_gpus: None,
        mig_layout: Vec::new(),
    };
    let mut node_groups: Vec<NodeGroupSpec> = groups
        .into_iter()
        .map(|(count, gpus, model, mig)| {
            let odd: Vec<u16> = (1..gpus).step_by(2).collect();
            let a100 = MODELS[model] == "A100-40";
            NodeGroupSpec {
                mig_gpus: match mig {
                    0 => None,
                    2 | 3 if a100 => Some(odd.clone()),
                    _ => Some(vec![]),
                },
                mig_layout: match mig {
                    3 if a100 && !odd.is_empty() => vec![MigLayoutSpec {
                        gpus: odd,
                        instances: LAYOUT.map(String::from).to_vec(),
                    }],
                    _ => Vec::new(),
                },
                ..node(count, Some(MODELS[model]), gpus)
            }
        })
        .collect();
    if cpu_nodes > 0 {
        node_groups.push(node(cpu_nodes, None, 0));
    }
    let spec = ClusterSpec {
        name: "prop".into(),
        nodes_per_rack: 2,
        racks_per_spine: 2,
        links: Default::default(),
        gpu_models: vec![],
        node_groups,
    };
    Arc::new(Topology::build(&spec).expect("valid spec"))
}

fn cluster_strategy() -> impl Strategy<Value = Arc<Topology>> {
    gpu_groups_strategy().prop_map(|groups| topology(groups, 0))
}

/// GPU nodes and one to three CPU-only nodes.
fn mixed_cluster_strategy() -> impl Strategy<Value = Arc<Topology>> {
    (gpu_groups_strategy(), 1u32..4).prop_map(|(groups, cpu)| topology(groups, cpu))
}

fn demand_strategy() -> impl Strategy<Value = GpuDemand> {
    prop_oneof![
        Just(GpuDemand::None),
        (1u16..5).prop_map(GpuDemand::Whole),
        (1u16..1000).prop_map(GpuDemand::Milli),
        prop::sample::select(vec![(1u8, 1u8), (2, 2), (3, 4), (7, 8)])
            .prop_map(|(compute, memory)| GpuDemand::Mig { compute, memory }),
    ]
}

fn jobs_strategy() -> impl Strategy<Value = Vec<Job>> {
    prop::collection::vec(
        (
            1u32..4,
            demand_strategy(),
            0u32..20_000,
            // Up to most of a node's 128 GiB, so that memory, not only CPU, can bind.
            0u64..100_000,
            0.0f64..5_000.0,
            1.0f64..20_000.0,
            0usize..4,
            -1i32..2,
            any::<bool>(),
        ),
        1..25,
    )
    .prop_map(|specs| {
        specs
            .into_iter()
            .enumerate()
            .map(
                |(i, (workers, gpu, cpu, memory, submit, work, model, priority, preemptible))| {
                    let mut job = Job::whole_gpus(JobId(i as u32), workers, submit, work);
                    job.workers = workers;
                    job.gpu = gpu;
                    job.cpu_milli = cpu;
                    job.memory_mib = memory;
                    job.priority = priority;
                    job.preemptible = preemptible;
                    job.checkpoint.interval_s = 600.0;
                    // Model constraints are resolved against the default catalog, which every
                    // test cluster uses.
                    if model < 3 {
                        let catalog = marshal_scheduler::domain::GpuCatalog::default();
                        job.gpu_models = GpuModelSet::of([catalog.id(MODELS[model]).unwrap()]);
                    }
                    job
                },
            )
            .collect()
    })
}

/// Replays the log against an independent ledger of capacity and checks every start.
fn check_log(topo: &Topology, jobs: &[Job], log: &[LogEntry]) -> Result<(), String> {
    let by_id: HashMap<JobId, &Job> = jobs.iter().map(|j| (j.id, j)).collect();
    let mut gpu_milli = vec![0u32; topo.gpu_count() as usize];
    let mut gpu_mig = vec![(0u32, 0u32); topo.gpu_count() as usize];
    // Fixed MIG instances held, by GPU and size.
    let mut instances_held: HashMap<(usize, u8, u8), usize> = HashMap::new();
    // Milli held by whole and shared workers: never beside a MIG instance.
    let mut gpu_plain_milli = vec![0u32; topo.gpu_count() as usize];
    let mut node_cpu = vec![0u64; topo.nodes().len()];
    let mut node_mem = vec![0u64; topo.nodes().len()];
    let mut live: HashMap<JobId, marshal_scheduler::domain::Placement> = HashMap::new();
    for entry in log {
        let job = by_id[&entry.job];
        match &entry.what {
            LogKind::Start(p) => {
                if p.workers.len() != job.workers as usize {
                    return Err(format!(
                        "job {:?}: {} of {} workers placed",
                        job.id,
                        p.workers.len(),
                        job.workers
                    ));
                }
                for w in &p.workers {
                    let node = topo.node(w.node);
                    if w.gpus.len() != job.gpu.gpu_count() as usize {
                        return Err(format!("job {:?}: wrong GPU count on a worker", job.id));
                    }
                    node_cpu[w.node.0 as usize] += job.cpu_milli as u64;
                    node_mem[w.node.0 as usize] += job.memory_mib;
                    if node_cpu[w.node.0 as usize] > node.cpu_milli as u64
                        || node_mem[w.node.0 as usize] > node.memory_mib
                    {
                        return Err(format!("node {} over CPU or memory", w.node.0));
                    }
                    for s in &w.gpus {
                        if topo.gpu(s.gpu).node != w.node {
                            return Err("GPU not on the worker's node".into());
                        }
                        if !job.gpu_models.allows(topo.gpu(s.gpu).model) {
                            return Err(format!("job {:?} on a disallowed model", job.id));
                        }
                        let is_mig = s.mig_compute > 0;
                        match topo.gpu(s.gpu).mig {
                            MigMode::On if !is_mig => {
                                return Err(format!(
                                    "job {:?}: a non-MIG share on a MIG-mode GPU",
                                    job.id
                                ));
                            }
                            MigMode::Off if is_mig => {
                                return Err(format!(
                                    "job {:?}: a MIG instance on a GPU out of MIG mode",
                                    job.id
                                ));
                            }
                            _ => {}
                        }
                        let g = s.gpu.0 as usize;
                        gpu_milli[g] += s.milli as u32;
                        gpu_mig[g].0 += s.mig_compute as u32;
                        gpu_mig[g].1 += s.mig_memory as u32;
                        if !is_mig {
                            gpu_plain_milli[g] += s.milli as u32;
                        }
                        if gpu_milli[g] > 1000 || gpu_mig[g].0 > 7 || gpu_mig[g].1 > 8 {
                            return Err(format!("GPU {g} over capacity"));
                        }
                        if let Some(fixed) = topo.gpu_mig_instances(s.gpu) {
                            let size = (s.mig_compute, s.mig_memory);
                            let made = fixed.iter().filter(|i| (i.compute, i.memory) == size);
                            let held = instances_held.entry((g, size.0, size.1)).or_default();
                            *held += 1;
                            if *held > made.count() {
                                return Err(format!(
                                    "GPU {g}: {held} MIG instances of {size:?} held, fewer made"
                                ));
                            }
                        }
                        if gpu_mig[g].0 > 0 && gpu_plain_milli[g] > 0 {
                            return Err(format!(
                                "GPU {g}: a MIG instance beside a shared or whole worker"
                            ));
                        }
                    }
                }
                if live.insert(job.id, p.clone()).is_some() {
                    return Err(format!("job {:?} started twice", job.id));
                }
            }
            LogKind::Preempt | LogKind::Migrate | LogKind::Fail | LogKind::Finish => {
                let p = live
                    .remove(&job.id)
                    .ok_or_else(|| format!("job {:?} stopped but not running", job.id))?;
                for w in &p.workers {
                    node_cpu[w.node.0 as usize] -= job.cpu_milli as u64;
                    node_mem[w.node.0 as usize] -= job.memory_mib;
                    for s in &w.gpus {
                        let g = s.gpu.0 as usize;
                        gpu_milli[g] -= s.milli as u32;
                        gpu_mig[g].0 -= s.mig_compute as u32;
                        gpu_mig[g].1 -= s.mig_memory as u32;
                        if s.mig_compute == 0 {
                            gpu_plain_milli[g] -= s.milli as u32;
                        }
                        if topo.gpu_mig_instances(s.gpu).is_some() {
                            *instances_held
                                .get_mut(&(g, s.mig_compute, s.mig_memory))
                                .expect("held at its start") -= 1;
                        }
                    }
                }
            }
            LogKind::Reject(_) => {}
        }
    }
    if !live.is_empty() {
        return Err(format!("{} jobs never finished", live.len()));
    }
    Ok(())
}

/// Replays `jobs` under `policy` twice: every job ends, no placement fails with an error,
/// the log passes [`check_log`], and the same seed gives the same schedule.
fn replay_keeps_the_invariants(
    policy: &Policy,
    name: &str,
    topo: &Arc<Topology>,
    jobs: &[Job],
    config: &SimConfig,
) -> Result<(), TestCaseError> {
    let (result, log) = run_replay(policy, topo.clone(), jobs, "prop", config).unwrap();
    prop_assert_eq!(
        result.completed + result.rejected,
        jobs.len() as u64,
        "{}: every job ends",
        name
    );
    prop_assert_eq!(
        result.placement_errors,
        0,
        "{}: a placement failed with an error",
        name
    );
    if let Err(e) = check_log(topo, jobs, &log) {
        prop_assert!(false, "{}: {}", name, e);
    }
    let (_, again) = run_replay(policy, topo.clone(), jobs, "prop", config).unwrap();
    prop_assert_eq!(&log, &again, "{}: same seed, same schedule", name);
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 24, .. ProptestConfig::default() })]

    #[test]
    fn every_policy_keeps_the_invariants_in_replay(topo in cluster_strategy(), jobs in jobs_strategy(), seed in 0u64..1000, failures in any::<bool>()) {
        for name in POLICY_NAMES {
            let policy = policies::build(name, &jobs).unwrap();
            let mut config = SimConfig::replay(seed);
            if failures {
                config.failures = Some(FailureModel { mtbf_s: 20_000.0, repair_s: 2_000.0 });
            }
            replay_keeps_the_invariants(&policy, name, &topo, &jobs, &config)?;
        }
    }

    #[test]
    fn every_policy_keeps_allocation_within_capacity_in_inflation(topo in cluster_strategy(), jobs in jobs_strategy(), seed in 0u64..1000) {
        for name in POLICY_NAMES {
            let policy = policies::build(name, &jobs).unwrap();
            let (result, curve) = run_inflation(&policy, topo.clone(), &jobs, "prop", &SimConfig::inflation(seed)).unwrap();
            prop_assert!(result.gpu_alloc_pct <= 100.0 + 1e-9);
            for (arrived, alloc) in curve.points {
                prop_assert!(alloc <= arrived + 1e-9, "{}: allocated more than arrived", name);
            }
        }
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 24, .. ProptestConfig::default() })]

    /// With rebalancing on (moving eagerly), migrations keep every invariant too.
    #[test]
    fn rebalancing_keeps_the_invariants_in_replay(topo in cluster_strategy(), jobs in jobs_strategy(), seed in 0u64..1000) {
        for name in POLICY_NAMES {
            let mut policy = policies::build(name, &jobs).unwrap();
            policy.rebalance = Some(marshal_scheduler::framework::RebalanceConfig {
                after_wait_s: 0.0,
                max_moves: 4,
                min_runtime_s: 0.0,
                max_lost_s: None,
            });
            let config = SimConfig::replay(seed);
            replay_keeps_the_invariants(&policy, name, &topo, &jobs, &config)?;
        }
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 24, .. ProptestConfig::default() })]

    /// With consolidation on (eagerly: no protection, the smallest safety factor, the
    /// oracle's remaining time), moving running gangs keeps every invariant too, also
    /// beside eager reservations (held nodes are marked down during the cycle).
    #[test]
    fn consolidation_keeps_the_invariants_in_replay(topo in cluster_strategy(), jobs in jobs_strategy(), seed in 0u64..1000) {
        for name in POLICY_NAMES {
            let mut policy = policies::build(name, &jobs).unwrap();
            policy.consolidate = Some(marshal_scheduler::framework::ConsolidateConfig {
                interval_s: 60.0,
                safety_factor: 1.0,
                max_moves: 4,
                protect_s: 0.0,
                remaining: marshal_scheduler::framework::RemainingEstimate::Oracle,
            });
            if seed % 2 == 0 {
                policy.reservation = Some(marshal_scheduler::framework::ReservationConfig {
                    after_wait_s: 0.0,
                    min_gpus: 2,
                    max_share: 1.0,
                });
            }
            let config = SimConfig::replay(seed);
            replay_keeps_the_invariants(&policy, name, &topo, &jobs, &config)?;
        }
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 24, .. ProptestConfig::default() })]

    /// Showing placers only the CPU-only nodes for CPU-only jobs (and the whole cluster
    /// when those are full) keeps every invariant, with node failures too.
    #[test]
    fn cpu_nodes_first_keeps_the_invariants_in_replay(topo in mixed_cluster_strategy(), jobs in jobs_strategy(), seed in 0u64..1000, failures in any::<bool>()) {
        for name in POLICY_NAMES {
            let policy = policies::build(name, &jobs).unwrap().with_cpu_nodes_first();
            let mut config = SimConfig::replay(seed);
            if failures {
                config.failures = Some(FailureModel { mtbf_s: 20_000.0, repair_s: 2_000.0 });
            }
            replay_keeps_the_invariants(&policy, name, &topo, &jobs, &config)?;
        }
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 24, .. ProptestConfig::default() })]

    /// With per-tenant quotas, no start ever takes a tenant's running jobs beyond its
    /// limits, every other invariant holds, and every job still ends (run, or refused
    /// when it alone asks more than its tenant's limit).
    #[test]
    fn quotas_hold_at_every_start(topo in cluster_strategy(), jobs in jobs_strategy(), seed in 0u64..1000) {
        let tenants = ["a", "b", "c"];
        let jobs: Vec<Job> = jobs
            .into_iter()
            .enumerate()
            .map(|(i, j)| Job { tenant: tenants[i % 3].into(), ..j })
            .collect();
        let quota: marshal_scheduler::framework::QuotaConfig = toml::from_str(
            "[tenants.a]\ngpus = 2\n[tenants.b]\ngpus = 4\ncpu_cores = 12\n",
        )
        .unwrap();
        let limit = |tenant: &str| match tenant {
            "a" => (Some(2_000u64), None),
            "b" => (Some(4_000), Some(12_000u64)),
            _ => (None, None),
        };
        for name in POLICY_NAMES {
            let mut policy = policies::build(name, &jobs).unwrap();
            policy.quota = Some(quota.clone());
            let config = SimConfig::replay(seed);
            replay_keeps_the_invariants(&policy, name, &topo, &jobs, &config)?;
            let (_, log) = run_replay(&policy, topo.clone(), &jobs, "prop", &config).unwrap();
            let by_id: HashMap<JobId, &Job> = jobs.iter().map(|j| (j.id, j)).collect();
            let mut held: HashMap<&str, (u64, u64)> = HashMap::new();
            for entry in &log {
                let job = by_id[&entry.job];
                let demand = (
                    u64::from(job.workers) * u64::from(job.gpu.milli()),
                    u64::from(job.workers) * u64::from(job.cpu_milli),
                );
                let h = held.entry(job.tenant.as_str()).or_default();
                match &entry.what {
                    LogKind::Start(_) => {
                        h.0 += demand.0;
                        h.1 += demand.1;
                        let (gpus, cpus) = limit(&job.tenant);
                        prop_assert!(gpus.is_none_or(|l| h.0 <= l), "{}: tenant {} holds {} GPU milli", name, job.tenant, h.0);
                        prop_assert!(cpus.is_none_or(|l| h.1 <= l), "{}: tenant {} holds {} CPU milli", name, job.tenant, h.1);
                    }
                    LogKind::Preempt | LogKind::Migrate | LogKind::Fail | LogKind::Finish => {
                        h.0 -= demand.0;
                        h.1 -= demand.1;
                    }
                    LogKind::Reject(_) => {}
                }
            }
        }
    }
}
