//! `marshal train policy-from-log`: retrains a policy artifact from the service's
//! Parquet decision log (see `marshal_trainer::policy::retrain_from_log`).

use std::path::PathBuf;

use anyhow::Context;
use clap::Args;
use marshal_scheduler::decision_log::read_decision_log;
use marshal_trainer::policy::{LogTrainOptions, retrain_from_log};

#[derive(Debug, Args)]
pub struct TrainFromLogArgs {
    /// The decision log directory (`decision_log_dir` of `marshal serve`).
    #[arg(long)]
    log: PathBuf,
    /// The policy artifact to start from (the one that served, typically).
    #[arg(long)]
    init: PathBuf,
    /// Output directory of the retrained artifact (created).
    #[arg(long)]
    out: PathBuf,
    #[arg(long, allow_negative_numbers = true, default_value_t = 10)]
    epochs: usize,
    #[arg(long, allow_negative_numbers = true, default_value_t = 1e-3)]
    learning_rate: f64,
    /// Temperature of the advantage weights, in log run-time units.
    #[arg(long, allow_negative_numbers = true, default_value_t = 0.5)]
    beta: f64,
    /// Largest weight one decision gets.
    #[arg(long, allow_negative_numbers = true, default_value_t = 20.0)]
    max_weight: f64,
    /// Completed decisions a (job name, shape) group needs to be its own baseline.
    #[arg(long, allow_negative_numbers = true, default_value_t = 2)]
    min_group: usize,
    #[arg(long, allow_negative_numbers = true, default_value_t = 0)]
    seed: u64,
}

pub fn train(a: TrainFromLogArgs) -> anyhow::Result<()> {
    let opts = LogTrainOptions {
        seed: a.seed,
        epochs: a.epochs,
        learning_rate: a.learning_rate,
        beta: a.beta,
        max_weight: a.max_weight,
        min_group: a.min_group,
    };
    opts.validate().map_err(anyhow::Error::msg)?;
    let data = read_decision_log(&a.log)
        .map_err(anyhow::Error::msg)
        .with_context(|| format!("reading the decision log {}", a.log.display()))?;
    for skipped in &data.skipped {
        eprintln!("warning: left out a decision-log file: {skipped}");
    }
    let started = std::time::Instant::now();
    let trained = retrain_from_log(&a.init, &data, &a.out, &opts, &mut |epoch, step| {
        eprintln!(
            "epoch {:>3}: weighted nll {:.4}, agreement with the executed choice {:.1} %",
            epoch + 1,
            step.nll,
            step.agreement * 100.0
        );
    })
    .map_err(anyhow::Error::msg)?;
    let r = &trained.report;
    println!(
        "{} decisions in {} files ({} files left out: damaged, of a later layout or of another database): {} used ({} on the learned path, {} with a (name, shape) baseline, mean weight {:.2}); skipped: {} without features, {} still running, {} not completed, {} unusable{}",
        r.decisions,
        data.files,
        data.skipped.len(),
        r.used,
        r.learned_path,
        r.own_group,
        r.mean_weight,
        r.no_features,
        r.no_outcome,
        r.not_completed,
        r.unusable,
        r.first_unusable
            .as_deref()
            .map(|w| format!(" (first: {w})"))
            .unwrap_or_default()
    );
    println!(
        "wrote {} in {:.1} s (gate and fallback kept from {}; evaluate it with `marshal eval --model {}` before serving it)",
        a.out.display(),
        started.elapsed().as_secs_f64(),
        a.init.display(),
        a.out.display()
    );
    Ok(())
}
