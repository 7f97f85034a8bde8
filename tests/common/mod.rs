//! Helpers shared by the end-to-end tests.

use std::process::{Command, Output};

/// Runs the `marshal` binary with `args`.
pub fn marshal(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_marshal"))
        .args(args)
        .output()
        .expect("marshal runs")
}

/// Runs `marshal args`, asserts it succeeded and returns its stdout.
#[allow(dead_code)] // not every test file uses every helper
pub fn stdout_of(args: &[&str]) -> String {
    let out = marshal(args);
    assert!(
        out.status.success(),
        "marshal {args:?} failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).expect("stdout is UTF-8")
}

/// Runs `marshal args`, asserts it failed and that its error mentions `needle`.
#[allow(dead_code)] // not every test file uses every helper
pub fn fails_with(args: &[&str], needle: &str) {
    let out = marshal(args);
    assert!(!out.status.success(), "marshal {args:?} should have failed");
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains(needle),
        "marshal {args:?}: {err:?} lacks {needle:?}"
    );
}

/// Three nodes of 8 H100s, two per rack: the cluster the service, agent and model tests
/// run against.
#[allow(dead_code)]
pub const THREE_NODES: &str = r#"
name = "three-nodes"
nodes_per_rack = 2

[[nodes]]
count = 3
name_prefix = "n"
gpu_model = "H100"
gpus = 8
nvlink_domain = 8
cpu_milli = 224000
memory_mib = 2097152
"#;

/// [`THREE_NODES`] as a spec.
#[allow(dead_code)]
pub fn three_nodes() -> marshal_scheduler::domain::ClusterSpec {
    marshal_scheduler::domain::ClusterSpec::from_toml(THREE_NODES).unwrap()
}

/// The inventory entry of node `n-{i}` of [`THREE_NODES`], as its agent registers it.
#[allow(dead_code)]
pub fn node_info(i: usize) -> marshal_scheduler::service::pb::NodeInfo {
    marshal_scheduler::service::pb::NodeInfo {
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

/// `GET path` at `addr` over HTTP/1.1, the whole reply; empty while nothing listens there.
#[allow(dead_code)]
pub async fn http_get(addr: std::net::SocketAddr, path: &str) -> String {
    use marshal_scheduler::service::tokio;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let Ok(mut s) = tokio::net::TcpStream::connect(addr).await else {
        return String::new();
    };
    let _ = s
        .write_all(format!("GET {path} HTTP/1.1\r\nHost: x\r\n\r\n").as_bytes())
        .await;
    let mut out = String::new();
    let _ = s.read_to_string(&mut out).await;
    out
}
