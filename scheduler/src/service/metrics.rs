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
    pub fallback_ratio: Gauge<f64, AtomicU64>,
    pub telemetry: Family<Labels, Counter>,
    /// Model (re)loads by outcome (`loaded`, `rejected`).
    pub model_reloads: Family<Labels, Counter>,
    /// Decision-log rows by outcome (`written`, `lost`) and failed file writes.
    pub decision_log_rows: Family<Labels, Counter>,
    pub decision_log_errors: Counter,
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
            submit_to_place_seconds: Histogram::new(latency_buckets()),
            commit_seconds: Histogram::new(latency_buckets()),
            queue_depth: Gauge::default(),
            active_jobs: Gauge::default(),
            allocated_milli: Gauge::default(),
            capacity_milli: Gauge::default(),
            schedulable_nodes: Gauge::default(),
            unreachable_nodes: Gauge::default(),
            reserved_nodes: Gauge::default(),
            node_lost_requeues: Counter::default(),
            fallback_ratio: Gauge::default(),
            telemetry: Family::default(),
            model_reloads: Family::default(),
            decision_log_rows: Family::default(),
            decision_log_errors: Counter::default(),
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
        let mut out = String::new();
        // Writing into a String cannot fail.
        let _ = encode(&mut out, &self.registry);
        out
    }
}

/// Serves `GET /metrics` until the listener's task is dropped. A deliberately small
/// HTTP/1.1 responder: one request per connection, headers capped at 8 KiB.
pub async fn serve_metrics(listener: TcpListener, metrics: Arc<Metrics>) {
    loop {
        let Ok((mut socket, _peer)) = listener.accept().await else {
            continue;
        };
        let metrics = metrics.clone();
        tokio::spawn(async move {
            let mut buf = vec![0u8; 8192];
            let mut len = 0;
            while len < buf.len() {
                match tokio::time::timeout(
                    std::time::Duration::from_secs(5),
                    socket.read(&mut buf[len..]),
                )
                .await
                {
                    Ok(Ok(0)) | Err(_) | Ok(Err(_)) => break,
                    Ok(Ok(n)) => len += n,
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
        });
    }
}
