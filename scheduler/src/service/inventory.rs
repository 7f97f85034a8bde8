//! The names behind the numbers a stored job holds, so that a restart with another
//! inventory puts jobs back where they are, not where their numbers now point.
//!
//! A job record stores its placement as node and GPU ids (positions in the topology) and
//! its GPU-model constraint as a set of positions in the GPU catalog: compact, and what
//! the scheduling state works with. Both are positions in *one* inventory. An operator
//! who adds a node group above the others, or reorders the custom `[[gpu_models]]`,
//! shifts them: a restored placement would land on another node (whose agent is then
//! told to stop a job it does not run, while the real one is stopped as unknown), and a
//! constraint would name another model.
//!
//! So the database keeps the inventory its records were written under ([`Inventory`]:
//! node names with their GPU counts, model names, in id order), and a restart maps every
//! stored job from that inventory to the current one by name ([`Remap`]). What cannot be
//! mapped is never guessed: a placement on a node that is gone, or on a GPU index the node
//! no longer has, is not restored (the job is requeued, as for any allocation that cannot
//! be restored), and a constraint whose every model is gone cannot be met (a waiting job
//! is rejected with the names; a job still running keeps running, constrained to the
//! models of its nodes). A database written before the inventory was kept is read as
//! written under the current inventory, which is what it always meant; ids beyond it
//! are still caught.

use serde::{Deserialize, Serialize};

use crate::domain::{GpuId, GpuModelId, GpuModelSet, GpuShare, NodeId, Placement, Topology};
use crate::service::jobs::JobRecord;

/// What a stored id means: node names with their GPU counts, and GPU model names, each
/// in id order.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Inventory {
    pub nodes: Vec<(String, u32)>,
    pub models: Vec<String>,
}

impl Inventory {
    pub fn of(topo: &Topology) -> Self {
        Inventory {
            nodes: topo
                .node_ids()
                .map(|n| {
                    let node = topo.node(n);
                    (node.name.clone(), node.gpu_count() as u32)
                })
                .collect(),
            models: topo.catalog.iter().map(|(_, m)| m.name.clone()).collect(),
        }
    }
}

/// Refuses a restart under `current` when the database's `unfinished` jobs (waiting or
/// placed) were written under `stored` and the two share no node name: that is not a
/// changed inventory but another cluster, most likely the default preset, which a
/// restart without its `cluster` (`--cluster`) falls back to. Mapping by name would
/// requeue every placement, reject every job whose GPU models the other cluster lacks,
/// and write that back with the new inventory, so a second restart with the right
/// cluster could not undo it. Nothing is changed before this check.
pub fn check_same_cluster(
    stored: &Inventory,
    current: &Inventory,
    cluster: &str,
    unfinished: usize,
) -> Result<(), String> {
    let shared = stored
        .nodes
        .iter()
        .any(|(name, _)| current.nodes.iter().any(|(now, _)| now == name));
    if shared || stored.nodes.is_empty() || unfinished == 0 {
        return Ok(());
    }
    let some = |inv: &Inventory| {
        let names: Vec<&str> = inv.nodes.iter().take(3).map(|(n, _)| n.as_str()).collect();
        let more = if inv.nodes.len() > 3 { ", …" } else { "" };
        format!("{} nodes: {}{more}", inv.nodes.len(), names.join(", "))
    };
    let default = crate::service::config::ServiceConfig::default().cluster;
    Err(format!(
        "its {unfinished} unfinished jobs were written under an inventory of {}, and cluster \
         {cluster:?} given now ({}) has none of them; start with the cluster they were \
         written under (`cluster` in the configuration or `--cluster`; without either, the \
         default preset {default:?} is used), or, to move them to another cluster, let them \
         finish or cancel them first. Nothing was changed",
        some(stored),
        some(current)
    ))
}

/// The unfinished jobs a restart onto `remap`'s current inventory would not keep as
/// they are: one placed on a node that is gone is requeued (while its workers may still
/// run there: the node's agent is refused), and one waiting, or requeued so, whose
/// every allowed GPU model is gone is rejected. One line per job, in `jobs`' order.
pub fn jobs_a_change_would_move(remap: &Remap, jobs: &[JobRecord], topo: &Topology) -> Vec<String> {
    if remap.is_identity() {
        return Vec::new();
    }
    let mut lines = Vec::new();
    for record in jobs.iter().filter(|r| !r.state.is_final()) {
        let id = record.job.id.0;
        let unmapped = remap.job(&mut record.clone(), topo);
        let requeued = record
            .state
            .is_active()
            .then_some(unmapped.placement)
            .flatten();
        let rejected = unmapped
            .models
            .filter(|_| record.state.is_waiting() || requeued.is_some());
        let line = match (requeued, rejected) {
            (Some(p), Some(m)) => format!("job {id} would be requeued ({p}) and rejected ({m})"),
            (Some(p), None) => format!("job {id} would be requeued ({p})"),
            (None, Some(m)) => format!("job {id} would be rejected ({m})"),
            (None, None) => continue,
        };
        lines.push(line);
    }
    lines
}

/// Refuses a restart that would requeue or reject `moved` (from
/// [`jobs_a_change_would_move`]) unless the operator accepted it.
pub fn check_accepted_change(moved: &[String], accepted: bool) -> Result<(), String> {
    if moved.is_empty() || accepted {
        return Ok(());
    }
    const SHOWN: usize = 5;
    let more = match moved.len().saturating_sub(SHOWN) {
        0 => String::new(),
        n => format!("; and {n} more"),
    };
    let jobs = if moved.len() == 1 { "job" } else { "jobs" };
    Err(format!(
        "the inventory changed since the database was written, and {} unfinished {jobs} \
         would not be kept as stored: {}{more}. Drain a node and let its jobs move \
         before removing it (and cancel jobs that need a removed GPU model), or start with \
         `accept_inventory_change = true` (`--accept-inventory-change`) to requeue and \
         reject them. Nothing was changed",
        moved.len(),
        moved[..moved.len().min(SHOWN)].join("; ")
    ))
}

/// How a stored node id and its GPUs map onto the current topology.
#[derive(Clone, Debug)]
struct NodeMap {
    name: String,
    /// The node's first GPU id in the stored inventory.
    old_first_gpu: u32,
    old_gpus: u32,
    /// The same node now; `None` when no node has its name.
    now: Option<(NodeId, u32, u32)>,
}

/// Maps ids stored under one inventory onto another, by name.
#[derive(Debug)]
pub struct Remap {
    nodes: Vec<NodeMap>,
    /// Stored model id → the model of that name now.
    models: Vec<Option<GpuModelId>>,
    stored_models: Vec<String>,
    /// `topo`'s inventory, the one the mapped records refer to.
    current: Inventory,
    /// Whether the database holds `current` already.
    stored_is_current: bool,
    /// Whether every id maps to itself.
    identity: bool,
}

/// What [`Remap::job`] could not map, and why.
#[derive(Debug, Default)]
pub struct Unmapped {
    /// The stored placement cannot be restored.
    pub placement: Option<String>,
    /// The model constraint cannot be met: every model it allowed is gone.
    pub models: Option<String>,
}

impl Remap {
    /// From the inventory the records were written under onto `topo`'s; `None` (a
    /// database from before the inventory was kept) means written under `topo`'s.
    pub fn between(stored: Option<&Inventory>, topo: &Topology) -> Remap {
        let current = Inventory::of(topo);
        let stored_is_current = stored == Some(&current);
        let stored = stored.unwrap_or(&current);
        let identity = *stored == current;
        let now: std::collections::HashMap<&str, NodeId> = topo
            .node_ids()
            .map(|n| (topo.node(n).name.as_str(), n))
            .collect();
        let mut first = 0u32;
        let nodes = stored
            .nodes
            .iter()
            .map(|(name, gpus)| {
                let map = NodeMap {
                    name: name.clone(),
                    old_first_gpu: first,
                    old_gpus: *gpus,
                    now: now.get(name.as_str()).map(|&n| {
                        let node = topo.node(n);
                        (n, node.gpus.start, node.gpu_count() as u32)
                    }),
                };
                first = first.saturating_add(*gpus);
                map
            })
            .collect();
        Remap {
            nodes,
            models: stored.models.iter().map(|m| topo.catalog.id(m)).collect(),
            stored_models: stored.models.clone(),
            stored_is_current,
            identity,
            current,
        }
    }

    /// Whether every id maps to itself (the records were written under this inventory).
    pub fn is_identity(&self) -> bool {
        self.identity
    }

    /// The inventory the mapped records refer to, to store with them.
    pub fn current(&self) -> &Inventory {
        &self.current
    }

    /// Whether the database already holds [`Self::current`].
    pub fn stored_is_current(&self) -> bool {
        self.stored_is_current
    }

    /// Maps `record`'s placement and model constraint in place. What cannot be mapped
    /// is left as stored and returned. A job still running where it was placed whose
    /// models are all gone is constrained to its nodes' models, which met the constraint
    /// under the stored names.
    pub fn job(&self, record: &mut JobRecord, topo: &Topology) -> Unmapped {
        let mut unmapped = Unmapped::default();
        if let Some(stored) = &record.placement {
            match self.placement(stored) {
                Ok(p) => record.placement = Some(p),
                Err(why) => unmapped.placement = Some(why),
            }
        }
        match self.models(record.job.gpu_models) {
            Ok(set) => record.job.gpu_models = set,
            Err(why) => {
                if record.state.is_active() && unmapped.placement.is_none() {
                    record.job.gpu_models = placement_models(topo, record.placement.as_ref());
                }
                unmapped.models = Some(why);
            }
        }
        unmapped
    }

    /// A stored placement in the current topology's ids; why not, when a node is gone,
    /// a GPU is not its node's, or an id is beyond the stored inventory.
    pub fn placement(&self, stored: &Placement) -> Result<Placement, String> {
        let mut out = stored.clone();
        for worker in &mut out.workers {
            let map = self
                .nodes
                .get(worker.node.0 as usize)
                .ok_or_else(|| format!("node id {} is not in the inventory", worker.node.0))?;
            let name = &map.name;
            let (node, first, count) = map
                .now
                .ok_or_else(|| format!("node {name} is no longer in the inventory"))?;
            worker.node = node;
            for GpuShare { gpu, .. } in &mut worker.gpus {
                let index = gpu
                    .0
                    .checked_sub(map.old_first_gpu)
                    .filter(|&i| i < map.old_gpus)
                    .ok_or_else(|| format!("GPU id {} is not on node {name}", gpu.0))?;
                if index >= count {
                    return Err(format!(
                        "node {name} now has {count} GPUs, the placement uses GPU {index}"
                    ));
                }
                *gpu = GpuId(first + index);
            }
        }
        Ok(out)
    }

    /// The nodes of a stored placement that the current inventory still has, in its
    /// ids (whether or not the placement itself can be mapped).
    pub fn nodes_now(&self, stored: &Placement) -> Vec<NodeId> {
        stored
            .workers
            .iter()
            .filter_map(|w| Some(self.nodes.get(w.node.0 as usize)?.now?.0))
            .collect()
    }

    /// A stored model constraint in the current catalog's ids. Models no longer in the
    /// catalog are dropped; if that leaves none of a constraint that named some, it
    /// cannot be met (an empty set would mean "any model"): the error names them.
    pub fn models(&self, stored: GpuModelSet) -> Result<GpuModelSet, String> {
        if stored.is_any() {
            return Ok(stored);
        }
        let (mut kept, mut gone) = (Vec::new(), Vec::new());
        for id in stored.ids() {
            match self.models.get(id.0 as usize) {
                Some(Some(now)) => kept.push(*now),
                Some(None) => gone.push(self.stored_models[id.0 as usize].clone()),
                None => gone.push(format!("model id {}", id.0)),
            }
        }
        if kept.is_empty() {
            return Err(format!(
                "its GPU models ({}) are no longer in the inventory",
                gone.join(", ")
            ));
        }
        Ok(GpuModelSet::of(kept))
    }
}

/// The GPU models of the nodes `placement` uses (any model without one).
fn placement_models(topo: &Topology, placement: Option<&Placement>) -> GpuModelSet {
    GpuModelSet::of(
        placement
            .into_iter()
            .flat_map(|p| &p.workers)
            .filter_map(|w| topo.node(w.node).model),
    )
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use super::*;
    use crate::domain::ClusterSpec;
    use crate::service::config::ServiceConfig;
    use crate::service::core::Core;
    use crate::service::jobs::JobState;
    use crate::service::metrics::Metrics;
    use crate::service::model::{ModelSlot, NoModel};
    use crate::service::pb;
    use crate::service::testkit::{TestCore, whole_gpu_job};

    /// `count` nodes named `prefix-i` of `gpus` GPUs of `model`, one NVLink island each.
    fn group(prefix: &str, count: u32, model: &str, gpus: u32) -> String {
        format!(
            "[[nodes]]\ncount = {count}\nname_prefix = \"{prefix}\"\ngpu_model = \"{model}\"\n\
             gpus = {gpus}\nnvlink_domain = {gpus}\ncpu_milli = 224000\nmemory_mib = 2097152\n"
        )
    }

    /// Two H100 nodes of `n_gpus` GPUs and one of 4 of a custom model, `X1`.
    fn before(n_gpus: u32) -> String {
        format!(
            "name = \"inv\"\n[[gpu_models]]\nname = \"X1\"\nmemory_gib = 48.0\nthroughput = 1.5\n{}{}",
            group("n", 2, "H100", n_gpus),
            group("p", 1, "X1", 4)
        )
    }

    /// A node group added above the others; `X1` and its node are gone.
    fn after() -> String {
        format!(
            "name = \"inv\"\n{}{}",
            group("m", 1, "H100", 8),
            group("n", 2, "H100", 8)
        )
    }

    fn topo(toml: &str) -> Topology {
        Topology::build(&ClusterSpec::from_toml(toml).unwrap()).unwrap()
    }

    fn one_worker(node: u32, gpus: &[u32]) -> Placement {
        Placement {
            workers: vec![crate::domain::WorkerPlacement {
                node: NodeId(node),
                gpus: gpus
                    .iter()
                    .map(|&g| GpuShare {
                        gpu: GpuId(g),
                        milli: 1000,
                        mig_compute: 0,
                        mig_memory: 0,
                    })
                    .collect(),
            }],
        }
    }

    #[test]
    fn ids_follow_names_and_what_is_gone_is_refused_not_guessed() {
        let (old, new) = (topo(&before(8)), topo(&after()));
        let stored = Inventory::of(&old);
        assert!(Remap::between(Some(&stored), &old).is_identity());
        let remap = Remap::between(Some(&stored), &new);
        assert!(!remap.is_identity());
        // n-1 was node 1 with GPUs 8–15; now node 2 with GPUs 16–23.
        let moved = remap.placement(&one_worker(1, &[11, 12])).unwrap();
        assert_eq!(moved, one_worker(2, &[19, 20]));
        assert_eq!(new.node(NodeId(2)).name, "n-1");
        let err = remap.placement(&one_worker(2, &[16])).unwrap_err();
        assert!(
            err.contains("node p-0 is no longer in the inventory"),
            "{err}"
        );
        let err = remap.placement(&one_worker(1, &[3])).unwrap_err();
        assert!(err.contains("GPU id 3 is not on node n-1"), "{err}");
        let err = remap.placement(&one_worker(9, &[0])).unwrap_err();
        assert!(err.contains("node id 9 is not in the inventory"), "{err}");
        // A node that lost GPUs keeps the placements that still fit.
        let smaller = topo(&before(4));
        let remap = Remap::between(Some(&stored), &smaller);
        assert_eq!(
            remap.placement(&one_worker(1, &[9])).unwrap(),
            one_worker(1, &[5])
        );
        let err = remap.placement(&one_worker(1, &[13])).unwrap_err();
        assert!(err.contains("node n-1 now has 4 GPUs"), "{err}");

        // Models by name: a vanished one is dropped, and a constraint left empty (which
        // would read "any model") is refused with the names.
        let remap = Remap::between(Some(&stored), &new);
        let id = |t: &Topology, m: &str| t.catalog.id(m).unwrap();
        let x1 = GpuModelSet::of([id(&old, "X1")]);
        let err = remap.models(x1).unwrap_err();
        assert!(err.contains("(X1) are no longer in the inventory"), "{err}");
        let both = GpuModelSet::of([id(&old, "X1"), id(&old, "A100-80")]);
        assert_eq!(
            remap.models(both).unwrap(),
            GpuModelSet::of([id(&new, "A100-80")])
        );
        assert_eq!(remap.models(GpuModelSet::ANY).unwrap(), GpuModelSet::ANY);
        let beyond = GpuModelSet::of([GpuModelId(63)]);
        assert!(remap.models(beyond).unwrap_err().contains("model id 63"));
    }

    /// Registers `nodes` (name, GPU model, GPU count), the inventory's first ones in
    /// order, with nothing running.
    fn register_nodes(
        inner: &mut crate::service::core::Inner,
        nodes: &[(&str, &str, u32)],
        t0: i64,
    ) {
        for (i, &(name, model, gpus)) in nodes.iter().enumerate() {
            let req = pb::RegisterNodeRequest {
                node: Some(node_info(name, model, gpus)),
                running: vec![],
                ..Default::default()
            };
            inner.register(&req, t0).unwrap();
            inner.heard_from(NodeId(i as u32), t0);
        }
    }

    fn restore_on(test: &TestCore, toml: &str) -> Core {
        try_restore_on(test, toml).unwrap_or_else(|e| panic!("{e}"))
    }

    fn try_restore_on(
        test: &TestCore,
        toml: &str,
    ) -> Result<Core, crate::service::error::StartError> {
        try_restore_with(test, toml, true)
    }

    fn try_restore_with(
        test: &TestCore,
        toml: &str,
        accept_inventory_change: bool,
    ) -> Result<Core, crate::service::error::StartError> {
        Core::restore(
            &ServiceConfig {
                db: "unused.redb".into(),
                accept_inventory_change,
                ..ServiceConfig::default()
            },
            &ClusterSpec::from_toml(toml).unwrap(),
            test.core.store.clone(),
            Arc::new(Metrics::new()),
            Arc::new(NoModel) as Arc<dyn ModelSlot>,
        )
    }

    /// A restart without the cluster the database was written under (`marshal serve`
    /// then takes the default preset, `dgx-0` to `dgx-7`) shares no node with it:
    /// refused, naming the database and both inventories, and nothing in the database
    /// is changed, so a restart with the right cluster finds every job as it was.
    #[test]
    fn a_restart_on_a_cluster_sharing_no_node_is_refused_and_changes_nothing() {
        let test = TestCore::on(ServiceConfig::default(), &before(8));
        let t0 = crate::service::core::now_us();
        let (placed, waiting) = {
            let mut inner = test.core.lock();
            register_nodes(&mut inner, &[("n-0", "H100", 8), ("n-1", "H100", 8)], t0);
            let x1 = pb::JobSpec {
                gpu_models: vec!["X1".into()],
                ..whole_gpu_job(1, 4)
            };
            let ids = (
                inner.submit(Some(&whole_gpu_job(1, 8)), t0).unwrap(),
                inner.submit(Some(&x1), t0).unwrap(),
            );
            inner.cycle(t0, &NoModel.decision_path("topo-pack"));
            assert_eq!(inner.jobs[&ids.0].state, JobState::Placed);
            assert!(
                inner.jobs[&ids.1].state.is_waiting(),
                "p-0 never registered"
            );
            let (_, (batch, _), _) = inner.take_batch();
            test.core.store.commit(&batch).unwrap();
            ids
        };
        let before_restart = format!("{:?}", test.core.store.load().unwrap());
        let default_preset = format!("name = \"dgx-h100-64\"\n{}", group("dgx", 8, "H100", 8));
        let err = match try_restore_on(&test, &default_preset) {
            Ok(_) => panic!("restored onto a cluster sharing no node"),
            Err(e) => e.to_string(),
        };
        for part in [
            "database unused.redb",
            "its 2 unfinished jobs",
            "3 nodes: n-0, n-1, p-0",
            "cluster \"dgx-h100-64\" given now (8 nodes: dgx-0, dgx-1, dgx-2, …)",
            "--cluster",
            "Nothing was changed",
        ] {
            assert!(err.contains(part), "{part:?} missing: {err}");
        }
        // Nothing was written: the records, the counters and the stored inventory.
        assert_eq!(
            format!("{:?}", test.core.store.load().unwrap()),
            before_restart
        );
        let again = restore_on(&test, &before(8));
        let inner = again.lock();
        assert_eq!(inner.jobs[&placed].state, JobState::Placed);
        let node = inner.jobs[&placed].placement.as_ref().unwrap().workers[0].node;
        assert!(inner.topo.node(node).name.starts_with("n-"));
        assert!(inner.jobs[&waiting].state.is_waiting());
        drop(inner);

        // With every job finished there is nothing to lose: a new cluster is taken.
        let done = TestCore::on(ServiceConfig::default(), &before(8));
        {
            let mut inner = done.core.lock();
            let id = inner.submit(Some(&whole_gpu_job(1, 8)), t0).unwrap();
            inner.cancel(id, "not needed", t0).unwrap();
            let (_, (batch, _), _) = inner.take_batch();
            done.core.store.commit(&batch).unwrap();
        }
        assert!(try_restore_on(&done, &default_preset).is_ok());
    }

    fn node_info(name: &str, model: &str, gpus: u32) -> pb::NodeInfo {
        pb::NodeInfo {
            name: name.into(),
            gpu_model: model.into(),
            gpus,
            nvlink_domain: gpus,
            ..crate::service::testkit::node_info(0)
        }
    }

    #[test]
    fn a_restart_with_another_inventory_puts_jobs_back_on_their_named_nodes() {
        let test = TestCore::on(ServiceConfig::default(), &before(8));
        let t0 = crate::service::core::now_us();
        let (on_h100, on_x1, waiting_x1, cancelled_x1) = {
            let mut inner = test.core.lock();
            register_nodes(
                &mut inner,
                &[("n-0", "H100", 8), ("n-1", "H100", 8), ("p-0", "X1", 4)],
                t0,
            );
            let x1 = pb::JobSpec {
                gpu_models: vec!["X1".into()],
                ..whole_gpu_job(1, 4)
            };
            let ids = (
                inner.submit(Some(&whole_gpu_job(2, 8)), t0).unwrap(),
                inner.submit(Some(&x1), t0).unwrap(),
                inner.submit(Some(&x1), t0).unwrap(),
                inner.submit(Some(&x1), t0).unwrap(),
            );
            inner.cancel(ids.3, "not needed", t0).unwrap();
            inner.cycle(t0, &NoModel.decision_path("topo-pack"));
            assert_eq!(inner.jobs[&ids.0].state, JobState::Placed);
            assert_eq!(inner.jobs[&ids.1].state, JobState::Placed);
            assert!(inner.jobs[&ids.2].state.is_waiting());
            let (_, (batch, _), _) = inner.take_batch();
            test.core.store.commit(&batch).unwrap();
            ids
        };
        let names = |core: &Core, id: u32| -> Vec<String> {
            let inner = core.lock();
            inner.jobs[&id]
                .placement
                .iter()
                .flat_map(|p| &p.workers)
                .map(|w| inner.topo.node(w.node).name.clone())
                .collect()
        };
        assert_eq!(names(&test.core, on_h100), ["n-0", "n-1"]);

        // Unaccepted, the change is refused, naming what it would do, and nothing moves.
        let stored = format!("{:?}", test.core.store.load().unwrap());
        let err = match try_restore_with(&test, &after(), false) {
            Ok(_) => panic!("an inventory change that requeues and rejects jobs was taken"),
            Err(e) => e.to_string(),
        };
        for part in [
            "2 unfinished jobs would not be kept",
            &format!("job {on_x1} would be requeued (node p-0"),
            "and rejected (",
            &format!("job {waiting_x1} would be rejected ("),
            "--accept-inventory-change",
            "Nothing was changed",
        ] {
            assert!(err.contains(part), "{part:?} missing: {err}");
        }
        assert!(!err.contains(&format!("job {on_h100} ")), "{err}");
        assert!(!err.contains(&format!("job {cancelled_x1} ")), "{err}");
        assert_eq!(format!("{:?}", test.core.store.load().unwrap()), stored);

        let restarted = restore_on(&test, &after());
        {
            let inner = restarted.lock();
            // The gang is back on n-0 and n-1 (now ids 1 and 2), holding their GPUs.
            assert_eq!(inner.jobs[&on_h100].state, JobState::Placed);
            for node in ["n-0", "n-1"] {
                let n = inner
                    .topo
                    .node_ids()
                    .find(|&n| inner.topo.node(n).name == node);
                let gpus = inner.topo.node(n.unwrap()).gpus.clone();
                assert!(gpus.clone().all(|g| inner.state.free_milli(GpuId(g)) == 0));
            }
            assert!(
                inner
                    .topo
                    .node(NodeId(0))
                    .gpus
                    .clone()
                    .all(|g| inner.state.free_milli(GpuId(g)) == 1000)
            );
            // p-0 and X1 are gone: the placed X1 job is requeued, then, like the waiting
            // one, rejected by name (its constraint cannot be met, nor read as "any").
            for id in [on_x1, waiting_x1] {
                let r = &inner.jobs[&id];
                assert_eq!(r.state, JobState::Rejected, "job {id}: {}", r.reason);
                assert!(
                    r.reason.contains("(X1) are no longer in the inventory"),
                    "{}",
                    r.reason
                );
                // Its stored ids would name other models now: cleared, the reason has it.
                assert!(r.job.gpu_models.is_any());
            }
            assert!(!inner.queue.contains(&on_x1) && !inner.queue.contains(&waiting_x1));
            // A job that had ended stays as it ended; its constraint's names move to
            // the reason, since its ids would name other models now.
            let r = &inner.jobs[&cancelled_x1];
            assert_eq!(r.state, JobState::Cancelled);
            assert!(r.job.gpu_models.is_any());
            assert!(
                r.reason
                    .starts_with("cancelled: not needed; after a restart with another inventory")
                    && r.reason.contains("(X1) are no longer in the inventory"),
                "{}",
                r.reason
            );
        }
        assert_eq!(names(&restarted, on_h100), ["n-0", "n-1"]);
        drop(restarted);
        // The mapped records and the new inventory were stored together: a second
        // restart reads them as they are.
        let loaded = test.core.store.load().unwrap();
        assert_eq!(loaded.inventory, Some(Inventory::of(&topo(&after()))));
        // Taken once: the next start needs no acceptance.
        let again = try_restore_with(&test, &after(), false).unwrap();
        assert_eq!(names(&again, on_h100), ["n-0", "n-1"]);
        assert_eq!(again.lock().jobs[&on_x1].state, JobState::Rejected);
        let reason = again.lock().jobs[&cancelled_x1].reason.clone();
        assert_eq!(
            reason.matches("no longer in the inventory").count(),
            1,
            "noted once: {reason}"
        );
    }
}
