//! What a registering node says about MIG, checked against the inventory.
//!
//! MIG mode and MIG instances are set on the node by an administrator; the scheduler
//! places by the inventory. An agent that reads them from NVML reports them, and a node
//! whose report disagrees with the inventory is refused (`FAILED_PRECONDITION`, with
//! what to write in the inventory) rather than given work it cannot run: a whole-GPU job
//! on a GPU in MIG mode, or a MIG job on a GPU without an instance of its size.

use crate::domain::{MigMode, NodeGroupSpec, NodeId, Topology};
use crate::service::convert::mig_modes;
use crate::service::error::ServiceError;
use crate::service::pb;

/// Checks `info`'s MIG modes and instances (as `group`, its parsed form) against node
/// `n` of the inventory. What the agent does not report, the inventory decides alone.
pub(crate) fn check_mig(
    topo: &Topology,
    n: NodeId,
    group: &NodeGroupSpec,
    info: &pb::NodeInfo,
) -> Result<(), ServiceError> {
    let name = &topo.node(n).name;
    let Some(reported) = &group.mig_gpus else {
        return Ok(());
    };
    let reported: Vec<u32> = reported.iter().map(|&g| g as u32).collect();
    match mig_modes(topo, n) {
        None => {
            return Err(ServiceError::FailedPrecondition(format!(
                "node {name} reports MIG mode on GPUs {reported:?}; the inventory leaves MIG mode open, so the scheduler would partition any of its GPUs and give MIG-mode GPUs to whole-GPU jobs: declare mig_gpus = {reported:?} in its node group"
            )));
        }
        Some(inventory) if inventory.gpus != reported => {
            return Err(ServiceError::FailedPrecondition(format!(
                "node {name} reports MIG mode on GPUs {reported:?}; the inventory says {:?}",
                inventory.gpus
            )));
        }
        Some(_) => {}
    }
    match &info.mig_layout {
        Some(layout) => check_instances(topo, n, layout),
        None => Ok(()),
    }
}

/// The reported instances, GPU by GPU: each profile must be what the catalog makes of
/// it, and each GPU must hold the instances its inventory layout lists.
fn check_instances(topo: &Topology, n: NodeId, layout: &pb::MigLayout) -> Result<(), ServiceError> {
    let node = topo.node(n);
    let Some(model) = node.model.map(|m| topo.catalog.get(m)) else {
        return Ok(());
    };
    let mut undeclared: Vec<(u16, Vec<String>)> = Vec::new();
    for g in node.gpu_ids() {
        let gpu = topo.gpu(g);
        if gpu.mig != MigMode::On {
            continue;
        }
        let mut reported = Vec::new();
        for instance in layout
            .instances
            .iter()
            .filter(|i| i.gpu == gpu.index as u32)
        {
            let size = instance.size.unwrap_or_default();
            let size = (size.compute_slices, size.memory_slices);
            let catalog = model
                .mig_instance(&instance.profile)
                .map(|s| (s.compute as u32, s.memory as u32));
            if catalog != Some(size) {
                return Err(ServiceError::FailedPrecondition(format!(
                    "node {}: GPU {}: MIG instance {} of {} compute and {} memory slices; {}",
                    node.name,
                    gpu.index,
                    instance.profile,
                    size.0,
                    size.1,
                    match catalog {
                        Some((c, m)) =>
                            format!("the catalog's {} makes it {c} and {m}", model.name),
                        None => format!(
                            "the catalog's {} has no such profile: add it to the model's mig_profiles in the cluster's [[gpu_models]]",
                            model.name
                        ),
                    }
                )));
            }
            reported.push((size, instance.profile.as_str()));
        }
        let Some(declared) = topo.gpu_mig_instances(g) else {
            let profiles = reported.iter().map(|(_, p)| p.to_string()).collect();
            undeclared.push((gpu.index, profiles));
            continue;
        };
        let mut declared: Vec<(u32, u32)> = declared
            .iter()
            .map(|i| (i.compute as u32, i.memory as u32))
            .collect();
        let mut sizes: Vec<(u32, u32)> = reported.iter().map(|(s, _)| *s).collect();
        declared.sort_unstable();
        sizes.sort_unstable();
        if declared != sizes {
            let names = |v: Vec<&str>| v.join(", ");
            return Err(ServiceError::FailedPrecondition(format!(
                "node {}: GPU {} has MIG instances [{}]; the inventory's layout lists [{}]",
                node.name,
                gpu.index,
                names(reported.iter().map(|(_, p)| *p).collect()),
                names(
                    topo.gpu_mig_instances(g)
                        .into_iter()
                        .flatten()
                        .map(|i| i.profile.as_str())
                        .collect()
                ),
            )));
        }
    }
    if undeclared.is_empty() {
        return Ok(());
    }
    // One suggested layout per distinct list of instances.
    let mut layouts: Vec<(Vec<u16>, Vec<String>)> = Vec::new();
    for (gpu, profiles) in undeclared {
        match layouts.iter_mut().find(|(_, p)| *p == profiles) {
            Some((gpus, _)) => gpus.push(gpu),
            None => layouts.push((vec![gpu], profiles)),
        }
    }
    let declare = layouts
        .iter()
        .map(|(gpus, profiles)| {
            format!("[[nodes.mig_layout]] gpus = {gpus:?}, instances = {profiles:?}")
        })
        .collect::<Vec<_>>()
        .join("; ");
    Err(ServiceError::FailedPrecondition(format!(
        "node {} reports the MIG instances an administrator made; the inventory leaves them to the scheduler, which would place MIG jobs of sizes the node has no instance of: declare in its node group {declare}",
        node.name
    )))
}

#[cfg(test)]
mod tests {
    use crate::service::config::ServiceConfig;
    use crate::service::testkit::{TWO_NODES, TestCore, node_info};

    use super::*;

    fn instance(gpu: u32, profile: &str, compute: u32, memory: u32) -> pb::MigInstanceInfo {
        pb::MigInstanceInfo {
            gpu,
            profile: profile.into(),
            size: Some(pb::MigProfile {
                compute_slices: compute,
                memory_slices: memory,
            }),
        }
    }

    /// n-0 with GPUs 1 and 5 in MIG mode reporting `instances`.
    fn register(test: &TestCore, instances: Vec<pb::MigInstanceInfo>) -> Result<(), String> {
        let req = pb::RegisterNodeRequest {
            node: Some(pb::NodeInfo {
                mig: Some(pb::MigModes { gpus: vec![1, 5] }),
                mig_layout: Some(pb::MigLayout { instances }),
                ..node_info(0)
            }),
            running: vec![],
            ..Default::default()
        };
        let mut inner = test.core.lock();
        inner.register(&req, 1).map(|_| ()).map_err(|e| {
            assert!(
                matches!(
                    e,
                    ServiceError::FailedPrecondition(_) | ServiceError::InvalidArgument(_)
                ),
                "{e:?}"
            );
            e.to_string()
        })
    }

    fn reported() -> Vec<pb::MigInstanceInfo> {
        vec![
            instance(1, "3g.40gb", 3, 4),
            instance(1, "1c.2g.20gb", 1, 2),
            instance(5, "3g.40gb", 3, 4),
            instance(5, "1c.2g.20gb", 1, 2),
        ]
    }

    #[test]
    fn reported_mig_instances_must_be_the_ones_the_inventory_lists() {
        let modes = TWO_NODES.replace("nvlink_domain = 8", "nvlink_domain = 8\nmig_gpus = [1, 5]");
        // Left to the scheduler: refused, with the layout to declare.
        let err =
            register(&TestCore::on(ServiceConfig::default(), &modes), reported()).unwrap_err();
        assert!(
            err.contains(r#"declare in its node group [[nodes.mig_layout]] gpus = [1, 5], instances = ["3g.40gb", "1c.2g.20gb"]"#),
            "{err}"
        );
        let mut split = reported();
        split[3] = instance(5, "1g.10gb", 1, 1);
        let err = register(&TestCore::on(ServiceConfig::default(), &modes), split).unwrap_err();
        assert!(
            err.contains(r#"[[nodes.mig_layout]] gpus = [1], instances = ["3g.40gb", "1c.2g.20gb"]; [[nodes.mig_layout]] gpus = [5], instances = ["3g.40gb", "1g.10gb"]"#),
            "{err}"
        );

        let declared = format!(
            "{modes}[[nodes.mig_layout]]\ngpus = [1, 5]\ninstances = [\"1c.2g.20gb\", \"3g.40gb\"]\n"
        );
        let test = TestCore::on(ServiceConfig::default(), &declared);
        // The same instances in another order match.
        register(&test, reported()).unwrap();
        // `reported()` with one change, refused with `says`.
        let refused = |change: &dyn Fn(&mut Vec<pb::MigInstanceInfo>), says: &str| {
            let mut instances = reported();
            change(&mut instances);
            let err = register(&test, instances).unwrap_err();
            assert!(err.contains(says), "{says}: {err}");
        };
        refused(
            &|i| i.truncate(3),
            "node n-0: GPU 5 has MIG instances [3g.40gb]; the inventory's layout lists [1c.2g.20gb, 3g.40gb]",
        );
        // A size the catalog does not make of the profile: the agent and the scheduler
        // would disagree about which jobs the instance serves.
        refused(
            &|i| i[1] = instance(1, "1c.2g.20gb", 2, 2),
            "GPU 1: MIG instance 1c.2g.20gb of 2 compute and 2 memory slices; the catalog's H100 makes it 1 and 2",
        );
        refused(
            &|i| i[0] = instance(1, "3g.47gb", 3, 4),
            "the catalog's H100 has no such profile",
        );
        // Malformed: an instance on a GPU out of MIG mode, or without a size.
        refused(
            &|i| i[0].gpu = 0,
            "node.mig_layout.instances[0].gpu: GPU 0 is not in MIG mode",
        );
        refused(&|i| i[2].size = None, "node.mig_layout.instances[2].size");
    }

    #[test]
    fn a_simulated_node_reports_the_inventory_layout_only_where_every_mig_gpu_has_one() {
        let spec = |layouts: &str| {
            format!(
                "{}{layouts}",
                TWO_NODES.replace("nvlink_domain = 8", "nvlink_domain = 8\nmig_gpus = [1, 5]")
            )
        };
        let topo = |layouts: &str| {
            Topology::build(&crate::domain::ClusterSpec::from_toml(&spec(layouts)).unwrap())
                .unwrap()
        };
        let both = topo("[[nodes.mig_layout]]\ngpus = [1, 5]\ninstances = [\"7g.80gb\"]\n");
        let layout = crate::service::convert::mig_layout(&both, NodeId(1)).unwrap();
        assert_eq!(
            layout.instances,
            vec![instance(1, "7g.80gb", 7, 8), instance(5, "7g.80gb", 7, 8)]
        );
        let one = topo("[[nodes.mig_layout]]\ngpus = [1]\ninstances = [\"7g.80gb\"]\n");
        assert_eq!(crate::service::convert::mig_layout(&one, NodeId(0)), None);
        assert_eq!(
            crate::service::convert::mig_layout(&topo(""), NodeId(0)),
            None
        );
    }
}
