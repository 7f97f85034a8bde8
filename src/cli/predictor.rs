//! `marshal eval predictor`: step-time prediction error on held-out jobs and on placement
//! shapes never seen in training.

use std::path::PathBuf;

use anyhow::Context as _;
use clap::Args;
use marshal_model::{ArtifactInfo, PredictorConfig, Targets};
use marshal_trainer::{
    ClusterContext, LinearBaseline, LookupBaseline, Split, StepExample, load_step_examples, mape,
    split_by_job, split_unseen_placements,
};

#[derive(Debug, Args)]
pub struct PredictorEvalArgs {
    /// Telemetry directory with step profiles (`marshal telemetry record`).
    #[arg(long)]
    telemetry: PathBuf,
    /// A trained predictor artifact. Without one, only the baselines are evaluated.
    #[arg(long)]
    model: Option<PathBuf>,
    /// The cluster the telemetry came from (needed with --model to rebuild placements).
    #[arg(long)]
    cluster: Option<String>,
    #[arg(long, default_value_t = 42)]
    seed: u64,
}

/// The (span, GPU count) shapes of every gang spread beyond one node: the placements
/// held out as "unseen".
fn multi_node_shapes(examples: &[StepExample]) -> Vec<(&str, u32)> {
    examples
        .iter()
        .filter(|e| e.nodes > 1)
        .map(|e| (e.span.as_str(), e.num_gpus))
        .collect::<std::collections::BTreeSet<_>>()
        .into_iter()
        .collect()
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
    let spread = multi_node_shapes(&examples);
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
    let Some(dir) = &a.model else {
        println!("(no --model: the learned predictor is not evaluated)");
        return Ok(());
    };
    let cluster = a.cluster.as_deref().context("--model needs --cluster")?;
    let loaded = marshal_model::artifact::load(dir)
        .with_context(|| format!("loading the predictor {}", dir.display()))?;
    let ctx = context(cluster)?;
    let (mape, coverage) = model_errors(&loaded.predictor, &ctx, &random.test)?;
    println!(
        "learned predictor on held-out jobs: step-time MAPE {mape:.1} %, 90 % interval holds {coverage:.0} % of truths"
    );
    Ok(())
}

fn context(cluster: &str) -> anyhow::Result<ClusterContext> {
    let spec = marshal_datasets::load_cluster(cluster)?;
    let topo = marshal_scheduler::domain::Topology::build(&spec)?;
    let library = marshal_datasets::WorkloadLibrary::bundled(&Default::default())?;
    Ok(ClusterContext::new(&topo, library.catalog))
}

fn graphs(
    ctx: &ClusterContext,
    examples: &[StepExample],
) -> Vec<(marshal_model::PlacementGraph, Targets)> {
    examples.iter().filter_map(|e| ctx.featurize(e)).collect()
}

/// Step-time MAPE and the share of truths inside the predicted 90 % interval.
fn model_errors(
    predictor: &marshal_model::TrainedPredictor,
    ctx: &ClusterContext,
    test: &[StepExample],
) -> anyhow::Result<(f64, f64)> {
    let data = graphs(ctx, test);
    let batch: Vec<_> = data.iter().map(|(g, _)| g.clone()).collect();
    let predictions = predictor.predict(&batch)?;
    let truth: Vec<f64> = data.iter().map(|(_, t)| f64::from(t.step_time_s)).collect();
    let predicted: Vec<f64> = predictions
        .iter()
        .map(|p| f64::from(p.step_time_s))
        .collect();
    let inside = predictions
        .iter()
        .zip(&truth)
        .filter(|(p, t)| f64::from(p.step_time_p05) <= **t && **t <= f64::from(p.step_time_p95))
        .count();
    Ok((
        mape(&predicted, &truth),
        inside as f64 / truth.len().max(1) as f64 * 100.0,
    ))
}

#[derive(Debug, Args)]
pub struct TrainPredictorArgs {
    /// Telemetry directory with step profiles.
    #[arg(long)]
    telemetry: PathBuf,
    /// The cluster the telemetry came from (a preset or a spec file).
    #[arg(long)]
    cluster: String,
    /// Artifact directory to write.
    #[arg(long)]
    out: PathBuf,
    #[arg(long, default_value_t = 42)]
    seed: u64,
    #[arg(long, default_value_t = 200)]
    max_epochs: usize,
}

/// FNV-1a over the examples' identities and answers: the artifact's data hash.
fn data_hash(examples: &[StepExample]) -> String {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for e in examples {
        for b in e
            .job_id
            .bytes()
            .chain(e.step_time_s.to_bits().to_le_bytes())
        {
            h = (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3);
        }
    }
    format!("fnv1a64:{h:016x}")
}

/// Trains on held-out-job and unseen-placement splits, reports both against the
/// baselines, and saves the held-out-job model.
pub fn train(a: TrainPredictorArgs) -> anyhow::Result<()> {
    let (examples, _) = load_step_examples(&a.telemetry)
        .with_context(|| format!("reading step profiles from {}", a.telemetry.display()))?;
    let ctx = context(&a.cluster)?;
    let config = PredictorConfig::new()
        .with_seed(a.seed)
        .with_max_epochs(a.max_epochs);
    let spread = multi_node_shapes(&examples);
    let splits = [
        ("held-out jobs", split_by_job(&examples, a.seed, 0.1, 0.2)),
        (
            "unseen placements (multi-node)",
            split_unseen_placements(&examples, &spread, a.seed, 0.1),
        ),
    ];
    let mut scores = std::collections::BTreeMap::new();
    let mut saved = None;
    for (i, (name, split)) in splits.iter().enumerate() {
        if split.train.is_empty() || split.valid.is_empty() || split.test.is_empty() {
            println!("{name}: a side is empty, skipped");
            continue;
        }
        let started = std::time::Instant::now();
        let mut epochs = 0;
        let predictor = marshal_model::train::fit(
            &graphs(&ctx, &split.train),
            &graphs(&ctx, &split.valid),
            &config,
            &mut |r| epochs = r.epoch,
        )?;
        let (model_mape, coverage) = model_errors(&predictor, &ctx, &split.test)?;
        let (lookup, linear) = errors(split)?;
        println!(
            "{name}: learned {model_mape:.1} % (90 % interval holds {coverage:.0} %), lookup {lookup:.1} %, \
             linear {linear:.1} % step-time MAPE; {} train / {} test examples, {epochs} epochs in {:.1} s",
            split.train.len(),
            split.test.len(),
            started.elapsed().as_secs_f64()
        );
        let key = if i == 0 {
            "holdout_jobs"
        } else {
            "unseen_placements"
        };
        scores.insert(format!("{key}_step_time_mape"), model_mape);
        scores.insert(format!("{key}_interval90_coverage_pct"), coverage);
        scores.insert(format!("{key}_lookup_mape"), lookup);
        scores.insert(format!("{key}_linear_mape"), linear);
        if i == 0 {
            saved = Some(predictor);
        }
    }
    let predictor = saved.context("the held-out-job split had an empty side: nothing to save")?;
    scores.insert("split_seed".into(), a.seed as f64);
    let info = ArtifactInfo {
        training_data_hash: data_hash(&examples),
        eval_scores: scores,
    };
    marshal_model::artifact::save(&a.out, &predictor, &info)
        .with_context(|| format!("saving {}", a.out.display()))?;
    println!("saved {}", a.out.display());
    Ok(())
}
