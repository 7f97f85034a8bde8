//! Marshal's neural networks (burn): the graph-network resource predictors and the
//! placement policy network, with artifact save/load.
//!
//! Nothing is implemented yet: the predictors arrive with issue 5 and the policy with
//! issue 6. The crate exists so that the workspace layout of DESIGN.md is in place; it
//! exports nothing.
