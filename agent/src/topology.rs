//! What NVML discovered on a node, in the scheduler's terms: a [`NodeGroupSpec`] of one
//! node (GPU model, GPU count, NVLink island size).
//!
//! - **GPU model**: the catalog entry the NVML product name and memory size point to
//!   (`NVIDIA H100 80GB HBM3` → `H100`, `NVIDIA A100-SXM4-40GB` → `A100-40`,
//!   `Tesla V100-SXM2-32GB` → `V100M32`); an unknown product is an error naming it, so
//!   the operator can add it to the catalog rather than be scheduled as the wrong GPU.
//!   A node with two different GPU products is refused for the same reason.
//! - **NVLink islands**: the connected components of the NVLink graph (pairs at
//!   [`Level::NvLink`]); the scheduler's topology needs one island size per node, so
//!   islands of unequal size are refused.

use std::collections::BTreeMap;

use marshal_scheduler::domain::{GpuCatalog, MigLayoutSpec, NodeGroupSpec};
use marshal_scheduler::service::pb;
use marshal_telemetry::{DiscoveredTopology, Level, MigInstance};

use crate::AgentError;

/// Catalog name of an NVML product name with `memory_total` bytes installed.
pub fn catalog_model(
    name: &str,
    memory_total: u64,
    catalog: &GpuCatalog,
) -> Result<String, AgentError> {
    let n = name.to_ascii_uppercase();
    let gib = memory_total as f64 / (1u64 << 30) as f64;
    let candidate = if n.contains("H200") {
        "H200"
    } else if n.contains("H100") {
        "H100"
    } else if n.contains("A100") {
        if gib > 48.0 { "A100-80" } else { "A100-40" }
    } else if n.contains("V100") {
        if gib > 20.0 { "V100M32" } else { "V100M16" }
    } else if n.contains("P100") {
        "P100"
    } else if n.contains("P40") {
        "P40"
    } else if n.contains("K80") {
        "K80"
    } else if n.contains("T4") {
        "T4"
    } else if n.contains("L4") {
        "L4"
    } else if n.contains("A10") {
        "A10"
    } else {
        ""
    };
    if !candidate.is_empty() && catalog.id(candidate).is_some() {
        return Ok(candidate.to_string());
    }
    Err(AgentError::Config(format!(
        "GPU product {name:?} ({gib:.0} GiB) matches no GPU model of the catalog; add it to the cluster's [[gpu_models]]"
    )))
}

/// The node as the scheduler models it.
pub fn node_spec(
    discovered: &DiscoveredTopology,
    node_name: &str,
    cpu_milli: u32,
    memory_mib: u64,
    catalog: &GpuCatalog,
) -> Result<NodeGroupSpec, AgentError> {
    let mut models = discovered
        .gpus
        .iter()
        .map(|g| catalog_model(&g.name, g.memory_total, catalog))
        .collect::<Result<Vec<_>, _>>()?;
    models.dedup();
    if models.len() > 1 {
        return Err(AgentError::Config(format!(
            "node {node_name} mixes GPU models {models:?}"
        )));
    }
    let count = discovered.gpus.len();
    let index_of: BTreeMap<u32, usize> = discovered
        .gpus
        .iter()
        .enumerate()
        .map(|(i, g)| (g.index, i))
        .collect();
    // Union-find over NVLink pairs.
    let mut parent: Vec<usize> = (0..count).collect();
    fn root(parent: &mut [usize], mut i: usize) -> usize {
        while parent[i] != i {
            parent[i] = parent[parent[i]];
            i = parent[i];
        }
        i
    }
    for p in discovered.pairs.iter().filter(|p| p.level == Level::NvLink) {
        if let (Some(&a), Some(&b)) = (index_of.get(&p.a), index_of.get(&p.b)) {
            let (ra, rb) = (root(&mut parent, a), root(&mut parent, b));
            parent[ra] = rb;
        }
    }
    let mut sizes: BTreeMap<usize, u16> = BTreeMap::new();
    for i in 0..count {
        *sizes.entry(root(&mut parent, i)).or_default() += 1;
    }
    let mut island_sizes: Vec<u16> = sizes.into_values().collect();
    island_sizes.dedup();
    if island_sizes.len() > 1 {
        return Err(AgentError::Config(format!(
            "node {node_name} has NVLink islands of unequal sizes {island_sizes:?}"
        )));
    }
    let island = island_sizes.first().copied().unwrap_or(0);
    // Positions, not NVML indices: the scheduler numbers a node's GPUs 0.. in the order
    // NVML enumerates them, as CUDA_VISIBLE_DEVICES does.
    let mig_gpus = discovered
        .gpus
        .iter()
        .enumerate()
        .filter(|(_, g)| g.mig_mode)
        .map(|(i, _)| i as u16)
        .collect();
    Ok(NodeGroupSpec {
        count: 1,
        name_prefix: None,
        names: vec![node_name.to_string()],
        gpu_model: models.into_iter().next(),
        gpus: count as u16,
        nvlink_domain: if island > 1 { island } else { 0 },
        cpu_milli,
        memory_mib,
        mig_gpus: Some(mig_gpus),
        mig_layout: Vec::new(),
    })
}

/// The MIG layouts of a node whose GPUs in MIG mode are `mig_gpus` and whose MIG
/// devices are `instances` (as NVML lists them): one layout per distinct list of
/// profiles, so that the spec reads as an administrator would write it. A GPU in MIG
/// mode without an instance gets an empty layout: it holds nothing until one is made.
pub fn mig_layout_spec(mig_gpus: &[u16], instances: &[MigInstance]) -> Vec<MigLayoutSpec> {
    let mut layouts: Vec<MigLayoutSpec> = Vec::new();
    for &gpu in mig_gpus {
        let profiles: Vec<String> = instances
            .iter()
            .filter(|i| i.gpu == gpu as u32)
            .map(|i| i.profile.clone())
            .collect();
        match layouts.iter_mut().find(|l| l.instances == profiles) {
            Some(layout) => layout.gpus.push(gpu),
            None => layouts.push(MigLayoutSpec {
                gpus: vec![gpu],
                instances: profiles,
            }),
        }
    }
    layouts
}

/// The MIG devices for registration, with the sizes this agent will hand them out as.
pub fn mig_layout(instances: &[MigInstance]) -> pb::MigLayout {
    pb::MigLayout {
        instances: instances
            .iter()
            .map(|i| pb::MigInstanceInfo {
                gpu: i.gpu,
                profile: i.profile.clone(),
                size: Some(pb::MigProfile {
                    compute_slices: i.compute as u32,
                    memory_slices: i.memory as u32,
                }),
            })
            .collect(),
    }
}

/// The registration message for a one-node spec (what [`node_spec`] discovered, or a
/// simulated node taken from the cluster inventory), without MIG instances: an agent
/// that lists them sets `mig_layout` ([`mig_layout`]).
pub fn node_info(spec: &NodeGroupSpec) -> Result<pb::NodeInfo, AgentError> {
    let name = match spec.names.as_slice() {
        [name] => name.clone(),
        names => {
            return Err(AgentError::Config(format!(
                "a node spec for registration names exactly one node, not {names:?}"
            )));
        }
    };
    Ok(pb::NodeInfo {
        name,
        gpu_model: spec.gpu_model.clone().unwrap_or_default(),
        gpus: spec.gpus as u32,
        nvlink_domain: spec.nvlink_domain as u32,
        cpu_milli: spec.cpu_milli,
        memory_mib: spec.memory_mib,
        mig: spec.mig_gpus.as_ref().map(|gpus| pb::MigModes {
            gpus: gpus.iter().map(|&g| g as u32).collect(),
        }),
        mig_layout: None,
    })
}

/// The registration message for node `name` of an inventory (the simulated source:
/// the node stands for the inventory's entry, so it reports exactly that).
pub fn inventory_node(
    topo: &marshal_scheduler::domain::Topology,
    name: &str,
) -> Result<pb::NodeInfo, AgentError> {
    let n = topo
        .node_ids()
        .find(|&n| topo.node(n).name == name)
        .ok_or_else(|| {
            AgentError::Config(format!("node {name:?} is not in cluster {}", topo.name))
        })?;
    let node = topo.node(n);
    Ok(pb::NodeInfo {
        name: node.name.clone(),
        gpu_model: node
            .model
            .map(|m| topo.catalog.get(m).name.clone())
            .unwrap_or_default(),
        gpus: node.gpu_count() as u32,
        nvlink_domain: if node.island_size > 1 {
            node.island_size as u32
        } else {
            0
        },
        cpu_milli: node.cpu_milli,
        memory_mib: node.memory_mib,
        mig: marshal_scheduler::service::convert::mig_modes(topo, n),
        mig_layout: marshal_scheduler::service::convert::mig_layout(topo, n),
    })
}

#[cfg(test)]
mod tests {
    use marshal_telemetry::nvml::{DiscoveredGpu, GpuPair};

    use super::*;

    fn gpu(index: u32, name: &str, gib: u64) -> DiscoveredGpu {
        DiscoveredGpu {
            index,
            uuid: format!("GPU-{index}"),
            name: name.into(),
            memory_total: gib << 30,
            pci_bus_id: format!("00000000:{index:02x}:00.0"),
            mig_mode: false,
        }
    }

    fn pairs(n: u32, nvlink: impl Fn(u32, u32) -> bool) -> Vec<GpuPair> {
        let mut v = Vec::new();
        for a in 0..n {
            for b in a + 1..n {
                v.push(GpuPair {
                    a,
                    b,
                    level: if nvlink(a, b) {
                        Level::NvLink
                    } else {
                        Level::System
                    },
                });
            }
        }
        v
    }

    #[test]
    fn an_nvswitch_node_is_one_island_of_its_model() {
        let catalog = GpuCatalog::default();
        let t = DiscoveredTopology {
            gpus: (0..8)
                .map(|i| gpu(i, "NVIDIA H100 80GB HBM3", 80))
                .collect(),
            pairs: pairs(8, |_, _| true),
            nvlink_peers: vec![],
        };
        let spec = node_spec(&t, "dgx-0", 224_000, 2 << 20, &catalog).unwrap();
        assert_eq!(
            (spec.gpu_model.as_deref(), spec.gpus, spec.nvlink_domain),
            (Some("H100"), 8, 8)
        );
        // Two 4-GPU NVLink islands (a V100 hybrid cube mesh split by PCIe).
        let t = DiscoveredTopology {
            gpus: (0..8).map(|i| gpu(i, "Tesla V100-SXM2-32GB", 32)).collect(),
            pairs: pairs(8, |a, b| a / 4 == b / 4),
            nvlink_peers: vec![],
        };
        let spec = node_spec(&t, "n", 1, 1, &catalog).unwrap();
        assert_eq!(
            (spec.gpu_model.as_deref(), spec.nvlink_domain),
            (Some("V100M32"), 4)
        );
        // PCIe only.
        let t = DiscoveredTopology {
            gpus: (0..4).map(|i| gpu(i, "Tesla T4", 15)).collect(),
            pairs: pairs(4, |_, _| false),
            nvlink_peers: vec![],
        };
        assert_eq!(node_spec(&t, "n", 1, 1, &catalog).unwrap().nvlink_domain, 0);
    }

    #[test]
    fn unknown_products_mixed_models_and_uneven_islands_are_refused() {
        let catalog = GpuCatalog::default();
        assert!(
            catalog_model("Radeon Instinct MI300X", 192 << 30, &catalog)
                .unwrap_err()
                .to_string()
                .contains("MI300X")
        );
        assert_eq!(
            catalog_model("NVIDIA A100-SXM4-40GB", 40 << 30, &catalog).unwrap(),
            "A100-40"
        );
        assert_eq!(
            catalog_model("NVIDIA A100-SXM4-80GB", 80 << 30, &catalog).unwrap(),
            "A100-80"
        );
        let mixed = DiscoveredTopology {
            gpus: vec![gpu(0, "Tesla T4", 15), gpu(1, "NVIDIA L4", 24)],
            pairs: pairs(2, |_, _| false),
            nvlink_peers: vec![],
        };
        assert!(node_spec(&mixed, "n", 1, 1, &catalog).is_err());
        let uneven = DiscoveredTopology {
            gpus: (0..3)
                .map(|i| gpu(i, "NVIDIA H100 80GB HBM3", 80))
                .collect(),
            pairs: pairs(3, |a, b| a == 0 && b == 1),
            nvlink_peers: vec![],
        };
        assert!(
            node_spec(&uneven, "n", 1, 1, &catalog)
                .unwrap_err()
                .to_string()
                .contains("unequal")
        );
    }

    #[test]
    fn mig_devices_become_one_layout_per_distinct_list_of_profiles() {
        let instance = |gpu, profile: &str| MigInstance {
            gpu,
            uuid: format!("MIG-{gpu}-{profile}"),
            profile: profile.into(),
            compute: 1,
            memory: 1,
        };
        let instances = [
            instance(0, "3g.40gb"),
            instance(0, "1g.10gb"),
            instance(2, "3g.40gb"),
            instance(2, "1g.10gb"),
            instance(3, "7g.80gb"),
        ];
        let layouts = mig_layout_spec(&[0, 2, 3, 5], &instances);
        let layout = |gpus: &[u16], profiles: &[&str]| MigLayoutSpec {
            gpus: gpus.to_vec(),
            instances: profiles.iter().map(|p| p.to_string()).collect(),
        };
        assert_eq!(
            layouts,
            vec![
                layout(&[0, 2], &["3g.40gb", "1g.10gb"]),
                layout(&[3], &["7g.80gb"]),
                layout(&[5], &[]),
            ]
        );
        let wire = mig_layout(&instances[..1]);
        assert_eq!(wire.instances[0].profile, "3g.40gb");
        assert_eq!(
            wire.instances[0].size,
            Some(pb::MigProfile {
                compute_slices: 1,
                memory_slices: 1
            })
        );
    }
}
