//! Marshal's scheduler core.
//!
//! - [`domain`]: GPU models, topology, cluster state, jobs and placements.
pub mod domain;
pub mod framework;
pub mod policies;
#[cfg(feature = "service")]
pub mod service;
pub mod shadow;
pub mod sim;
