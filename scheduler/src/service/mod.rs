//! The online scheduler service (feature `service`): Marshal as the primary scheduler
//! over gRPC, and the stateless advisor.
//!
//! - [`pb`]: the generated `marshal.v1` types and services (wire types stop at
//!   [`convert`]; policy code never sees them).
//! - [`jobs`]: the job state machine; [`core`] the in-memory state, recovery and the
//!   cycle driver with group commit; [`cycle`] and [`ops`] the transitions;
//!   [`store`] redb persistence (records laid out by `codec`); `heartbeat` node liveness; [`advisor`] Advise on a snapshot.
//! - [`api`] the gRPC adapters, [`auth`] bearer tokens, [`metrics`] Prometheus,
//!   [`server`] wiring (TLS, health, reflection, shutdown), [`model`] the learned-model
//!   slot, [`config`] the TOML configuration; [`shadow`] the advisor-only server of
//!   `marshal shadow --listen`.

/// Generated protobuf and gRPC code for `marshal.v1`.
#[allow(clippy::all, missing_debug_implementations)]
pub mod pb {
    tonic::include_proto!("marshal.v1");
}

/// The encoded descriptor set of the `marshal.v1` protos (for gRPC reflection).
pub const FILE_DESCRIPTOR_SET: &[u8] =
    include_bytes!(concat!(env!("OUT_DIR"), "/marshal_v1_descriptor.bin"));

pub mod advisor;
pub mod api;
pub mod auth;
pub mod checkpoint;
pub mod client;
mod codec;
pub mod config;
pub mod convert;
pub mod core;
mod cycle;
pub mod error;
pub mod health;
mod heartbeat;
mod incoming;
mod inventory;
pub mod jobs;
pub mod metrics;
mod migrate;
pub mod model;
mod ops;
pub mod pem;
pub mod records;
mod registration;
mod retention;
pub mod rpc_metrics;
pub mod secret;
pub mod server;
pub mod shadow;
mod stop_waits;
pub mod store;
#[cfg(test)]
mod testkit;
pub mod watchers;

pub use config::{SecurityConfig, ServiceConfig};
pub use error::{ServiceError, StartError};
pub use model::{LearnedSlot, ModelSlot, NoModel, PromotionPolicy, model_slot};
pub use server::{AdvisorHandle, ServerHandle, start, start_advisor};
/// Re-exported so clients (tests, the load generator, agents) use the same versions.
pub use {tokio, tonic, tonic_health};
