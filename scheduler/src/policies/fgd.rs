//! Fragmentation gradient descent (Weng et al., "Beware of Fragmentation: Scheduling
//! GPU-Sharing Workloads with Fragmentation Gradient Descent", USENIX ATC'23, §4; code:
//! hkust-adsl/kubernetes-scheduler-simulator `pkg/simulator/plugin/fgd_score.go` and
//! `pkg/utils/frag.go`).
//!
//! A node's fragmentation is the GPU capacity that the *target workload* (the most common
//! task shapes of the trace, weighted by popularity) could not use there; FGD places a
//! task where fragmentation grows least. The score is `sigmoid(Δfrag / 1000) × 100`,
//! truncated like the original, and ties go to a random node.
//!
//! Fragmentation depends only on a node's model, free CPU and the multiset of its GPUs'
//! free capacity, so results are memoised on that signature: most nodes of a cluster share
//! a handful of states, and the memo turns a per-task cost of nodes × GPUs × task types
//! into a hash lookup per node.

use std::collections::HashMap;
use std::sync::Mutex;

use rustc_hash::FxHashMap;

use crate::domain::{
    ClusterState, GpuDemand, GpuId, GpuModelId, GpuModelSet, GpuShare, Job, NodeId,
};
use crate::framework::{Context, NodeScorer, pick_gpus_best_fit};
use crate::policies::scorers::per_gpu_milli;

/// Share of the trace's tasks the target workload covers (`podPopularityThreshold`).
const POPULARITY_THRESHOLD: f64 = 0.95;
/// Nodes with more GPUs than this are scored without the memo.
const MEMO_GPUS: usize = 8;
/// The memo is cleared when it grows past this many entries.
const MEMO_CAPACITY: usize = 1 << 20;

#[derive(Copy, Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
struct TaskShape {
    cpu_milli: u32,
    milli: u32,
    count: u32,
    models: u64,
    /// A MIG instance sees other GPUs' free capacity than a shared worker of its size
    /// ([`ClusterState::free_milli_for`]), so the two never share a memoised score.
    mig: bool,
}

impl TaskShape {
    fn of(job: &Job) -> Self {
        let (milli, count) = per_gpu_milli(job.gpu);
        TaskShape {
            cpu_milli: job.cpu_milli,
            milli,
            count,
            models: models_bits(job.gpu_models),
            mig: matches!(job.gpu, GpuDemand::Mig { .. }),
        }
    }
}

fn models_bits(set: GpuModelSet) -> u64 {
    set.ids().fold(0, |b, id| b | 1 << id.0)
}

#[derive(Clone, Debug, PartialEq)]
struct TypicalTask {
    shape: TaskShape,
    models: GpuModelSet,
    popularity: f64,
}

#[derive(Copy, Clone, Debug, PartialEq, Eq, Hash)]
struct MemoKey {
    model: u8,
    gpus: u8,
    cpu_left: u32,
    lefts: [u16; MEMO_GPUS],
    task: TaskShape,
}

/// Scores already computed: per (task shape, node) while the node does not change (the
/// common case: a cycle places few jobs but scores every node for each), and per node
/// signature across nodes.
#[derive(Debug, Default)]
struct Memo {
    by_signature: FxHashMap<MemoKey, i64>,
    /// The state instance `by_shape` describes.
    instance: u64,
    shape_ids: FxHashMap<TaskShape, usize>,
    /// Per shape, per node: (node version + 1, score); 0 marks "not computed".
    by_shape: Vec<Vec<(u64, i64)>>,
}

/// Shapes tracked per node before the per-node memo starts over.
const MEMO_SHAPES: usize = 4096;

#[derive(Debug)]
pub struct Fgd {
    typical: Vec<TypicalTask>,
    memo: Mutex<Memo>,
}

/// A node as FGD scores a shared task on it: each GPU's usable free milli (changed and
/// restored per GPU tried), the fragmentation before, and the CPU left after.
struct ShareNode {
    model: Option<GpuModelId>,
    lefts: Vec<u16>,
    before: f64,
    cpu_after: u32,
}

impl Fgd {
    /// Builds the target workload from the tasks of `workload` (one count per job), as
    /// `GetTypicalPods` does: most frequent shapes first until 95 % of tasks are covered,
    /// popularity renormalised over the kept shapes.
    pub fn from_workload(workload: &[Job]) -> Fgd {
        let mut counts: HashMap<TaskShape, (u64, GpuModelSet)> = HashMap::new();
        for job in workload {
            counts
                .entry(TaskShape::of(job))
                .or_insert((0, job.gpu_models))
                .0 += 1;
        }
        let total = workload.len() as f64;
        let mut shapes: Vec<(u64, TaskShape, GpuModelSet)> =
            counts.into_iter().map(|(s, (c, m))| (c, s, m)).collect();
        shapes.sort_by_key(|&(count, shape, _)| std::cmp::Reverse((count, shape)));
        let mut kept = Vec::new();
        let mut cumulative = 0u64;
        for (count, shape, models) in shapes {
            if total > 0.0 && cumulative as f64 >= POPULARITY_THRESHOLD * total {
                break;
            }
            cumulative += count;
            kept.push((count, shape, models));
        }
        let covered = cumulative as f64 / total;
        let typical = kept
            .into_iter()
            .map(|(count, shape, models)| TypicalTask {
                shape,
                models,
                popularity: (count as f64 / total) / covered,
            })
            .collect();
        Fgd {
            typical,
            memo: Mutex::new(Memo::default()),
        }
    }

    /// Number of task shapes in the target workload.
    pub fn target_shapes(&self) -> usize {
        self.typical.len()
    }

    /// Fragmentation of a node state (`NodeGpuShareFragAmountScore`): per target task,
    /// the free GPU capacity it could not use, weighted by popularity.
    pub fn fragmentation(&self, model: Option<GpuModelId>, cpu_left: u32, lefts: &[u16]) -> f64 {
        const Q1_LACK_BOTH: usize = 0;
        const Q2_LACK_GPU: usize = 1;
        const Q3_SATISFIED: usize = 2;
        const Q4_LACK_CPU: usize = 3;
        const XL_SATISFIED: usize = 4;
        const XR_LACK_CPU: usize = 5;
        const NO_ACCESS: usize = 6;
        let free: u32 = lefts.iter().map(|&l| l as u32).sum();
        let mut data = [0.0f64; 7];
        for t in &self.typical {
            let s = &t.shape;
            let p = t.popularity;
            let cpu_ok = cpu_left >= s.cpu_milli;
            if s.milli == 0 {
                data[if cpu_ok { XL_SATISFIED } else { XR_LACK_CPU }] += p * free as f64;
                continue;
            }
            if !model.is_some_and(|m| t.models.allows(m)) {
                data[NO_ACCESS] += p * free as f64;
                continue;
            }
            let hosts = lefts.iter().filter(|&&l| l as u32 >= s.milli).count() as u32 >= s.count;
            match (hosts, cpu_ok) {
                (true, true) => {
                    let unusable: u32 = lefts
                        .iter()
                        .map(|&l| l as u32)
                        .filter(|&l| l < s.milli)
                        .sum();
                    data[Q2_LACK_GPU] += p * unusable as f64;
                    data[Q3_SATISFIED] += p * (free - unusable) as f64;
                }
                (true, false) => data[Q4_LACK_CPU] += p * free as f64,
                (false, true) => data[Q2_LACK_GPU] += p * free as f64,
                (false, false) => data[Q1_LACK_BOTH] += p * free as f64,
            }
        }
        data[Q1_LACK_BOTH]
            + data[Q2_LACK_GPU]
            + data[Q4_LACK_CPU]
            + data[XL_SATISFIED]
            + data[XR_LACK_CPU]
            + data[NO_ACCESS]
    }

    fn delta_score(&self, before: f64, after: f64) -> i64 {
        let sigmoid = 1.0 / (1.0 + (-(before - after) / 1000.0).exp());
        (sigmoid * 100.0) as i64
    }

    /// Best score over the GPUs a shared task could take, or the score of the exclusive
    /// placement, on a node given by its free CPU and GPU capacities.
    fn score_state(
        &self,
        job: &Job,
        model: Option<GpuModelId>,
        cpu_left: u32,
        lefts: &[u16],
    ) -> i64 {
        let before = self.fragmentation(model, cpu_left, lefts);
        let cpu_after = cpu_left.saturating_sub(job.cpu_milli);
        let (milli, count) = per_gpu_milli(job.gpu);
        let mut after = lefts.to_vec();
        if job.gpu.is_shared() {
            let mut best: Option<i64> = None;
            for i in 0..lefts.len() {
                if (lefts[i] as u32) < milli || lefts[..i].contains(&lefts[i]) {
                    continue;
                }
                after[i] -= milli as u16;
                let s = self.delta_score(before, self.fragmentation(model, cpu_after, &after));
                after[i] = lefts[i];
                best = Some(best.map_or(s, |b| b.max(s)));
            }
            return best.unwrap_or(0);
        }
        let mut order: Vec<usize> = (0..after.len()).collect();
        order.sort_by_key(|&i| after[i]);
        let mut taken = 0;
        for i in order {
            if taken < count && after[i] as u32 >= milli {
                after[i] -= milli as u16;
                taken += 1;
            }
        }
        self.delta_score(before, self.fragmentation(model, cpu_after, &after))
    }

    fn score_by_signature(
        &self,
        job: &Job,
        task: TaskShape,
        node: NodeId,
        state: &ClusterState,
        memo: &mut FxHashMap<MemoKey, i64>,
    ) -> i64 {
        let topo_node = state.topology().node(node);
        let model = topo_node.model;
        let cpu_left = state.node_cpu_free(node);
        let gpus = topo_node.gpu_count() as usize;
        if gpus > MEMO_GPUS {
            return self.score_state(job, model, cpu_left, &Self::node_lefts(state, node, job));
        }
        let mut lefts = [0u16; MEMO_GPUS];
        for (slot, g) in lefts.iter_mut().zip(topo_node.gpu_ids()) {
            *slot = state.free_milli_for(g, job.gpu);
        }
        lefts[..gpus].sort_unstable();
        let key = MemoKey {
            model: model.map_or(u8::MAX, |m| m.0),
            gpus: gpus as u8,
            cpu_left,
            lefts,
            task,
        };
        if let Some(&s) = memo.get(&key) {
            return s;
        }
        let s = self.score_state(job, model, cpu_left, &lefts[..gpus]);
        if memo.len() >= MEMO_CAPACITY {
            memo.clear();
        }
        memo.insert(key, s);
        s
    }

    /// What FGD's per-GPU score of a shared task on `node` starts from.
    fn share_node(&self, job: &Job, node: NodeId, state: &ClusterState) -> ShareNode {
        let model = state.topology().node(node).model;
        let lefts = Self::node_lefts(state, node, job);
        let cpu_left = state.node_cpu_free(node);
        ShareNode {
            model,
            before: self.fragmentation(model, cpu_left, &lefts),
            cpu_after: cpu_left.saturating_sub(job.cpu_milli),
            lefts,
        }
    }

    /// The score of taking `milli` from the node's `i`-th GPU.
    fn share_score_on(&self, n: &mut ShareNode, i: usize, milli: u16) -> i64 {
        let kept = n.lefts[i];
        n.lefts[i] -= milli;
        let s = self.delta_score(n.before, self.fragmentation(n.model, n.cpu_after, &n.lefts));
        n.lefts[i] = kept;
        s
    }

    /// FGD's score of putting the shared task `job` on each GPU of `node` that fits it,
    /// in GPU order (the node's score is the best of them).
    fn share_scores(&self, job: &Job, node: NodeId, state: &ClusterState) -> Vec<(GpuId, i64)> {
        let mut n = self.share_node(job, node, state);
        let milli = job.gpu.milli() as u16;
        let gpus = state.topology().node(node).gpu_ids();
        gpus.enumerate()
            .filter(|&(_, gpu)| state.gpu_fits(gpu, job.gpu))
            .map(|(i, gpu)| (gpu, self.share_score_on(&mut n, i, milli)))
            .collect()
    }

    /// FGD's score of the shared task `job` on `gpu` of `node` in particular (`None` if it
    /// does not fit there or `gpu` is not on `node`): the node's score when `gpu` is FGD's
    /// own pick, lower when another GPU would fragment less.
    pub fn share_score(
        &self,
        job: &Job,
        node: NodeId,
        gpu: GpuId,
        state: &ClusterState,
    ) -> Option<f64> {
        let gpus = &state.topology().node(node).gpus;
        if !(job.gpu.is_shared() && gpus.contains(&gpu.0) && state.gpu_fits(gpu, job.gpu)) {
            return None;
        }
        let i = (gpu.0 - gpus.start) as usize;
        let mut n = self.share_node(job, node, state);
        Some(self.share_score_on(&mut n, i, job.gpu.milli() as u16) as f64)
    }

    /// Each GPU's free milli as `job` can use it (none of a GPU in the other MIG mode).
    fn node_lefts(state: &ClusterState, node: NodeId, job: &Job) -> Vec<u16> {
        state
            .topology()
            .node(node)
            .gpu_ids()
            .map(|g| state.free_milli_for(g, job.gpu))
            .collect()
    }
}

impl NodeScorer for Fgd {
    fn score(&self, job: &Job, node: NodeId, state: &ClusterState, ctx: &mut Context) -> f64 {
        let mut scores = Vec::with_capacity(1);
        self.score_nodes(job, &[node], state, ctx, &mut scores);
        scores[0]
    }

    fn score_nodes(
        &self,
        job: &Job,
        nodes: &[NodeId],
        state: &ClusterState,
        _: &mut Context,
        scores: &mut Vec<f64>,
    ) {
        let task = TaskShape::of(job);
        let mut memo = self.memo.lock().unwrap_or_else(|e| e.into_inner());
        let Memo {
            by_signature,
            instance,
            shape_ids,
            by_shape,
        } = &mut *memo;
        if *instance != state.instance() || shape_ids.len() >= MEMO_SHAPES {
            *instance = state.instance();
            shape_ids.clear();
            by_shape.clear();
        }
        let next_id = shape_ids.len();
        let shape = *shape_ids.entry(task).or_insert(next_id);
        if shape == by_shape.len() {
            by_shape.push(vec![(0, 0); state.topology().nodes().len()]);
        }
        let per_node = &mut by_shape[shape];
        for &node in nodes {
            let tag = state.node_version(node) as u64 + 1;
            let slot = &mut per_node[node.0 as usize];
            if slot.0 != tag {
                *slot = (
                    tag,
                    self.score_by_signature(job, task, node, state, by_signature),
                );
            }
            scores.push(slot.1 as f64);
        }
    }

    /// A shared task takes the GPU whose use raises fragmentation least, lowest index on
    /// ties (`allocateGpuIdBasedOnFGDScore`); exclusive tasks take the lowest free GPUs.
    fn pick_gpus(
        &self,
        job: &Job,
        node: NodeId,
        state: &ClusterState,
        _: &mut Context,
    ) -> Option<Vec<GpuShare>> {
        if !job.gpu.is_shared() {
            return pick_gpus_best_fit(job, node, state);
        }
        let mut best: Option<(i64, GpuId)> = None;
        for (gpu, s) in self.share_scores(job, node, state) {
            if best.is_none_or(|(b, _)| s > b) {
                best = Some((s, gpu));
            }
        }
        best.map(|(_, gpu)| vec![GpuShare::for_demand(gpu, job.gpu)])
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::domain::{GpuDemand, JobId};

    fn task(cpu: u32, gpu: GpuDemand) -> Job {
        let mut j = Job::whole_gpus(JobId(0), 1, 0.0, 1.0);
        j.cpu_milli = cpu;
        j.gpu = gpu;
        j
    }

    #[test]
    fn target_workload_keeps_the_popular_shapes_and_renormalises() {
        let mut workload: Vec<Job> = (0..60).map(|_| task(4000, GpuDemand::Milli(500))).collect();
        workload.extend((0..38).map(|_| task(8000, GpuDemand::Whole(1))));
        workload.extend((0..2).map(|_| task(1000, GpuDemand::Whole(8))));
        let fgd = Fgd::from_workload(&workload);
        assert_eq!(fgd.target_shapes(), 2, "98 % covered by two shapes");
        let total: f64 = fgd.typical.iter().map(|t| t.popularity).sum();
        assert!((total - 1.0).abs() < 1e-12);
        assert!((fgd.typical[0].popularity - 60.0 / 98.0).abs() < 1e-12);
    }

    #[test]
    fn fragmentation_counts_capacity_the_target_tasks_cannot_use() {
        // Target: only half-GPU tasks needing 4 cores.
        let fgd = Fgd::from_workload(&[task(4000, GpuDemand::Milli(500))]);
        let m = Some(GpuModelId(0));
        // 300 milli free on one GPU cannot host a 500 task: all 300 are fragment.
        assert_eq!(fgd.fragmentation(m, 64_000, &[300, 0]), 300.0);
        // A free GPU can host it: nothing is fragmented but the 300 sliver.
        assert_eq!(fgd.fragmentation(m, 64_000, &[300, 1000]), 300.0);
        assert_eq!(fgd.fragmentation(m, 64_000, &[1000, 1000]), 0.0);
        // Without CPU nothing fits: every free milli is fragmented.
        assert_eq!(fgd.fragmentation(m, 1_000, &[1000, 1000]), 2000.0);
    }

    #[test]
    fn fgd_prefers_the_gpu_that_leaves_no_sliver() {
        let target = [task(1000, GpuDemand::Milli(500))];
        let fgd = Fgd::from_workload(&target);
        let m = Some(GpuModelId(0));
        let job = task(1000, GpuDemand::Milli(500));
        // Taking 500 from a 500-free GPU fragments nothing; from 700 leaves a 200 sliver.
        let exact = fgd.score_state(&job, m, 64_000, &[500]);
        let sliver = fgd.score_state(&job, m, 64_000, &[700]);
        assert!(
            exact == 50 && sliver < exact,
            "exact {exact}, sliver {sliver}"
        );
        // With a second GPU, the sliver is avoided by using it instead.
        assert_eq!(fgd.score_state(&job, m, 64_000, &[700, 1000]), 50);
    }

    #[test]
    fn a_share_scores_on_its_own_gpu_and_the_node_takes_the_best() {
        use crate::domain::{ClusterSpec, Placement, Topology, WorkerPlacement};
        let spec = ClusterSpec::from_toml(
            "name='c'\n[[nodes]]\ncount=1\ngpu_model='T4'\ngpus=4\ncpu_milli=64000\nmemory_mib=262144\n",
        )
        .unwrap();
        let topo = std::sync::Arc::new(Topology::build(&spec).unwrap());
        let mut state = ClusterState::new(topo);
        // Free capacity 1000, 500, 300, 200 on GPUs 0..4.
        for (id, (gpu, used)) in [(1, 500), (2, 700), (3, 800)].into_iter().enumerate() {
            let mut j = task(1000, GpuDemand::Milli(used));
            j.id = JobId(id as u32 + 1);
            let p = Placement {
                workers: vec![WorkerPlacement {
                    node: NodeId(0),
                    gpus: vec![GpuShare::for_demand(GpuId(gpu), j.gpu)],
                }],
            };
            state.allocate(&j, &p).unwrap();
        }
        let fgd = Fgd::from_workload(&[task(1000, GpuDemand::Milli(500))]);
        let job = task(1000, GpuDemand::Milli(300));
        let mut rng = <rand_chacha::ChaCha8Rng as rand::SeedableRng>::seed_from_u64(0);
        let ctx = &mut Context::new(0.0, &mut rng);
        let node = fgd.score(&job, NodeId(0), &state, ctx);
        let own = |g| fgd.share_score(&job, NodeId(0), GpuId(g), &state);
        // 300 fits exactly on GPU 2: FGD's pick, with the node's score; the others lower.
        let pick = fgd.pick_gpus(&job, NodeId(0), &state, ctx).unwrap();
        assert_eq!(pick[0].gpu, GpuId(2));
        assert_eq!(own(2), Some(node));
        assert!(own(0).unwrap() < node && own(1).unwrap() < node);
        // No room on GPU 3, no such GPU on the node, and whole GPUs have no share score.
        assert_eq!(own(3), None);
        assert_eq!(own(9), None);
        assert_eq!(
            fgd.share_score(
                &task(1000, GpuDemand::Whole(1)),
                NodeId(0),
                GpuId(0),
                &state
            ),
            None
        );
    }
}
