//! Subcommands.

mod datasets;
mod demo;
mod eval;
mod model;
mod outcomes_export;
mod output;
mod policy;
mod policy_log;
mod predictor;
mod serve;
mod shadow;
mod shadow_log;
mod sim;
mod svg;
mod telemetry;

use clap::{Parser, Subcommand};

#[derive(Debug, Parser)]
#[command(
    name = "marshal",
    version,
    about = "A learning, topology-aware scheduler for GPU clusters"
)]
pub struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Simulate policies on a trace and a cluster.
    Sim(sim::SimArgs),
    /// Compare policies on the same workloads and seeds: confidence intervals, paired
    /// differences, plots.
    Eval(eval::EvalArgs),
    /// Run the baselines side by side on the bundled traces and print the comparison.
    Demo(demo::DemoArgs),
    /// Describe and sample the traces.
    Datasets(datasets::DatasetsArgs),
    /// Train models offline.
    Train {
        #[command(subcommand)]
        what: TrainWhat,
    },
    /// Manage policy artifacts: promote a candidate only if it wins, signing keys.
    Model {
        #[command(subcommand)]
        what: ModelWhat,
    },
    /// Record, inspect and compact Parquet telemetry.
    Telemetry(telemetry::TelemetryArgs),
    /// The node agent: samples telemetry (NVML or simulated) into local Parquet.
    Agent(telemetry::AgentArgs),
    /// The online scheduler: gRPC primary mode, advisor, admin (see the README).
    Serve(serve::ServeArgs),
    /// Shadow mode beside another scheduler: replay its recorded log against Marshal's
    /// decisions, or serve only the Advisor and log its recommendations. Never acts.
    Shadow(shadow::ShadowArgs),
    /// List policies, bundled traces and cluster presets.
    List,
}

#[derive(Debug, Subcommand)]
enum TrainWhat {
    /// The step-time / memory / utilisation predictor, from step-profile telemetry.
    Predictor(predictor::TrainPredictorArgs),
    /// The learned placement policy: behaviour cloning, then REINFORCE in the simulator.
    Policy(policy::TrainPolicyArgs),
    /// Retrain a policy artifact from `marshal serve`'s Parquet decision log
    /// (advantage-weighted cloning of the decisions whose placements completed).
    PolicyFromLog(policy_log::TrainFromLogArgs),
    /// Choose the confidence gate's threshold of a policy artifact for another fallback
    /// heuristic (the training's selection, on validation episodes) and record it.
    Gate(policy::TrainGateArgs),
}

#[derive(Debug, Subcommand)]
enum ModelWhat {
    /// Evaluate a candidate policy artifact against the current one on validation traces
    /// and install it atomically only if it wins (see the README for the rule).
    Promote(model::PromoteArgs),
    /// Generate an Ed25519 key pair for signing promotion records (`KEY`, `KEY.pub`).
    Keygen(model::KeygenArgs),
}

pub fn run(cli: Cli) -> anyhow::Result<()> {
    match cli.command {
        Command::Sim(args) => sim::run(args),
        Command::Demo(args) => demo::run(args),
        Command::Eval(args) => eval::run(args),
        Command::Train {
            what: TrainWhat::Predictor(args),
        } => predictor::train(args),
        Command::Train {
            what: TrainWhat::Policy(args),
        } => policy::train(args),
        Command::Train {
            what: TrainWhat::PolicyFromLog(args),
        } => policy_log::train(args),
        Command::Train {
            what: TrainWhat::Gate(args),
        } => policy::gate(args),
        Command::Model {
            what: ModelWhat::Promote(args),
        } => model::run_promote(args),
        Command::Model {
            what: ModelWhat::Keygen(args),
        } => model::run_keygen(args),
        Command::Datasets(args) => datasets::run(args),
        Command::Telemetry(args) => telemetry::run(args),
        Command::Agent(args) => telemetry::agent(args),
        Command::Serve(args) => serve::run(args),
        Command::Shadow(args) => shadow::run(args),
        Command::List => {
            println!(
                "policies: {}, {} (a trained model: --model, default models/policy-default)",
                marshal_scheduler::policies::POLICY_NAMES.join(", "),
                marshal_scheduler::policies::learned::LEARNED
            );
            println!("traces:   {}", marshal_datasets::TRACE_NAMES.join(", "));
            println!("clusters: {}", marshal_datasets::CLUSTER_PRESETS.join(", "));
            Ok(())
        }
    }
}
