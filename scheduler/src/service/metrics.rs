//! Prometheus metrics and the `/metrics` HTTP endpoint.

use std::sync::Arc;
use std::sync::atomic::AtomicU64;

use prometheus_client::encoding::text::encode;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::Histogram;
use prometheus_client::registry::Registry;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpListener;

type Labels = Vec<(&'static str, &'static str)>;

/// Labels of the per-RPC families (service, method, code: see `rpc_metrics`).
pub type RpcLabels = Vec<(&'static str, String)>;

#[derive(Debug)]
pub struct Metrics {
    registry: Registry,
    /// Job transitions by target state.
    pub transitions: Family<Labels, Counter>,
    /// Placement decisions by deciding path (heuristic, learned, fallback).
    pub decisions: Family<Labels, Counter>,
    pub submitted: Counter,
    pub preemptions: Counter,
    /// Running jobs moved to make room for a gang (`[rebalance]`).
    pub migrations: Counter,
    pub cycle_seconds: Histogram,
    pub submit_to_place_seconds: Histogram,
    pub commit_seconds: Histogram,
    pub queue_depth: Gauge,
    pub active_jobs: Gauge,
    pub allocated_milli: Gauge,
    pub capacity_milli: Gauge,
    pub schedulable_nodes: Gauge,
    /// Registered nodes whose agent missed the heartbeat timeout.
    pub unreachable_nodes: Gauge,
    pub reserved_nodes: Gauge,
    /// Jobs requeued because their node stayed unreachable past the grace period.
    pub node_lost_requeues: Counter,
    /// Stop confirmations a moved job's START waited for, by outcome (`confirmed`,
    /// `timed_out`), one per node (`service::stop_waits`).
    pub stop_waits: Family<Labels, Counter>,
    /// Placed jobs whose START is held until their stopped workers have ended.
    pub starts_held: Gauge,
    pub fallback_ratio: Gauge<f64, AtomicU64>,
    pub telemetry: Family<Labels, Counter>,
    /// Model (re)loads by outcome (`loaded`, `rejected`).
    pub model_reloads: Family<Labels, Counter>,
    /// Decision-log rows by outcome (`written`, `lost`) and failed file writes.
    pub decision_log_rows: Family<Labels, Counter>,
    pub decision_log_errors: Counter,
    pub decision_log_pruned: Counter,
    /// Accepts of gRPC connections that failed for want of resources (descriptors).
    pub accept_errors: Counter,
    /// Watch streams ended because the watcher fell behind, by watch (`jobs`,
    /// `assignments`).
    pub watchers_cut_off: Family<Labels, Counter>,
    /// gRPC calls by service, method and status code.
    pub rpc_handled: Family<RpcLabels, Counter>,
    /// gRPC call latency by service and method.
    pub rpc_seconds: Family<RpcLabels, Histogram, fn() -> Histogram>,
}

fn rpc_histogram() -> Histogram {
    Histogram::new(latency_buckets())
}

impl Default for Metrics {
    fn default() -> Self {
        Self::new()
    }
}

/// Exponential buckets from 10 µs to about 10 s.
fn latency_buckets() -> impl Iterator<Item = f64> {
    prometheus_client::metrics::histogram::exponential_buckets(1e-5, 2.0, 21)
}

/// Buckets for a job's wait in the queue, from 1 ms to about 3 days (×4 apart): an
/// uncontended placement takes milliseconds, a GPU job in a busy cluster waits hours,
/// and with [`latency_buckets`] every such wait fell into `+Inf`.
fn queue_wait_buckets() -> impl Iterator<Item = f64> {
    prometheus_client::metrics::histogram::exponential_buckets(1e-3, 4.0, 15)
}

impl Metrics {
    pub fn new() -> Self {
        let mut registry = Registry::with_prefix("marshal");
        let m = Metrics {
            transitions: Family::default(),
            decisions: Family::default(),
            submitted: Counter::default(),
            preemptions: Counter::default(),
            migrations: Counter::default(),
            cycle_seconds: Histogram::new(latency_buckets()),
            submit_to_place_seconds: Histogram::new(queue_wait_buckets()),
            commit_seconds: Histogram::new(latency_buckets()),
            queue_depth: Gauge::default(),
            active_jobs: Gauge::default(),
            allocated_milli: Gauge::default(),
            capacity_milli: Gauge::default(),
            schedulable_nodes: Gauge::default(),
            unreachable_nodes: Gauge::default(),
            reserved_nodes: Gauge::default(),
            node_lost_requeues: Counter::default(),
            stop_waits: Family::default(),
            starts_held: Gauge::default(),
            fallback_ratio: Gauge::default(),
            telemetry: Family::default(),
            model_reloads: Family::default(),
            decision_log_rows: Family::default(),
            decision_log_errors: Counter::default(),
            decision_log_pruned: Counter::default(),
            accept_errors: Counter::default(),
            watchers_cut_off: Family::default(),
            rpc_handled: Family::default(),
            rpc_seconds: Family::new_with_constructor(rpc_histogram as fn() -> Histogram),
            registry: Registry::default(),
        };
        registry.register(
            "job_transitions",
            "Job state transitions, by the state entered",
            m.transitions.clone(),
        );
        registry.register(
            "decisions",
            "Placement and rejection decisions, by the path that decided (heuristic, learned, fallback)",
            m.decisions.clone(),
        );
        registry.register("jobs_submitted", "Jobs accepted", m.submitted.clone());
        registry.register(
            "preemptions",
            "Running jobs evicted by the policy",
            m.preemptions.clone(),
        );
        registry.register(
            "migrations",
            "Running jobs moved (stopped and started elsewhere) so that a gang blocked by fragmentation fits ([rebalance])",
            m.migrations.clone(),
        );
        registry.register(
            "accept_errors",
            "gRPC connection accepts that failed for want of resources (EMFILE: at the open-file limit), each retried after 100 ms",
            m.accept_errors.clone(),
        );
        registry.register(
            "watchers_cut_off",
            "Watch streams ended (RESOURCE_EXHAUSTED) because their watcher fell behind, by watch: jobs (WatchEvents), assignments (an agent's WatchAssignments)",
            m.watchers_cut_off.clone(),
        );
        registry.register(
            "grpc_server_handled",
            "gRPC calls, by service, method and status code (a stream's when it opens; unary OK is read from the absence of an error status in the headers)",
            m.rpc_handled.clone(),
        );
        registry.register(
            "grpc_server_handling_seconds",
            "gRPC call latency until the response headers (a stream: until it opens), by service and method",
            m.rpc_seconds.clone(),
        );
        registry.register(
            "cycle_duration_seconds",
            "Wall time of one scheduling cycle (order, filter, place, preempt)",
            m.cycle_seconds.clone(),
        );
        registry.register(
            "submit_to_place_seconds",
            "From a job's submission to its placement (queueing included)",
            m.submit_to_place_seconds.clone(),
        );
        registry.register(
            "commit_duration_seconds",
            "Wall time of one durable group commit",
            m.commit_seconds.clone(),
        );
        registry.register(
            "queue_depth",
            "Jobs waiting for a placement",
            m.queue_depth.clone(),
        );
        registry.register(
            "active_jobs",
            "Jobs placed or running",
            m.active_jobs.clone(),
        );
        registry.register(
            "gpu_allocated_milli",
            "GPUs allocated, in thousandths",
            m.allocated_milli.clone(),
        );
        registry.register(
            "gpu_capacity_milli",
            "GPUs in the inventory, in thousandths",
            m.capacity_milli.clone(),
        );
        registry.register(
            "schedulable_nodes",
            "Nodes registered and neither cordoned, quarantined nor unreachable",
            m.schedulable_nodes.clone(),
        );
        registry.register(
            "unreachable_nodes",
            "Registered nodes whose agent has not been heard from for node_timeout_ms",
            m.unreachable_nodes.clone(),
        );
        registry.register(
            "reserved_nodes",
            "Nodes held in the last cycle for a gang that waited too long ([reservation])",
            m.reserved_nodes.clone(),
        );
        registry.register(
            "node_lost_requeues",
            "Jobs requeued because their node stayed unreachable past node_grace_ms",
            m.node_lost_requeues.clone(),
        );
        registry.register(
            "stop_waits",
            "Confirmations that a moved job's stopped workers ended, waited for before starting it elsewhere, by outcome (confirmed, timed_out), one per node",
            m.stop_waits.clone(),
        );
        registry.register(
            "starts_held",
            "Placed jobs whose START waits for their stopped workers to end",
            m.starts_held.clone(),
        );
        registry.register(
            "fallback_ratio",
            "Share of learned-policy decisions taken by the fallback heuristic (0 when a heuristic policy decides everything)",
            m.fallback_ratio.clone(),
        );
        registry.register(
            "model_reloads",
            "Learned-model loads after start, by outcome (loaded, rejected: the current model was kept)",
            m.model_reloads.clone(),
        );
        registry.register(
            "decision_log_rows",
            "Decision-log rows, by outcome (written, lost)",
            m.decision_log_rows.clone(),
        );
        registry.register(
            "decision_log_write_errors",
            "Decision-log files that could not be written",
            m.decision_log_errors.clone(),
        );
        registry.register(
            "decision_log_files_pruned",
            "Decision-log files deleted by decision_log_retention_s",
            m.decision_log_pruned.clone(),
        );
        registry.register(
            "telemetry_samples",
            "Telemetry samples received, by outcome",
            m.telemetry.clone(),
        );
        Metrics { registry, ..m }
    }

    pub fn transition(&self, state: &'static str) {
        self.transitions
            .get_or_create(&vec![("state", state)])
            .inc();
    }

    pub fn decision(&self, path: &'static str) {
        self.decisions.get_or_create(&vec![("path", path)]).inc();
        let learned = self
            .decisions
            .get_or_create(&vec![("path", "learned")])
            .get();
        let fallback = self
            .decisions
            .get_or_create(&vec![("path", "fallback")])
            .get();
        if learned + fallback > 0 {
            self.fallback_ratio
                .set(fallback as f64 / (learned + fallback) as f64);
        }
    }

    pub fn render(&self) -> String {
        render(&self.registry)
    }
}

/// The registry in the Prometheus text format.
pub fn render(registry: &Registry) -> String {
    let mut out = String::new();
    // Writing into a String cannot fail.
    let _ = encode(&mut out, registry);
    out
}

/// What [`serve_metrics`] serves: the scheduler's metrics, or the agent's.
pub trait Render: Send + Sync + 'static {
    fn render(&self) -> String;
}

impl Render for Metrics {
    fn render(&self) -> String {
        Metrics::render(self)
    }
}

/// Serves `GET /metrics` until the listener's task is dropped. A deliberately small
/// How long one metrics connection may take, request and reply together.
pub const METRICS_CONNECTION_DEADLINE: std::time::Duration = std::time::Duration::from_secs(10);
/// Metrics connections served at once; more wait in the listen backlog.
pub const METRICS_MAX_CONNECTIONS: usize = 64;

/// HTTP/1.1 responder: one request per connection, headers capped at 8 KiB.
pub async fn serve_metrics<R: Render>(listener: TcpListener, metrics: Arc<R>) {
    serve_metrics_within(listener, metrics, METRICS_CONNECTION_DEADLINE).await
}

/// [`serve_metrics`] with each connection cut off after `deadline` (a client that
/// dribbles a byte every few seconds would otherwise hold its connection for hours),
/// at most [`METRICS_MAX_CONNECTIONS`] at once, and a pause after a failed accept (out
/// of file descriptors, the loop would otherwise spin a core).
pub async fn serve_metrics_within<R: Render>(
    listener: TcpListener,
    metrics: Arc<R>,
    deadline: std::time::Duration,
) {
    let slots = Arc::new(tokio::sync::Semaphore::new(METRICS_MAX_CONNECTIONS));
    loop {
        let Ok(slot) = slots.clone().acquire_owned().await else {
            return;
        };
        let mut socket = match listener.accept().await {
            Ok((socket, _peer)) => socket,
            Err(e) => {
                tracing::warn!(error = %e, "metrics endpoint: accept failed");
                tokio::time::sleep(std::time::Duration::from_millis(100)).await;
                continue;
            }
        };
        let metrics = metrics.clone();
        tokio::spawn(async move {
            let _slot = slot;
            let _ = tokio::time::timeout(deadline, answer(&mut socket, metrics.as_ref())).await;
        });
    }
}

async fn answer(socket: &mut tokio::net::TcpStream, metrics: &impl Render) {
    let mut buf = vec![0u8; 8192];
    let mut len = 0;
    while len < buf.len() {
        match socket.read(&mut buf[len..]).await {
            Ok(0) | Err(_) => break,
            Ok(n) => len += n,
        }
        if buf[..len].windows(4).any(|w| w == b"\r\n\r\n") {
            break;
        }
    }
    let head = String::from_utf8_lossy(&buf[..len]);
    let (status, ctype, body) = if head.starts_with("GET /metrics ") {
        (
            "200 OK",
            "application/openmetrics-text; version=1.0.0; charset=utf-8",
            metrics.render(),
        )
    } else {
        (
            "404 Not Found",
            "text/plain",
            "try GET /metrics\n".to_string(),
        )
    };
    let reply = format!(
        "HTTP/1.1 {status}\r\nContent-Type: {ctype}\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    );
    let _ = socket.write_all(reply.as_bytes()).await;
    let _ = socket.shutdown().await;
}

#[cfg(test)]
mod tests {
    use std::time::{Duration, Instant};

    use super::*;

    #[test]
    fn a_wait_of_hours_lands_in_a_bucket_of_its_own() {
        let m = Metrics::new();
        for wait_s in [0.002, 3600.0, 2.0 * 86_400.0] {
            m.submit_to_place_seconds.observe(wait_s);
        }
        let text = m.render();
        // (upper bound, cumulative count) per bucket line.
        let buckets: Vec<(f64, u64)> = text
            .lines()
            .filter_map(|l| l.strip_prefix("marshal_submit_to_place_seconds_bucket{le=\""))
            .map(|l| {
                let (le, count) = l.split_once("\"} ").unwrap();
                (le.parse().unwrap(), count.trim().parse().unwrap())
            })
            .collect();
        let bucket = |le: f64| -> u64 {
            buckets
                .iter()
                .find(|(b, _)| {
                    if le.is_infinite() {
                        b.is_infinite()
                    } else {
                        (b - le).abs() <= le * 1e-9
                    }
                })
                .unwrap_or_else(|| panic!("no bucket le={le} in\n{text}"))
                .1
        };
        // 1 ms ×4ⁿ: an hour lies between 4⁹ and 4¹⁰ ms, two days below 4¹⁴ ms.
        assert_eq!(bucket(0.004), 1);
        assert_eq!(bucket(262.144), 1);
        assert_eq!(bucket(4194.304), 2);
        assert_eq!(bucket(268_435.456), 3);
        assert_eq!(bucket(f64::INFINITY), 3);
    }

    #[test]
    fn a_client_that_never_finishes_its_request_is_cut_off_and_others_are_answered() {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        runtime.block_on(async {
            let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
            let addr = listener.local_addr().unwrap();
            let deadline = Duration::from_millis(300);
            tokio::spawn(serve_metrics_within(
                listener,
                Arc::new(Metrics::new()),
                deadline,
            ));
            // Half a request line, then silence.
            let mut slow = tokio::net::TcpStream::connect(addr).await.unwrap();
            slow.write_all(b"GET /metr").await.unwrap();
            let started = Instant::now();
            let mut rest = Vec::new();
            let closed =
                tokio::time::timeout(Duration::from_secs(5), slow.read_to_end(&mut rest)).await;
            assert!(
                closed.is_ok(),
                "the slow connection was still open after 5 s"
            );
            assert!(started.elapsed() >= deadline / 2, "{:?}", started.elapsed());
            // A whole request is answered.
            let mut ok = tokio::net::TcpStream::connect(addr).await.unwrap();
            ok.write_all(b"GET /metrics HTTP/1.1\r\n\r\n")
                .await
                .unwrap();
            let mut reply = Vec::new();
            ok.read_to_end(&mut reply).await.unwrap();
            assert!(String::from_utf8_lossy(&reply).starts_with("HTTP/1.1 200 OK"));
        });
    }
}
