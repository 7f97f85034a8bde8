//! The per-node agent: topology discovery, telemetry sampling and streaming, applying
//! allocations.
//!
//! Nothing is implemented yet (issues 4 and 7); the crate exports nothing.
