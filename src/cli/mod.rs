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
    /// Search a decline head for a policy artifact (cross-entropy method on whole
    /// inflation episodes): when to leave a GPU share unplaced rather than open an idle
    /// GPU for it. Recorded in the artifact's `meta.json` if it passes validation.
    Decline(policy::TrainDeclineArgs),
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
        Command::Train {
            what: TrainWhat::Decline(args),
        } => policy::decline(args),
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

#[cfg(test)]
mod tests {
    use std::any::TypeId;

    use clap::{CommandFactory, Parser};

    use super::Cli;

    /// Every numeric option of every subcommand, by `marshal SUB … --flag`.
    fn numeric_options(cmd: &clap::Command, path: &str, out: &mut Vec<(String, bool)>) {
        let numeric = [
            TypeId::of::<u8>(),
            TypeId::of::<u16>(),
            TypeId::of::<u32>(),
            TypeId::of::<u64>(),
            TypeId::of::<usize>(),
            TypeId::of::<i32>(),
            TypeId::of::<i64>(),
            TypeId::of::<f32>(),
            TypeId::of::<f64>(),
            TypeId::of::<std::time::Duration>(),
        ];
        for arg in cmd.get_arguments() {
            let Some(long) = arg.get_long() else { continue };
            let parser = arg.get_value_parser().type_id();
            if numeric.iter().any(|t| parser == *t) {
                out.push((
                    format!("{path} --{long}"),
                    arg.is_allow_negative_numbers_set() || arg.is_allow_hyphen_values_set(),
                ));
            }
        }
        for sub in cmd.get_subcommands() {
            numeric_options(sub, &format!("{path} {}", sub.get_name()), out);
        }
    }

    /// Without `allow_negative_numbers`, `--seed -1` reads as an unknown flag `-1` and
    /// clap suggests `-- -1`, which is wrong; with it, the value reaches the parser or
    /// the option's own range check and the error names the option.
    #[test]
    fn every_numeric_option_takes_a_negative_number_as_its_value() {
        let mut options = Vec::new();
        numeric_options(&Cli::command(), "marshal", &mut options);
        assert!(
            options.len() > 40,
            "the walk found only {} numeric options",
            options.len()
        );
        let missing: Vec<&str> = options
            .iter()
            .filter(|(_, ok)| !ok)
            .map(|(name, _)| name.as_str())
            .collect();
        assert!(missing.is_empty(), "no allow_negative_numbers: {missing:?}");
        let err = Cli::try_parse_from(["marshal", "agent", "--seed", "-1"]).unwrap_err();
        assert!(
            err.to_string()
                .contains("invalid value '-1' for '--seed <SEED>'"),
            "{err}"
        );
        // A list starting with a negative number is a value too.
        let gate = |list: &str| {
            let mut args = vec!["marshal", "train", "gate", "--model", "m"];
            args.extend(["--fallback", "fgd", "--valid-traces", "openb"]);
            args.extend(["--margins", list]);
            Cli::try_parse_from(args)
        };
        assert!(gate("-0.1,0.2").is_ok());
        let err = gate("-x,0.2").unwrap_err();
        assert!(
            err.to_string()
                .contains("invalid value '-x' for '--margins"),
            "{err}"
        );
    }
}
