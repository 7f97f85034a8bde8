//! `marshal train predictor` and `marshal eval predictor`: step-time prediction error on
//! held-out jobs and on placement shapes never seen in training, against the baselines.

mod calibration_runs;
mod device;

use std::path::PathBuf;

use anyhow::Context as _;
use calibration_runs::{TrainingCost, novel_summary, train_calibrated};
use clap::{Args, ValueEnum};
use device::DeviceArg;
use marshal_model::{ArtifactInfo, PredictorConfig, Targets};
use marshal_trainer::{
    ClusterContext, HISTORY_FILE, LinearBaseline, LookupBaseline, MeasuredFold, MeasuredStep,
    PriorForm, Split, StepExample, StepHistory, fit_measured_prior, leave_one_class_out,
    leave_one_model_out, load_step_examples, mape, measured_examples, split_by_job,
    split_unseen_placements, test_on_other_set,
};

#[derive(Debug, Args)]
pub struct PredictorEvalArgs {
    /// Telemetry directories with step profiles (`marshal telemetry record`); repeat the
    /// flag to pool several recordings of the same cluster (e.g. one per policy, so that
    /// jobs are seen on different placements).
    #[arg(long, required_unless_present = "measured")]
    telemetry: Vec<PathBuf>,
    /// Evaluate on measured step times instead of telemetry: trains and tests one
    /// predictor per fold (leave one multi-GPU shape class out, then leave one model
    /// out), with the prior's communication shares refitted to each fold's training side.
    #[arg(long, value_enum, conflicts_with_all = ["telemetry", "model"])]
    measured: Option<MeasuredSet>,
    /// Which folds to run with --measured.
    #[arg(long, value_enum, default_value = "all")]
    folds: MeasuredFolds,
    /// Epoch cap of each fold's training (with --measured).
    #[arg(long, allow_negative_numbers = true, default_value_t = 200)]
    max_epochs: usize,
    /// β of the step-time loss (0 = plain Gaussian NLL; see `PredictorConfig::nll_beta`).
    #[arg(long, allow_negative_numbers = true, default_value_t = 0.5)]
    nll_beta: f64,
    /// The prior's form with --measured: `sync` adds a fitted synchronisation time
    /// (growing with log2 of the gang, per locality) to the kind's single-GPU time;
    /// `share` keeps only the communication share over the bottleneck link, as on
    /// telemetry.
    #[arg(long, value_enum, default_value = "sync")]
    prior_form: PriorFormArg,
    /// A trained predictor artifact. Without one, only the baselines are evaluated.
    #[arg(long)]
    model: Option<PathBuf>,
    /// The cluster the telemetry came from (needed with --model to rebuild placements).
    #[arg(long)]
    cluster: Option<String>,
    #[arg(long, allow_negative_numbers = true, default_value_t = 42)]
    seed: u64,
    /// Where the networks train (with --measured).
    #[arg(long, value_enum, default_value = "cpu")]
    device: DeviceArg,
}

/// Measured step-time sets `marshal eval predictor --measured` knows.
#[derive(Copy, Clone, Debug, PartialEq, Eq, ValueEnum)]
pub enum MeasuredSet {
    /// Pollux's bundled placement profiles (OSDI '21, Apache-2.0): step times of six
    /// models by per-GPU batch and placement on AWS g4dn.12xlarge nodes (4 T4 on PCIe,
    /// 50 Gb/s between nodes), evaluated on the `pollux-64` cluster.
    Pollux,
    /// Sia's (SOSP '23) profiles of the same six models on Azure ND40rs_v2 (8 V100 on
    /// NVLink), on `nd40rs-v100-64`. Read from the traces directory (not bundled: no
    /// license).
    SiaAzure,
    /// Sia's profiles on DGX A100 nodes (8 A100-40GB on NVSwitch), on `dgx-a100-64`.
    SiaDgx,
    /// Sia's profiles on 8 × RTX 2080 Ti servers (PCIe only), on `rtx2080ti-64`.
    SiaRtx,
    /// Sia's profiles on one server of 4 Quadro RTX 6000 (PCIe), on
    /// `quadro-rtx6000-32`: single-machine placements only.
    SiaQuad,
}

impl MeasuredSet {
    /// Sia's file suffix, the GPU model and the cluster preset; `None` for Pollux.
    fn sia(self) -> Option<(&'static str, &'static str, &'static str)> {
        match self {
            MeasuredSet::Pollux => None,
            MeasuredSet::SiaAzure => Some(("azure", "V100M32", "nd40rs-v100-64")),
            MeasuredSet::SiaDgx => Some(("dgx", "A100-40", "dgx-a100-64")),
            MeasuredSet::SiaRtx => Some(("rtx", "RTX2080Ti", "rtx2080ti-64")),
            MeasuredSet::SiaQuad => Some(("quad", "RTX6000", "quadro-rtx6000-32")),
        }
    }
}

/// `--prior-form`.
#[derive(Copy, Clone, Debug, PartialEq, Eq, ValueEnum)]
pub enum PriorFormArg {
    Share,
    Sync,
}

impl From<PriorFormArg> for PriorForm {
    fn from(f: PriorFormArg) -> Self {
        match f {
            PriorFormArg::Share => PriorForm::Share,
            PriorFormArg::Sync => PriorForm::Sync,
        }
    }
}

/// Where each training side's prior constants come from.
enum PriorSource<'a> {
    /// The cluster's own context (the simulator's catalog) for every training side.
    Fixed(&'a ClusterContext),
    /// Refitted on each training side, the auxiliary calibration runs' included
    /// ([`fit_measured_prior`]).
    Fitted {
        base: &'a ClusterContext,
        kinds: Vec<String>,
        form: PriorForm,
    },
}

impl PriorSource<'_> {
    fn context(&self, train: &[StepExample]) -> anyhow::Result<ClusterContext> {
        Ok(match self {
            PriorSource::Fixed(ctx) => (*ctx).clone(),
            PriorSource::Fitted { base, kinds, form } => {
                fit_measured_prior(base, train, kinds, *form)?
            }
        })
    }
}

/// The folds of `--measured`.
#[derive(Copy, Clone, Debug, PartialEq, Eq, ValueEnum)]
pub enum MeasuredFolds {
    /// Leave one multi-GPU (span, GPU count) class out at a time.
    Shapes,
    /// Leave one model (all its batch sizes) out at a time.
    Models,
    /// Train on every placement profile, test on a separate experiment of the same
    /// testbed (Pollux's scalability runs: 6–16 nodes, up to 64 GPUs, uniform layouts
    /// only), split into shape classes the placements have and larger ones.
    Scale,
    /// All three.
    All,
}

#[derive(Debug, Args)]
pub struct TrainPredictorArgs {
    /// Telemetry directories with step profiles; repeat the flag to pool recordings.
    #[arg(long, required = true)]
    telemetry: Vec<PathBuf>,
    /// The cluster the telemetry came from (a preset or a spec file).
    #[arg(long)]
    cluster: String,
    /// Artifact directory to write.
    #[arg(long)]
    out: PathBuf,
    #[arg(long, allow_negative_numbers = true, default_value_t = 42)]
    seed: u64,
    #[arg(long, allow_negative_numbers = true, default_value_t = 200)]
    max_epochs: usize,
    /// β of the step-time loss (0 = plain Gaussian NLL; see `PredictorConfig::nll_beta`).
    #[arg(long, allow_negative_numbers = true, default_value_t = 0.5)]
    nll_beta: f64,
    /// Where the networks train (the main one and the calibration runs).
    #[arg(long, value_enum, default_value = "cpu")]
    device: DeviceArg,
}

/// One way of holding examples out, named for reports and artifact scores.
struct NamedSplit {
    name: &'static str,
    key: &'static str,
    split: Split,
}

/// The three test sets every report uses:
/// - held-out jobs (by job hash);
/// - unseen shapes: every other multi-GPU (span, GPU count) class in sorted order, so
///   training keeps some packed and some spread gangs while the test holds spread
///   variants of GPU counts trained packed, and GPU counts not trained at that span;
/// - all multi-node placements held out: the strictest test, where training has no
///   InfiniBand link at all.
fn splits(examples: &[StepExample], seed: u64) -> Vec<NamedSplit> {
    let shapes = |keep: &dyn Fn(&StepExample) -> bool| -> Vec<(&str, u32)> {
        examples
            .iter()
            .filter(|e| keep(e))
            .map(|e| (e.span.as_str(), e.num_gpus))
            .collect::<std::collections::BTreeSet<_>>()
            .into_iter()
            .collect()
    };
    let every_other: Vec<(&str, u32)> = shapes(&|e| e.num_gpus > 1)
        .into_iter()
        .skip(1)
        .step_by(2)
        .collect();
    let multi_node = shapes(&|e| e.nodes > 1);
    vec![
        NamedSplit {
            name: "held-out jobs",
            key: "holdout_jobs",
            split: split_by_job(examples, seed, 0.1, 0.2),
        },
        NamedSplit {
            name: "unseen shapes (alternate classes)",
            key: "unseen_shapes",
            split: split_unseen_placements(examples, &every_other, seed, 0.1),
        },
        NamedSplit {
            name: "unseen placements (all multi-node)",
            key: "unseen_placements",
            split: split_unseen_placements(examples, &multi_node, seed, 0.1),
        },
    ]
}

fn load(dirs: &[PathBuf]) -> anyhow::Result<Vec<StepExample>> {
    let mut all = Vec::new();
    for dir in dirs {
        let (examples, report) = load_step_examples(dir)
            .with_context(|| format!("reading step profiles from {}", dir.display()))?;
        for e in &report.files.errors {
            eprintln!("warning: skipped {}: {}", e.path.display(), e.reason);
        }
        if report.rows.total() > 0 {
            let level = if report.rows.malformed() > 0 {
                "warning"
            } else {
                "note"
            };
            eprintln!("{level}: {}: {}", dir.display(), report.rows.summary());
        }
        all.extend(examples);
    }
    let jobs: std::collections::BTreeSet<&str> = all.iter().map(|e| e.job_id.as_str()).collect();
    println!(
        "{} examples ({} jobs) from {} telemetry director{}",
        all.len(),
        jobs.len(),
        dirs.len(),
        if dirs.len() == 1 { "y" } else { "ies" }
    );
    Ok(all)
}

/// The examples whose GPU type the cluster has. The others are left out with a
/// warning that counts them by type: the featuriser would otherwise make up their GPUs'
/// memory, island and throughput. None left is an error.
fn on_cluster_gpus(
    examples: Vec<StepExample>,
    ctx: &ClusterContext,
    cluster: &str,
) -> anyhow::Result<Vec<StepExample>> {
    let mut unknown = std::collections::BTreeMap::<String, usize>::new();
    let kept: Vec<StepExample> = examples
        .into_iter()
        .filter(|e| {
            let known = ctx.has_gpu_type(&e.gpu_type);
            if !known {
                *unknown.entry(e.gpu_type.clone()).or_default() += 1;
            }
            known
        })
        .collect();
    if unknown.is_empty() {
        return Ok(kept);
    }
    let unknown: Vec<String> = unknown
        .iter()
        .map(|(t, n)| format!("{t:?} ({n})"))
        .collect();
    let has = ctx.gpu_types().collect::<Vec<_>>().join(", ");
    let message = format!(
        "examples of GPU types that cluster `{cluster}` does not have: {} (it has {has})",
        unknown.join(", ")
    );
    anyhow::ensure!(
        !kept.is_empty(),
        "no usable step profiles: all are {message}"
    );
    eprintln!("warning: left out {message}");
    Ok(kept)
}

/// Step-time MAPE of the lookup and linear baselines trained on the split.
fn baseline_errors(split: &Split) -> anyhow::Result<(f64, f64)> {
    let truth: Vec<f64> = split.test.iter().map(|e| e.step_time_s).collect();
    let lookup = LookupBaseline::fit(&split.train)?;
    let linear = LinearBaseline::fit(&split.train, 1e-2)?;
    let predict = |f: &dyn Fn(&StepExample) -> f64| split.test.iter().map(f).collect::<Vec<_>>();
    Ok((
        mape(&predict(&|e| lookup.predict(e)), &truth),
        mape(&predict(&|e| linear.predict(e)), &truth),
    ))
}

fn usable(s: &NamedSplit) -> bool {
    !(s.split.train.is_empty() || s.split.valid.is_empty() || s.split.test.is_empty())
}

pub fn eval(a: PredictorEvalArgs) -> anyhow::Result<()> {
    if let Some(set) = a.measured {
        let config = PredictorConfig::new()
            .with_seed(a.seed)
            .with_max_epochs(a.max_epochs)
            .with_nll_beta(a.nll_beta);
        config.validate()?;
        return eval_measured(
            set,
            a.folds,
            &config,
            a.prior_form.into(),
            &a.device.open()?,
        );
    }
    let mut examples = load(&a.telemetry)?;
    let ctx = match (&a.model, a.cluster.as_deref()) {
        (Some(_), None) => anyhow::bail!("--model needs --cluster"),
        (Some(_), Some(cluster)) => {
            let ctx = context(cluster)?;
            examples = on_cluster_gpus(examples, &ctx, cluster)?;
            Some(ctx)
        }
        (None, _) => None,
    };
    let splits = splits(&examples, a.seed);
    println!(
        "{:<36} {:>7} {:>7} {:>12} {:>12}",
        "test set", "train", "test", "lookup MAPE", "linear MAPE"
    );
    for s in &splits {
        if s.split.test.is_empty() || s.split.train.is_empty() {
            println!(
                "{:<36} {:>7} {:>7}   (empty side: not evaluated)",
                s.name,
                s.split.train.len(),
                s.split.test.len()
            );
            continue;
        }
        let (lookup, linear) = baseline_errors(&s.split)?;
        println!(
            "{:<36} {:>7} {:>7} {:>11.1}% {:>11.1}%",
            s.name,
            s.split.train.len(),
            s.split.test.len(),
            lookup,
            linear
        );
    }
    let (Some(dir), Some(ctx)) = (&a.model, ctx) else {
        println!("(no --model: the learned predictor is not evaluated)");
        return Ok(());
    };
    let loaded = marshal_model::artifact::load(dir)
        .with_context(|| format!("loading the predictor {}", dir.display()))?;
    let history = StepHistory::load(&dir.join(HISTORY_FILE))?;
    let (mape, coverage) = model_errors(&loaded.predictor, &ctx, &history, &splits[0].split.test)?;
    let c = loaded.predictor.calibration();
    println!(
        "learned predictor on held-out jobs: step-time MAPE {mape:.1} %, 90 % interval holds {coverage:.0} % of truths \
         (σ × {:.2} on trained shapes, × {:.2} on novel ones)",
        c.seen_multiplier, c.novel_multiplier
    );
    Ok(())
}

/// Context of an error loading Sia's profiles: they are not bundled.
const SIA_FROM_TRACES: &str =
    "Sia's profiles are read from the traces directory (MARSHAL_TRACES_DIR)";

/// The examples of a measured set and the cluster they were measured on.
fn measured_set(set: MeasuredSet) -> anyhow::Result<(Vec<StepExample>, &'static str)> {
    let (profiles, gpu, cluster, source) = match set.sia() {
        None => {
            let (p, _) = marshal_datasets::pollux_placement_profiles()?;
            print_measurement_noise(p.profiles(), None);
            (p.profiles().to_vec(), "T4", "pollux-64", "Pollux, AWS g4dn")
        }
        Some((suffix, gpu, cluster)) => {
            let (p, _) =
                marshal_datasets::load_sia_placement_profiles().context(SIA_FROM_TRACES)?;
            let repeats = sia_only(p.profiles(), &format!("{suffix}-ext"));
            let p = sia_only(p.profiles(), suffix);
            print_measurement_noise(&p, Some((&format!("{suffix}-ext"), &repeats)));
            (p, gpu, cluster, "Sia")
        }
    };
    let steps: Vec<MeasuredStep> = profiles
        .iter()
        .filter_map(|p| measured_step(p, gpu, p.placement.clone()?))
        .collect();
    let (examples, skipped) = measured_examples(&steps);
    println!(
        "{} measured step times of {} profiles ({source}, {gpu}); {skipped} skipped \
         (unequal GPUs per node)",
        examples.len(),
        profiles.len()
    );
    Ok((examples, cluster))
}

/// Prints how noisy the measurements the examples come from are
/// ([`marshal_datasets::neighbour_noise`], and [`marshal_datasets::repeat_noise`]
/// against a second recording of the same testbed when there is one): about the MAPE a
/// predictor that knew the truth would score. Only uniform layouts, as in the examples.
fn print_measurement_noise(
    profiles: &[marshal_datasets::StepTimeProfile],
    repeats: Option<(&str, &[marshal_datasets::StepTimeProfile])>,
) {
    let uniform = |ps: &[marshal_datasets::StepTimeProfile]| -> Vec<_> {
        ps.iter()
            .filter(|p| {
                p.placement
                    .as_deref()
                    .is_some_and(|l| l.chars().all(|c| l.starts_with(c)))
            })
            .cloned()
            .collect()
    };
    let ours = uniform(profiles);
    let show = |e: marshal_datasets::NoiseEstimate, what: &str| {
        format!(
            "{:.1} % (median-based {:.1} %) over {} {what}",
            e.mean_abs_error * 100.0,
            e.median_based_error * 100.0,
            e.residuals
        )
    };
    let mut line = match marshal_datasets::neighbour_noise(&ours) {
        Some(e) => format!(
            "measurement noise, mean |error| of one step time: {} by neighbouring batch sizes",
            show(e, "interior points")
        ),
        None => "measurement noise: no series with three batch sizes".to_string(),
    };
    if let Some((name, other)) = repeats {
        let r = marshal_datasets::repeat_noise(&ours, &uniform(other));
        if let Some(e) = r.estimate {
            line += &format!(
                "; {} by repeats in `{name}` ({} exact copies left out)",
                show(e, "differing pairs"),
                r.copies
            );
        }
    }
    println!("{line}; a predictor that knew the truth would score about that MAPE");
}

/// The profiles of Sia's GPU type `suffix`, without `gpt_pmp`: its pipeline and model
/// parallelism is not the data parallelism the measured examples describe.
fn sia_only(
    profiles: &[marshal_datasets::StepTimeProfile],
    suffix: &str,
) -> Vec<marshal_datasets::StepTimeProfile> {
    profiles
        .iter()
        .filter(|p| p.gpu_type == suffix && p.model != "gpt_pmp")
        .cloned()
        .collect()
}

/// Profile `p` as a measurement on GPU model `gpu` with `placement` (one digit per node).
fn measured_step(
    p: &marshal_datasets::StepTimeProfile,
    gpu: &str,
    placement: String,
) -> Option<MeasuredStep> {
    Some(MeasuredStep {
        model: p.model.clone(),
        gpu_type: gpu.into(),
        placement,
        local_bsz: p.local_bsz,
        step_time_s: p.step_time_s,
    })
}

/// The second experiment of a measured set, as examples with job ids of their own
/// (`scalability:` + the usual id): the scalability runs (Pollux's: 6–16 nodes; Sia's:
/// up to 5 nodes on `azure`, 3 on `rtx`, 2 on `dgx`) whose GPUs divide evenly over their
/// nodes (at most 9 per node), as a uniform placement.
fn scalability_set(set: MeasuredSet) -> anyhow::Result<Vec<StepExample>> {
    let (profiles, gpu) = match set.sia() {
        None => (marshal_datasets::pollux_scalability_profiles()?.0, "T4"),
        Some((suffix, gpu, _)) => {
            let (p, _) =
                marshal_datasets::load_sia_scalability_profiles().context(SIA_FROM_TRACES)?;
            (sia_only(&p, suffix), gpu)
        }
    };
    let steps: Vec<MeasuredStep> = profiles
        .iter()
        .filter(|p| p.nodes > 0 && p.replicas % p.nodes == 0)
        .filter_map(|p| {
            let per_node = char::from_digit(p.replicas / p.nodes, 10)?;
            measured_step(
                p,
                gpu,
                std::iter::repeat_n(per_node, p.nodes as usize).collect(),
            )
        })
        .collect();
    let (mut examples, _) = measured_examples(&steps);
    for e in &mut examples {
        e.job_id = format!("scalability:{}", e.job_id);
    }
    println!(
        "{} scalability runs with uniform layouts of {}",
        examples.len(),
        profiles.len()
    );
    Ok(examples)
}

/// One fold's (or a group's pooled) step-time errors.
#[derive(Clone, Debug, PartialEq)]
struct MeasuredRow {
    group: &'static str,
    label: String,
    train: usize,
    test: usize,
    learned: f64,
    coverage: f64,
    prior: f64,
    prior_linear: f64,
    lookup: f64,
    linear: f64,
}

/// Trains and tests one predictor per fold: the prior's constants from the fold's
/// training side ([`fit_measured_prior`] in `form`), then the history, the network, its
/// interval calibration and the baselines as for telemetry. Rows per fold, then one
/// pooled row per group (means weighted by test examples, i.e. the MAPE and coverage of
/// all the group's held-out predictions together).
fn measured_report(
    base: &ClusterContext,
    folds: &[MeasuredFold],
    config: &PredictorConfig,
    form: PriorForm,
    device: &marshal_model::Device,
) -> anyhow::Result<Vec<MeasuredRow>> {
    let mut rows = Vec::new();
    for f in folds {
        let started = std::time::Instant::now();
        let prior = PriorSource::Fitted {
            base,
            kinds: f.kinds(),
            form,
        };
        let mut cost = TrainingCost::default();
        let (predictor, history, ctx) =
            train_calibrated(&prior, &f.split, config, device, &mut cost)?;
        let (learned, coverage) = model_errors(&predictor, &ctx, &history, &f.split.test)?;
        let (prior, _) = prior_errors(&ctx, &history, &f.split.test);
        let prior_linear = prior_linear_errors(&ctx, &history, &f.split)?;
        let (lookup, linear) = baseline_errors(&f.split)?;
        let row = MeasuredRow {
            group: f.group,
            label: f.label.clone(),
            train: f.split.train.len(),
            test: f.split.test.len(),
            learned,
            coverage,
            prior,
            prior_linear,
            lookup,
            linear,
        };
        eprintln!(
            "{} {}: {} / {} examples, learned {learned:.1} % ({coverage:.0} % inside), prior \
             {prior:.1} %, prior + linear {prior_linear:.1} %, lookup {lookup:.1} %, linear \
             {linear:.1} %; {} epochs, {:.1} s \
             ({:.1} s calibration runs); {}",
            row.group,
            row.label,
            row.train,
            row.test,
            cost.epochs,
            started.elapsed().as_secs_f64(),
            cost.aux_seconds,
            novel_summary(predictor.calibration()),
        );
        rows.push(row);
    }
    let groups: std::collections::BTreeSet<&'static str> = rows.iter().map(|r| r.group).collect();
    let mut pooled = Vec::new();
    for g in groups {
        let members: Vec<&MeasuredRow> = rows.iter().filter(|r| r.group == g).collect();
        let n: usize = members.iter().map(|r| r.test).sum();
        let mean = |v: &dyn Fn(&MeasuredRow) -> f64| {
            members.iter().map(|r| v(r) * r.test as f64).sum::<f64>() / n.max(1) as f64
        };
        pooled.push(MeasuredRow {
            group: g,
            label: format!("all {} folds", members.len()),
            train: members.iter().map(|r| r.train).sum::<usize>() / members.len().max(1),
            test: n,
            learned: mean(&|r| r.learned),
            coverage: mean(&|r| r.coverage),
            prior: mean(&|r| r.prior),
            prior_linear: mean(&|r| r.prior_linear),
            lookup: mean(&|r| r.lookup),
            linear: mean(&|r| r.linear),
        });
    }
    rows.extend(pooled);
    Ok(rows)
}

/// `marshal eval predictor --measured SET`: see [`measured_report`].
fn eval_measured(
    set: MeasuredSet,
    which: MeasuredFolds,
    config: &PredictorConfig,
    form: PriorForm,
    device: &marshal_model::Device,
) -> anyhow::Result<()> {
    let seed = config.seed;
    let (examples, cluster) = measured_set(set)?;
    let base = context(cluster)?;
    let mut folds = Vec::new();
    let all = which == MeasuredFolds::All;
    if all || which == MeasuredFolds::Shapes {
        folds.extend(leave_one_class_out(&examples, seed, 0.1));
    }
    if all || which == MeasuredFolds::Models {
        folds.extend(leave_one_model_out(&examples, seed, 0.1));
    }
    if all || which == MeasuredFolds::Scale {
        let other = scalability_set(set)?;
        folds.extend(test_on_other_set(
            &examples,
            &other,
            seed,
            0.1,
            "scalability runs",
        ));
    }
    let rows = measured_report(&base, &folds, config, form, device)?;
    println!(
        "| held out | train / test | learned MAPE | 90 % interval holds | prior alone | prior + linear | lookup | linear | learned vs best baseline |"
    );
    println!("|---|---|---|---|---|---|---|---|---|");
    for r in &rows {
        let best = r.lookup.min(r.linear);
        println!(
            "| {}: {} | {} / {} | {:.1} % | {:.0} % | {:.1} % | {:.1} % | {:.1} % | {:.1} % | {:+.1} % |",
            r.group,
            r.label,
            r.train,
            r.test,
            r.learned,
            r.coverage,
            r.prior,
            r.prior_linear,
            r.lookup,
            r.linear,
            (r.learned / best - 1.0) * 100.0
        );
    }
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
    history: &StepHistory,
    examples: &[StepExample],
) -> Vec<(marshal_model::PlacementGraph, Targets)> {
    examples
        .iter()
        .filter_map(|e| ctx.featurize(e, history))
        .collect()
}

/// The speed factor of an example's placement, for the history.
/// Most gangs in a trace are one GPU, whose step time does not depend on placement; the
/// few multi-GPU examples are the ones that teach the network what spreading costs.
/// Repeating each multi-GPU example (up to 8 times, until the two groups weigh about the
/// same) keeps the single-GPU majority from drowning them out. Training side only.
fn rebalanced(
    mut data: Vec<(marshal_model::PlacementGraph, Targets)>,
) -> Vec<(marshal_model::PlacementGraph, Targets)> {
    let multi: Vec<_> = data
        .iter()
        .filter(|(g, _)| g.gpus.len() > 1)
        .cloned()
        .collect();
    if multi.is_empty() {
        return data;
    }
    let single = data.len() - multi.len();
    let repeats = (single / multi.len()).clamp(1, 8);
    for _ in 1..repeats {
        data.extend(multi.iter().cloned());
    }
    data
}

/// Step-time MAPE and the share of truths inside the predicted 90 % interval.
fn model_errors(
    predictor: &marshal_model::TrainedPredictor,
    ctx: &ClusterContext,
    history: &StepHistory,
    test: &[StepExample],
) -> anyhow::Result<(f64, f64)> {
    let data = graphs(ctx, history, test);
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

/// Step-time MAPE of the featuriser's prior alone (no network).
fn prior_errors(ctx: &ClusterContext, history: &StepHistory, test: &[StepExample]) -> (f64, usize) {
    let truth: Vec<f64> = test.iter().map(|e| e.step_time_s).collect();
    let prior: Vec<f64> = test.iter().map(|e| ctx.prior_step_s(e, history)).collect();
    (mape(&prior, &truth), test.len())
}

/// Step-time MAPE of an ablation: the same prior with a linear residual in place of the
/// graph network (ridge regression of `ln y − ln prior` on the linear baseline's
/// features, fitted on the training side).
fn prior_linear_errors(
    ctx: &ClusterContext,
    history: &StepHistory,
    split: &Split,
) -> anyhow::Result<f64> {
    let relative: Vec<StepExample> = split
        .train
        .iter()
        .map(|e| StepExample {
            step_time_s: e.step_time_s / ctx.prior_step_s(e, history),
            ..e.clone()
        })
        .collect();
    let residual = LinearBaseline::fit(&relative, 1e-2)?;
    let predicted: Vec<f64> = split
        .test
        .iter()
        .map(|e| ctx.prior_step_s(e, history) * residual.predict(e))
        .collect();
    let truth: Vec<f64> = split.test.iter().map(|e| e.step_time_s).collect();
    Ok(mape(&predicted, &truth))
}

/// MAPE and interval coverage per (span, GPU count) class of a test set, multi-GPU only.
fn per_class_errors(
    predictor: &marshal_model::TrainedPredictor,
    ctx: &ClusterContext,
    history: &StepHistory,
    test: &[StepExample],
) -> anyhow::Result<Vec<(String, f64, f64)>> {
    let mut classes: std::collections::BTreeMap<(String, u32), Vec<StepExample>> =
        Default::default();
    for e in test.iter().filter(|e| e.num_gpus > 1) {
        classes
            .entry((e.span.clone(), e.num_gpus))
            .or_default()
            .push(e.clone());
    }
    classes
        .into_iter()
        .map(|((span, n), examples)| {
            let (m, cov) = model_errors(predictor, ctx, history, &examples)?;
            Ok((
                format!("{n} GPUs within {span} ({})", examples.len()),
                m,
                cov,
            ))
        })
        .collect()
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

/// Trains one predictor per test set, reports each against the baselines, and saves the
/// held-out-jobs model with the history its inputs were computed from.
pub fn train(a: TrainPredictorArgs) -> anyhow::Result<()> {
    let device = a.device.open()?;
    let ctx = context(&a.cluster)?;
    let examples = on_cluster_gpus(load(&a.telemetry)?, &ctx, &a.cluster)?;
    let config = PredictorConfig::new()
        .with_seed(a.seed)
        .with_max_epochs(a.max_epochs)
        .with_nll_beta(a.nll_beta);
    config.validate()?;
    let mut scores = std::collections::BTreeMap::new();
    let mut saved = None;
    for s in splits(&examples, a.seed) {
        if !usable(&s) {
            println!("{}: a side is empty, skipped", s.name);
            continue;
        }
        let split = &s.split;
        let started = std::time::Instant::now();
        let mut cost = TrainingCost::default();
        let (predictor, history, _) = train_calibrated(
            &PriorSource::Fixed(&ctx),
            split,
            &config,
            &device,
            &mut cost,
        )?;
        let (model_mape, coverage) = model_errors(&predictor, &ctx, &history, &split.test)?;
        let (prior_mape, _) = prior_errors(&ctx, &history, &split.test);
        let prior_linear = prior_linear_errors(&ctx, &history, split)?;
        let (lookup, linear) = baseline_errors(split)?;
        let c = predictor.calibration();
        println!(
            "{}: learned {model_mape:.1} % (90 % interval holds {coverage:.0} %), prior alone {prior_mape:.1} %, \
             prior + linear {prior_linear:.1} %, lookup {lookup:.1} %, linear {linear:.1} % step-time MAPE; {} train / {} test examples, \
             {} epochs in {:.1} s ({:.1} s of it calibration runs); σ × {:.2} trained shapes ({} residuals), {}",
            s.name,
            split.train.len(),
            split.test.len(),
            cost.epochs,
            started.elapsed().as_secs_f64(),
            cost.aux_seconds,
            c.seen_multiplier,
            c.seen_residuals,
            novel_summary(c),
        );
        for (label, m, cov) in per_class_errors(&predictor, &ctx, &history, &split.test)? {
            println!("    {label}: learned {m:.1} %, interval holds {cov:.0} %");
        }
        let key = s.key;
        scores.insert(format!("{key}_step_time_mape"), model_mape);
        scores.insert(format!("{key}_interval90_coverage_pct"), coverage);
        scores.insert(format!("{key}_prior_mape"), prior_mape);
        scores.insert(format!("{key}_prior_linear_mape"), prior_linear);
        scores.insert(format!("{key}_lookup_mape"), lookup);
        scores.insert(format!("{key}_linear_mape"), linear);
        if key == "holdout_jobs" {
            saved = Some((predictor, history));
        }
    }
    let (predictor, history) =
        saved.context("the held-out-job split had an empty side: nothing to save")?;
    scores.insert("split_seed".into(), a.seed as f64);
    // The history rides in the artifact, checksummed by its meta.json: weights and
    // history always come from the same run.
    let info = ArtifactInfo {
        training_data_hash: data_hash(&examples),
        eval_scores: scores,
        attachments: [(HISTORY_FILE.to_string(), history.to_json()?.into_bytes())].into(),
    };
    marshal_model::artifact::save(&a.out, &predictor, &info)
        .with_context(|| format!("saving {}", a.out.display()))?;
    println!("saved {}", a.out.display());
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use marshal_model::{GpuNodeFeatures, PlacementGraph};

    #[test]
    fn a_sia_set_is_one_gpu_type_of_the_data_parallel_models_on_its_testbed() {
        if let Err(e) = marshal_datasets::load_sia_placement_profiles() {
            eprintln!("skipped: Sia's profiles are not in the traces directory ({e})");
            return;
        }
        // Uniform layouts of the six data-parallel models (counted from the CSV files).
        for (set, gpu, memory, cluster, placements, scalability, widest) in [
            (
                MeasuredSet::SiaAzure,
                "V100M32",
                32.0,
                "nd40rs-v100-64",
                1064,
                781,
                5,
            ),
            (
                MeasuredSet::SiaDgx,
                "A100-40",
                40.0,
                "dgx-a100-64",
                866,
                375,
                2,
            ),
            (
                MeasuredSet::SiaRtx,
                "RTX2080Ti",
                11.0,
                "rtx2080ti-64",
                858,
                621,
                3,
            ),
            (
                MeasuredSet::SiaQuad,
                "RTX6000",
                24.0,
                "quadro-rtx6000-32",
                260,
                260,
                1,
            ),
        ] {
            let (examples, c) = measured_set(set).unwrap();
            assert_eq!((c, examples.len()), (cluster, placements), "{set:?}");
            let scale = scalability_set(set).unwrap();
            assert_eq!(scale.len(), scalability, "{set:?}");
            assert_eq!(scale.iter().map(|e| e.nodes).max(), Some(widest), "{set:?}");
            assert!(
                examples.iter().chain(&scale).all(|e| e.gpu_type == gpu
                    && !e.model.starts_with("gpt_pmp")
                    && e.comm == "data-parallel"),
                "{set:?}"
            );
            // The testbed's cluster knows the GPU model: its memory, not the default 16 GiB.
            let ctx = context(cluster).unwrap();
            let history = StepHistory::fit(&examples, |_| 1.0);
            let (graph, _) = ctx.featurize(&examples[0], &history).unwrap();
            assert_eq!(graph.gpus[0].values[0], memory, "{set:?}");
        }
    }

    fn graph(gpus: usize) -> (PlacementGraph, Targets) {
        let g = PlacementGraph {
            gpus: vec![GpuNodeFeatures::default(); gpus],
            ..Default::default()
        };
        let t = Targets {
            step_time_s: gpus as f32,
            peak_mem_gib: [f32::NAN; 4],
            gpu_util_pct: f32::NAN,
        };
        (g, t)
    }

    #[test]
    fn the_measured_report_has_a_row_per_fold_and_a_pooled_row_per_group() {
        // Two models at two batches on uniform placements, step time = compute plus a
        // communication cost that grows when spread.
        let mut steps = Vec::new();
        for (model, base) in [("bert", 0.2), ("cifar10", 0.05)] {
            for bsz in [32, 64] {
                for (placement, comm) in [
                    ("1", 0.0),
                    ("2", 0.01),
                    ("4", 0.02),
                    ("11", 0.05),
                    ("22", 0.08),
                    ("1111", 0.1),
                    ("44", 0.12),
                ] {
                    steps.push(MeasuredStep {
                        model: model.into(),
                        gpu_type: "T4".into(),
                        placement: placement.into(),
                        local_bsz: bsz,
                        step_time_s: base * f64::from(bsz) / 32.0 + comm,
                    });
                }
            }
        }
        let (examples, _) = measured_examples(&steps);
        let base = context("pollux-64").unwrap();
        let mut folds = leave_one_class_out(&examples, 1, 0.25);
        let shapes = folds.len();
        folds.extend(leave_one_model_out(&examples, 1, 0.25));
        assert!(
            shapes >= 4 && folds.len() > shapes,
            "{shapes} / {}",
            folds.len()
        );
        let config = PredictorConfig::new()
            .with_seed(1)
            .with_max_epochs(2)
            .with_patience(1);
        let rows = measured_report(
            &base,
            &folds,
            &config,
            PriorForm::Sync,
            &marshal_model::device::cpu(),
        )
        .unwrap();
        assert_eq!(rows.len(), folds.len() + 2);
        for (row, fold) in rows.iter().zip(&folds) {
            assert_eq!((row.group, &row.label), (fold.group, &fold.label));
            assert_eq!(
                (row.train, row.test),
                (fold.split.train.len(), fold.split.test.len())
            );
        }
        for r in &rows {
            for v in [r.learned, r.prior, r.prior_linear, r.lookup, r.linear] {
                assert!(v.is_finite() && v >= 0.0, "{r:?}");
            }
            assert!((0.0..=100.0).contains(&r.coverage), "{r:?}");
        }
        // The pooled rows hold every held-out example of their group once.
        for (group, pooled) in [
            ("unseen model", &rows[folds.len()]),
            ("unseen shape", &rows[folds.len() + 1]),
        ] {
            assert_eq!(pooled.group, group);
            let n: usize = folds
                .iter()
                .filter(|f| f.group == group)
                .map(|f| f.split.test.len())
                .sum();
            assert_eq!(pooled.test, n);
        }
        assert_eq!(
            rows[folds.len() + 1].test,
            examples.iter().filter(|e| e.num_gpus > 1).count()
        );
    }

    #[test]
    fn multi_gpu_examples_are_repeated_until_they_weigh_like_the_single_gpu_ones() {
        let data: Vec<_> = (0..10)
            .map(|_| graph(1))
            .chain([graph(2), graph(4)])
            .collect();
        let out = rebalanced(data);
        let multi = out.iter().filter(|(g, _)| g.gpus.len() > 1).count();
        assert_eq!((out.len() - multi, multi), (10, 10));
        // Never more than 8 copies, and nothing to do without multi-GPU examples.
        let data: Vec<_> = (0..100).map(|_| graph(1)).chain([graph(8)]).collect();
        assert_eq!(rebalanced(data).len(), 108);
        assert_eq!(rebalanced(vec![graph(1); 3]).len(), 3);
    }
}
