//! The per-node agent: samples telemetry from a source (NVML on a GPU node, a simulated
//! replay elsewhere) and writes it to a local Parquet sink.
//!
//! # Design
//!
//! - **The loop does not know its source or sink.** [`run_sampling_loop`] asks a
//!   [`marshal_telemetry::Source`] for one tick's rows and hands them to a
//!   [`marshal_telemetry::TelemetrySink`]; streaming to the scheduler (the service issue)
//!   is another consumer of the same rows.
//! - **Clean shutdown.** The loop polls a stop flag (set by the binary's SIGINT/SIGTERM
//!   handler) between ticks and while waiting; on stop it returns, and the caller
//!   finishes the sink, which finalises the last file.
//! - **Simulated telemetry** ([`SimulatedTelemetry`]) turns a simulator replay into the
//!   samples a real node would produce, with ground-truth phases and step times, for
//!   training and for running the agent without a GPU.
//! - **Connected mode** ([`connected`], `marshal agent --scheduler URL`): registers the
//!   node, streams the loop's rows (a [`RowTap`] feeding a bounded backlog), applies the
//!   node's assignments and reports what its jobs did, reconnecting with backoff.

pub mod connected;
mod error;
mod host;
mod sampling;
mod simulated;
mod topology;

pub use error::AgentError;
pub use host::HostSampler;
pub use sampling::{
    Clock, LoopStats, ManualClock, RowTap, SystemClock, run_sampling_loop, run_sampling_loop_with,
};
pub use simulated::{SimTelemetryOptions, SimulatedTelemetry};
pub use topology::{
    catalog_model, inventory_node, mig_layout, mig_layout_spec, node_info, node_spec,
};
