//! `marshal eval predictor`: step-time prediction error on held-out jobs and on placement
//! shapes never seen in training.

use std::path::PathBuf;

use anyhow::Context as _;
use clap::Args;
use marshal_trainer::{
    LinearBaseline, LookupBaseline, Split, StepExample, load_step_examples, mape, split_by_job,
    split_unseen_placements,
};

#[derive(Debug, Args)]
pub struct PredictorEvalArgs {
    /// Telemetry directory with step profiles (`marshal telemetry record`).
    #[arg(long)]
    telemetry: PathBuf,
    /// A trained predictor artifact. Without one, only the baselines are evaluated.
    #[arg(long)]
    model: Option<PathBuf>,
    #[arg(long, default_value_t = 42)]
    seed: u64,
}

fn errors(split: &Split) -> anyhow::Result<(f64, f64)> {
    let truth: Vec<f64> = split.test.iter().map(|e| e.step_time_s).collect();
    let lookup = LookupBaseline::fit(&split.train)?;
    let linear = LinearBaseline::fit(&split.train, 1e-2)?;
    let predict = |f: &dyn Fn(&StepExample) -> f64| split.test.iter().map(f).collect::<Vec<_>>();
    Ok((
        mape(&predict(&|e| lookup.predict(e)), &truth),
        mape(&predict(&|e| linear.predict(e)), &truth),
    ))
}

pub fn eval(a: PredictorEvalArgs) -> anyhow::Result<()> {
    let (examples, report) = load_step_examples(&a.telemetry)
        .with_context(|| format!("reading step profiles from {}", a.telemetry.display()))?;
    for e in &report.errors {
        eprintln!("warning: skipped {}: {}", e.path.display(), e.reason);
    }
    let jobs: std::collections::BTreeSet<&str> =
        examples.iter().map(|e| e.job_id.as_str()).collect();
    println!(
        "{} examples ({} jobs) from {}",
        examples.len(),
        jobs.len(),
        a.telemetry.display()
    );
    let random = split_by_job(&examples, a.seed, 0.1, 0.2);
    // Unseen placements: every gang spread beyond one node.
    let spread: Vec<(&str, u32)> = examples
        .iter()
        .filter(|e| e.nodes > 1)
        .map(|e| (e.span.as_str(), e.num_gpus))
        .collect::<std::collections::BTreeSet<_>>()
        .into_iter()
        .collect();
    let unseen = split_unseen_placements(&examples, &spread, a.seed, 0.1);
    println!(
        "{:<34} {:>7} {:>7} {:>12} {:>12}",
        "test set", "train", "test", "lookup MAPE", "linear MAPE"
    );
    for (name, split) in [
        ("held-out jobs", &random),
        ("unseen placements (multi-node)", &unseen),
    ] {
        if split.test.is_empty() || split.train.is_empty() {
            println!(
                "{name:<34} {:>7} {:>7}   (empty side: not evaluated)",
                split.train.len(),
                split.test.len()
            );
            continue;
        }
        let (lookup, linear) = errors(split)?;
        println!(
            "{name:<34} {:>7} {:>7} {:>11.1}% {:>11.1}%",
            split.train.len(),
            split.test.len(),
            lookup,
            linear
        );
    }
    match &a.model {
        Some(m) => anyhow::bail!(
            "evaluating a trained predictor ({}) is not built yet: the model crate is issue 5's next step",
            m.display()
        ),
        None => println!("(no --model: the learned predictor is not evaluated)"),
    }
    Ok(())
}
