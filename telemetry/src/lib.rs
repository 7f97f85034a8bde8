//! Marshal's telemetry: the Arrow sample schema, the Parquet sink and reader, and the
//! NVML, simulated and replay sources.
//!
//! Nothing is implemented yet (issue 4); the crate exports nothing.
