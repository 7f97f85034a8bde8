//! The connected agent's Prometheus metrics (`marshal agent --metrics-listen ADDR`),
//! read from [`Counters`] and the telemetry [`Backlog`] at each scrape: what the agent
//! counts is counted in one place, and a scrape costs nothing between scrapes.
//!
//! Every series carries the node's name (`node`), so that series scraped from many
//! agents without relabelling stay apart.

use std::sync::Arc;
use std::sync::atomic::Ordering;

use marshal_scheduler::service::metrics::{Render, render};
use prometheus_client::collector::Collector;
use prometheus_client::encoding::{DescriptorEncoder, EncodeMetric};
use prometheus_client::metrics::MetricType;
use prometheus_client::metrics::counter::ConstCounter;
use prometheus_client::metrics::gauge::ConstGauge;
use prometheus_client::registry::Registry;

use crate::connected::{Backlog, Counters};

/// The agent's registry: prefix `marshal_agent_`, label `node`.
#[derive(Debug)]
pub struct AgentMetrics {
    registry: Registry,
}

impl AgentMetrics {
    pub fn new(node: &str, counters: Arc<Counters>, backlog: Arc<Backlog>) -> Self {
        let mut registry = Registry::with_prefix_and_labels(
            "marshal_agent",
            [("node".into(), node.to_string().into())].into_iter(),
        );
        registry.register_collector(Box::new(Scrape { counters, backlog }));
        AgentMetrics { registry }
    }
}

impl Render for AgentMetrics {
    fn render(&self) -> String {
        render(&self.registry)
    }
}

#[derive(Debug)]
struct Scrape {
    counters: Arc<Counters>,
    backlog: Arc<Backlog>,
}

fn counter(
    encoder: &mut DescriptorEncoder,
    name: &str,
    help: &str,
    value: u64,
) -> Result<(), std::fmt::Error> {
    let c = ConstCounter::new(value);
    c.encode(encoder.encode_descriptor(name, help, None, c.metric_type())?)
}

fn gauge(
    encoder: &mut DescriptorEncoder,
    name: &str,
    help: &str,
    value: u64,
) -> Result<(), std::fmt::Error> {
    let g = ConstGauge::new(i64::try_from(value).unwrap_or(i64::MAX));
    g.encode(encoder.encode_descriptor(name, help, None, g.metric_type())?)
}

impl Collector for Scrape {
    fn encode(&self, mut encoder: DescriptorEncoder) -> Result<(), std::fmt::Error> {
        let s = self.counters.snapshot(&self.backlog);
        let c = &self.counters;
        let e = &mut encoder;
        counter(
            e,
            "sessions",
            "Sessions with the scheduler begun (each connection and registration attempt)",
            s.sessions,
        )?;
        counter(
            e,
            "registrations",
            "Successful registrations",
            s.registrations,
        )?;
        gauge(
            e,
            "registered",
            "1 while a session is registered with the scheduler, else 0",
            c.registered.load(Ordering::Relaxed),
        )?;
        counter(e, "reports", "Job reports the scheduler took", s.reports)?;
        counter(e, "workers_started", "Workers started", s.starts)?;
        counter(
            e,
            "workers_fenced",
            "Workers stopped because the scheduler had given their jobs up (fencing)",
            s.fenced,
        )?;
        counter(
            e,
            "stops_confirmed",
            "Ends of stopped workers confirmed to the scheduler, which holds a moved job's next start until then",
            c.stops_confirmed.load(Ordering::Relaxed),
        )?;
        gauge(
            e,
            "workers",
            "Workers running here",
            c.workers.load(Ordering::Relaxed),
        )?;
        gauge(
            e,
            "workers_stopping",
            "Stopped workers within their stop grace (still holding their GPUs)",
            c.workers_stopping.load(Ordering::Relaxed),
        )?;
        let t = s.telemetry;
        let mut family = e.encode_descriptor(
            "telemetry_rows",
            "Telemetry rows by outcome: produced by sampling, streamed (the scheduler took them), rejected (it refused them), dropped (pushed out of the full backlog; they are in Parquet)",
            None,
            MetricType::Counter,
        )?;
        for (outcome, n) in [
            ("produced", t.produced),
            ("streamed", t.streamed),
            ("rejected", t.rejected),
            ("dropped", t.dropped),
        ] {
            ConstCounter::new(n).encode(family.encode_family(&[("outcome", outcome)])?)?;
        }
        gauge(
            e,
            "telemetry_rows_held",
            "Telemetry rows held for the scheduler",
            t.held,
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_scrape_reads_the_counters_as_they_are_now() {
        let counters = Arc::new(Counters::default());
        let backlog = Backlog::new("n-0", 8);
        let metrics = AgentMetrics::new("n-0", counters.clone(), backlog);
        counters.registrations.store(2, Ordering::Relaxed);
        counters.fenced.store(3, Ordering::Relaxed);
        counters.registered.store(1, Ordering::Relaxed);
        counters.workers_stopping.store(1, Ordering::Relaxed);
        let text = metrics.render();
        for line in [
            "marshal_agent_registrations_total{node=\"n-0\"} 2",
            "marshal_agent_workers_fenced_total{node=\"n-0\"} 3",
            "marshal_agent_registered{node=\"n-0\"} 1",
            "marshal_agent_workers_stopping{node=\"n-0\"} 1",
            "marshal_agent_telemetry_rows_total{node=\"n-0\",outcome=\"dropped\"} 0",
            "marshal_agent_telemetry_rows_held{node=\"n-0\"} 0",
        ] {
            assert!(text.contains(line), "{line} not in\n{text}");
        }
        counters.registered.store(0, Ordering::Relaxed);
        assert!(
            metrics
                .render()
                .contains("marshal_agent_registered{node=\"n-0\"} 0")
        );
    }
}
