//! Offline training: featurisation, predictor fitting, RL on the simulator, evaluation
//! and promotion.
//!
//! Nothing is implemented yet (issues 5 and 6); the crate exports nothing.
