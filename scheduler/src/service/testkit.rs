//! A service core on a small cluster and a temporary database, for unit tests of the
//! transitions.

use std::sync::Arc;

use crate::domain::{ClusterSpec, NodeId};
use crate::service::config::ServiceConfig;
use crate::service::core::{Core, Inner};
use crate::service::metrics::Metrics;
use crate::service::model::NoModel;
use crate::service::pb;
use crate::service::store::Store;

/// Two nodes of 8 H100s, one NVLink island each.
pub const TWO_NODES: &str = r#"
name = "two"
[[nodes]]
count = 2
name_prefix = "n"
gpu_model = "H100"
gpus = 8
nvlink_domain = 8
cpu_milli = 224000
memory_mib = 2097152
"#;

/// What agent `i` of [`TWO_NODES`] says at registration.
pub fn node_info(i: usize) -> pb::NodeInfo {
    pb::NodeInfo {
        name: format!("n-{i}"),
        gpu_model: "H100".into(),
        gpus: 8,
        nvlink_domain: 8,
        cpu_milli: 224_000,
        memory_mib: 2_097_152,
        mig: None,
        mig_layout: None,
    }
}

/// A restored core over [`TWO_NODES`]; the database directory goes with it.
pub struct TestCore {
    pub core: Core,
    // Held so the directory outlives the core's database; removed on drop. A name made
    // of the process id and a clock reading once collided between two parallel tests.
    _dir: tempfile::TempDir,
}

impl TestCore {
    pub fn new(config: ServiceConfig) -> Self {
        Self::on(config, TWO_NODES)
    }

    /// A restored core over the inventory `cluster` (TOML).
    pub fn on(config: ServiceConfig, cluster: &str) -> Self {
        let dir = tempfile::Builder::new()
            .prefix("marshal-service-test-")
            .tempdir()
            .unwrap();
        let config = ServiceConfig {
            db: dir.path().join("db.redb"),
            ..config
        };
        let spec = ClusterSpec::from_toml(cluster).unwrap();
        let store = Arc::new(Store::open(&config.db, false).unwrap());
        let core = Core::restore(
            &config,
            &spec,
            store,
            Arc::new(Metrics::new()),
            Arc::new(NoModel),
        )
        .unwrap();
        TestCore { core, _dir: dir }
    }

    /// A core restored from this one's database, as a restarted server would be (on
    /// [`TWO_NODES`]).
    pub fn restart(&self, config: ServiceConfig) -> Core {
        Core::restore(
            &ServiceConfig {
                db: std::path::PathBuf::from("unused.redb"),
                ..config
            },
            &ClusterSpec::from_toml(TWO_NODES).unwrap(),
            self.core.store.clone(),
            Arc::new(Metrics::new()),
            Arc::new(NoModel),
        )
        .unwrap()
    }

    /// The core, shared (as the server holds it), and the directory to keep.
    pub fn shared(self) -> (Arc<Core>, tempfile::TempDir) {
        (Arc::new(self.core), self._dir)
    }
}

/// Registers both nodes at `t0` with nothing running.
pub fn register_both(inner: &mut Inner, t0: i64) {
    for i in 0..2 {
        let req = pb::RegisterNodeRequest {
            node: Some(node_info(i)),
            running: vec![],
            ..Default::default()
        };
        inner.register(&req, t0).unwrap();
        inner.heard_from(NodeId(i as u32), t0);
    }
}

/// A job of `workers` workers with `gpus` whole GPUs each.
pub fn whole_gpu_job(workers: u32, gpus: u32) -> pb::JobSpec {
    pb::JobSpec {
        workers,
        gpu: Some(pb::GpuDemand {
            kind: Some(pb::gpu_demand::Kind::Whole(gpus)),
        }),
        ..Default::default()
    }
}
