//! The FGD experiment ("inflation"): tasks arrive and never leave until the GPUs they
//! request reach a multiple of cluster capacity; the measure is how much of the cluster
//! a policy manages to allocate at each arrived load.
//!
//! Faithful to the published simulator (hkust-adsl/kubernetes-scheduler-simulator,
//! `Simulate` and `tuneUpPods`): the trace's tasks arrive first, in a seeded random
//! order; then tasks drawn uniformly with replacement from the trace are appended until
//! the next draw's per-GPU request would push the total past the target (the original
//! compares the per-GPU, not the total, request; kept for fidelity). A task that does not
//! fit fails and is not retried; its request still counts as arrived. The allocation at
//! an arrived load of `x` % is the mean allocation over the tasks whose arrival brought
//! the load to `x` % after rounding, as in the published analysis scripts.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Instant;

use rand::Rng;
use rand::seq::SliceRandom;
use rand_chacha::ChaCha8Rng;

use crate::domain::{ClusterState, DomainError, GpuDemand, Job, NodeId, Placement, Topology};
use crate::framework::{Context, Placer, Policy};
use crate::sim::metrics::round_to;
use crate::sim::{Mode, NODE_ORDER_STREAM, POLICY_STREAM, SimConfig, SimResult, WORKLOAD_STREAM};

/// Allocation after each arrival: (arrived %, allocated %) of GPU capacity.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct ArrivalCurve {
    pub points: Vec<(f64, f64)>,
}

impl ArrivalCurve {
    /// Mean allocation % at arrived load `pct`, discretised as the published analysis
    /// does (`merge_alloc_discrete`): points whose arrived % rounds to `pct`, or within
    /// ±1 % when none does.
    pub fn alloc_at(&self, pct: u32) -> Option<f64> {
        let x = pct as f64;
        let pick = |window: f64| -> Vec<f64> {
            self.points
                .iter()
                .filter(|(arrived, _)| (round_to(*arrived, 0) - x).abs() <= window)
                .map(|(_, alloc)| round_to(*alloc, 2))
                .collect()
        };
        let mut values = pick(0.0);
        if values.is_empty() {
            values = pick(1.0);
        }
        crate::sim::metrics::mean(&values).map(|m| round_to(m, 2))
    }
}

/// The order in which tasks arrive: the trace shuffled, then resampled clones.
pub fn inflation_arrivals(
    workload: &[Job],
    capacity_milli: u64,
    max_arrived_pct: f64,
    config: &SimConfig,
) -> Vec<Job> {
    let mut rng = config.rng(WORKLOAD_STREAM);
    let mut tasks: Vec<Job> = workload.to_vec();
    tasks.shuffle(&mut rng);
    // Only GPU requests move the load towards the target; without any, nothing can.
    if workload.iter().all(|j| j.gpu_milli() == 0) {
        return tasks;
    }
    let target = max_arrived_pct / 100.0 * capacity_milli as f64;
    let mut requested: u64 = workload.iter().map(Job::gpu_milli).sum();
    loop {
        let mut task = workload[rng.random_range(0..workload.len())].clone();
        let per_gpu = match task.gpu {
            GpuDemand::Whole(_) => 1000,
            other => other.milli() as u64,
        };
        if (requested + per_gpu) as f64 > target {
            break;
        }
        requested += task.gpu_milli();
        task.name = format!("{}-tuned-{}", task.name, tasks.len());
        task.id = crate::domain::JobId(tasks.len() as u32);
        tasks.push(task);
    }
    tasks
}

/// An FGD-experiment episode that can be advanced one arrival at a time and cloned at
/// any point, so that a continuation can be tried from the same state on the same
/// arrivals (the rollout labeller of the learned policy's training does). Cloning copies
/// the cluster state and the policy stream; the arrivals and node order are shared.
#[derive(Clone, Debug)]
pub struct InflationRun {
    state: ClusterState,
    tasks: Arc<Vec<Job>>,
    node_order: Arc<Vec<NodeId>>,
    rng: ChaCha8Rng,
    next: usize,
    arrived: u64,
    failed_milli: u64,
}

impl InflationRun {
    /// A fresh episode: the arrivals, node order and policy stream of `config`'s seed.
    pub fn new(
        topo: Arc<Topology>,
        workload: &[Job],
        config: &SimConfig,
    ) -> Result<InflationRun, DomainError> {
        config.validate()?;
        let Mode::Inflation { max_arrived_pct } = config.mode else {
            return Err(DomainError::Invalid(
                "an inflation run needs inflation mode".into(),
            ));
        };
        for job in workload {
            job.validate()?;
        }
        let capacity = ClusterState::new(topo.clone()).capacity_milli();
        let tasks = inflation_arrivals(workload, capacity, max_arrived_pct, config);
        InflationRun::from_arrivals(topo, tasks, config)
    }

    /// An episode whose arrivals are exactly `tasks`, in order (the node order and policy
    /// stream still come from `config`'s seed).
    pub fn from_arrivals(
        topo: Arc<Topology>,
        tasks: Vec<Job>,
        config: &SimConfig,
    ) -> Result<InflationRun, DomainError> {
        config.validate()?;
        for job in &tasks {
            job.validate()?;
        }
        let state = ClusterState::new(topo.clone());
        let mut node_order: Vec<NodeId> = topo.node_ids().collect();
        node_order.shuffle(&mut config.rng(NODE_ORDER_STREAM));
        Ok(InflationRun {
            state,
            tasks: Arc::new(tasks),
            node_order: Arc::new(node_order),
            rng: config.rng(POLICY_STREAM),
            next: 0,
            arrived: 0,
            failed_milli: 0,
        })
    }

    /// A copy whose remaining arrivals are `future` instead (its position restarts at 0
    /// of `future`; state, failures and policy stream carry over): a continuation on
    /// another draw of what arrives next.
    pub fn with_future(&self, future: Vec<Job>) -> InflationRun {
        InflationRun {
            tasks: Arc::new(future),
            next: 0,
            ..self.clone()
        }
    }

    /// All arrivals of the episode, in order.
    pub fn tasks(&self) -> &[Job] {
        &self.tasks
    }

    /// Index of the next arrival (= arrivals so far).
    pub fn position(&self) -> usize {
        self.next
    }

    /// The next arrival, if any is left.
    pub fn next_task(&self) -> Option<&Job> {
        self.tasks.get(self.next)
    }

    pub fn state(&self) -> &ClusterState {
        &self.state
    }

    /// GPU capacity requested by the arrivals so far (milli).
    pub fn arrived_milli(&self) -> u64 {
        self.arrived
    }

    /// GPU capacity requested by arrivals that did not fit (milli).
    pub fn failed_milli(&self) -> u64 {
        self.failed_milli
    }

    /// Arrived load in % of capacity.
    pub fn arrived_pct(&self) -> f64 {
        self.arrived as f64 / self.state.capacity_milli().max(1) as f64 * 100.0
    }

    /// Runs `decide` on the next arrival with the episode's state and context (without
    /// advancing), e.g. to ask a placer what it would do. Returns `None` at the end.
    pub fn with_next<R>(
        &mut self,
        decide: impl FnOnce(&Job, &mut ClusterState, &mut Context) -> R,
    ) -> Option<R> {
        let task = self.tasks.get(self.next)?;
        let mut ctx = Context {
            node_order: Some(&self.node_order),
            arrived_milli: Some(self.arrived),
            ..Context::new(0.0, &mut self.rng)
        };
        Some(decide(task, &mut self.state, &mut ctx))
    }

    /// The next arrival is placed by `placer`. Returns whether it fit (`None` at the end).
    pub fn step(&mut self, placer: &dyn Placer) -> Option<bool> {
        let placement = self.with_next(|task, state, ctx| placer.place(task, state, ctx).ok())?;
        self.apply(placement.as_ref())
    }

    /// The next arrival goes to `placement` (`None`: it does not fit). Returns whether it
    /// was placed (`None` at the end).
    pub fn apply(&mut self, placement: Option<&Placement>) -> Option<bool> {
        let task = self.tasks.get(self.next)?;
        self.next += 1;
        self.arrived += task.gpu_milli();
        let placed = placement.is_some_and(|p| self.state.allocate(task, p).is_ok());
        if !placed {
            self.failed_milli += task.gpu_milli();
        }
        Some(placed)
    }
}

pub fn run_inflation(
    policy: &Policy,
    topo: Arc<Topology>,
    workload: &[Job],
    trace: &str,
    config: &SimConfig,
) -> Result<(SimResult, ArrivalCurve), DomainError> {
    let started = Instant::now();
    let mut run = InflationRun::new(topo.clone(), workload, config)?;
    let Mode::Inflation { max_arrived_pct } = config.mode else {
        unreachable!("checked by InflationRun::new");
    };
    let capacity = run.state.capacity_milli();
    let mut failed = 0u64;
    let mut curve = ArrivalCurve::default();
    let pct = |milli: u64| milli as f64 / capacity as f64 * 100.0;
    while let Some(placed) = run.step(policy.placer.as_ref()) {
        if !placed {
            failed += 1;
        }
        curve
            .points
            .push((pct(run.arrived), pct(run.state.allocated_milli())));
    }
    let tasks = run.tasks.clone();
    let state = run.state;
    let max = max_arrived_pct.floor() as u32;
    let by_arrived: BTreeMap<String, f64> = (10..=max)
        .step_by(10)
        .filter_map(|x| curve.alloc_at(x).map(|a| (x.to_string(), a)))
        .collect();
    let gpus = topo.gpu_count() as u64;
    let at_100 = curve.alloc_at(100).map(|a| gpus as f64 * (1.0 - a / 100.0));
    let result = SimResult {
        policy: policy.name.clone(),
        trace: trace.to_string(),
        cluster: topo.name.clone(),
        seed: config.seed,
        mode: "inflation".into(),
        jobs: tasks.len() as u64,
        gpus,
        completed: tasks.len() as u64 - failed,
        rejected: failed,
        gpu_alloc_pct: pct(state.allocated_milli()),
        events: tasks.len() as u64,
        wall_s: started.elapsed().as_secs_f64(),
        alloc_pct_by_arrived: Some(by_arrived),
        unallocated_gpus_at_100: at_100,
        ..SimResult::default()
    };
    Ok((result, curve))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::domain::{ClusterSpec, JobId};
    use crate::policies;

    fn cluster() -> Arc<Topology> {
        let spec = ClusterSpec::from_toml(
            "name='c'\n[[nodes]]\ncount=10\ngpu_model='T4'\ngpus=4\ncpu_milli=64000\nmemory_mib=262144\n",
        )
        .unwrap();
        Arc::new(Topology::build(&spec).unwrap())
    }

    fn workload() -> Vec<Job> {
        (0..30)
            .map(|i| {
                let mut j = Job::whole_gpus(JobId(i), 1, 0.0, 0.0);
                j.cpu_milli = 4000;
                j.gpu = match i % 3 {
                    0 => GpuDemand::Milli(600),
                    1 => GpuDemand::Whole(1),
                    _ => GpuDemand::Whole(2),
                };
                j
            })
            .collect()
    }

    #[test]
    fn arrivals_reach_the_target_and_start_with_the_whole_trace() {
        let w = workload();
        let tasks = inflation_arrivals(&w, 40_000, 130.0, &SimConfig::inflation(7));
        assert!(tasks.len() > w.len());
        let total: u64 = tasks.iter().map(Job::gpu_milli).sum();
        assert!(total <= 52_000, "{total}");
        let mut first: Vec<u32> = tasks[..w.len()].iter().map(|t| t.id.0).collect();
        first.sort_unstable();
        assert_eq!(first, (0..30).collect::<Vec<_>>());
    }

    #[test]
    fn placers_see_the_load_arrived_before_the_current_arrival() {
        let w = workload();
        let policy = policies::build("fgd", &w).unwrap();
        let mut run = InflationRun::new(cluster(), &w, &SimConfig::inflation(3)).unwrap();
        let mut before = 0;
        for _ in 0..10 {
            let task = run.next_task().unwrap().clone();
            assert_eq!(
                run.with_next(|_, _, ctx| ctx.arrived_milli),
                Some(Some(before))
            );
            run.step(policy.placer.as_ref()).unwrap();
            before += task.gpu_milli();
            assert_eq!(run.arrived_milli(), before);
        }
    }

    #[test]
    fn allocation_never_exceeds_arrivals_or_capacity_and_is_seeded() {
        let w = workload();
        let policy = policies::build("fgd", &w).unwrap();
        let run =
            |seed| run_inflation(&policy, cluster(), &w, "t", &SimConfig::inflation(seed)).unwrap();
        let (result, curve) = run(3);
        for &(arrived, alloc) in &curve.points {
            assert!(alloc <= arrived + 1e-9 && alloc <= 100.0 + 1e-9);
        }
        assert!(result.rejected > 0, "130 % cannot all fit");
        assert_eq!(run(3).1, curve);
        assert!(
            result
                .alloc_pct_by_arrived
                .as_ref()
                .unwrap()
                .contains_key("100")
        );
    }

    #[test]
    fn a_cloned_run_continues_exactly_like_the_original() {
        let w = workload();
        let policy = policies::build("fgd", &w).unwrap();
        let placer = policy.placer.as_ref();
        let trail = |r: &mut InflationRun| {
            let mut placed = Vec::new();
            while let Some(p) = r.step(placer) {
                placed.push(p);
            }
            (placed, r.failed_milli(), r.state().allocated_milli())
        };
        let config = SimConfig::inflation(5);
        let mut run = InflationRun::new(cluster(), &w, &config).unwrap();
        let mut head = Vec::new();
        for _ in 0..20 {
            head.push(run.step(placer).unwrap());
        }
        let mut copy = run.clone();
        let tail = trail(&mut run);
        assert_eq!(tail, trail(&mut copy));
        // Stepped by hand, the episode is the simulator's.
        let (result, _) = run_inflation(&policy, cluster(), &w, "t", &config).unwrap();
        let failed = head.iter().chain(&tail.0).filter(|p| !**p).count();
        assert!(failed > 0, "130 % cannot all fit");
        assert_eq!(result.rejected as usize, failed);
        assert_eq!(result.jobs as usize, head.len() + tail.0.len());
        let alloc = tail.2 as f64 / run.state().capacity_milli() as f64 * 100.0;
        assert!((alloc - result.gpu_alloc_pct).abs() < 1e-9);
    }

    #[test]
    fn a_run_applies_given_placements_and_counts_failures() {
        let mut one = Job::whole_gpus(JobId(0), 1, 0.0, 0.0);
        one.cpu_milli = 1000;
        let mut four = one.clone();
        four.id = JobId(1);
        four.gpu = GpuDemand::Whole(4);
        let mut run = InflationRun::from_arrivals(
            cluster(),
            vec![one.clone(), four.clone()],
            &SimConfig::inflation(1),
        )
        .unwrap();
        assert_eq!(run.next_task().map(|t| t.id), Some(JobId(0)));
        assert_eq!(run.apply(None), Some(false));
        assert_eq!(run.failed_milli(), 1000);
        assert_eq!(run.arrived_milli(), 1000);
        let policy = policies::build("fgd", &[one, four]).unwrap();
        assert_eq!(run.step(policy.placer.as_ref()), Some(true));
        assert_eq!(run.state().allocated_milli(), 4000);
        assert_eq!(run.position(), 2);
        assert_eq!(run.step(policy.placer.as_ref()), None);
    }

    #[test]
    fn discretisation_averages_points_that_round_to_the_load() {
        let curve = ArrivalCurve {
            points: vec![(99.4, 90.0), (99.6, 91.0), (100.4, 92.0), (100.6, 95.0)],
        };
        assert_eq!(curve.alloc_at(100), Some(91.5));
        assert_eq!(curve.alloc_at(98), Some(90.0), "falls back to ±1 %");
        assert_eq!(curve.alloc_at(50), None);
    }
}
