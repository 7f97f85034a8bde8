//! Marshal's scheduler core.
//!
//! - [`domain`]: GPU models, topology, cluster state, jobs and placements.
pub mod domain;
pub mod framework;
pub mod policies;
pub mod sim;
