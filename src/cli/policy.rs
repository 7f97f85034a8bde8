//! `marshal train policy` and the `learned` policy's setup for `sim`, `eval` and `demo`.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Instant;

use anyhow::{Context as _, bail};
use clap::Args;
use marshal_model::policy::{CandidateSet, PolicyMeta, save_policy};
use marshal_scheduler::domain::Job;
use marshal_scheduler::framework::Policy;
use marshal_scheduler::policies::learned::{self, GateStats, LearnedModel};
use marshal_trainer::policy::{
    DeclineOptions, EpisodeSpec, PolicyGradient, ProgressEvent, RolloutOptions, TrainOptions,
    ValidationRow, regate, train_decline, train_policy, training_summary, validation_scores,
};

use crate::cli::sim::{Experiment, ModeArg, SimArgs};

/// Where `marshal` looks for the shipped policy when `--model` is not given: `models/
/// policy-default` under the working directory, else under the source tree it was built
/// from.
pub fn default_model_dir() -> PathBuf {
    let local = PathBuf::from("models/policy-default");
    if local.join("meta.json").exists() {
        local
    } else {
        Path::new(env!("CARGO_MANIFEST_DIR")).join("models/policy-default")
    }
}

pub use marshal_scheduler::policies::learned::LearnedSetup;

/// Loads the learned policy's model (a missing or bad one is reported on stderr and the
/// policy then runs on its fallback) and picks the fallback for `mode`.
pub fn load_setup(model: Option<&Path>, fallback: Option<&str>, mode: ModeArg) -> LearnedSetup {
    let dir = model.map_or_else(default_model_dir, Path::to_path_buf);
    let objective = match mode {
        ModeArg::Replay => "replay",
        ModeArg::Inflation => "inflation",
    };
    let setup = LearnedSetup::load(&dir, fallback, objective);
    if let Err(why) = &setup.model.scorer {
        eprintln!("warning: learned policy: {why}; every decision falls back to the heuristic");
    }
    for why in setup.gate_warning.iter().chain(&setup.decline_warning) {
        eprintln!("warning: learned policy: {why}");
    }
    setup
}

/// Checks a policy name (`learned` or a heuristic).
pub fn check_name(name: &str) -> anyhow::Result<()> {
    Ok(learned::check_name(name)?)
}

/// Builds a policy by name; `learned` comes with its decision counters (the scheduler
/// crate's `build_policy`, shared with `marshal serve`).
pub fn build_policy(
    name: &str,
    jobs: &[Job],
    learned: Option<&LearnedSetup>,
) -> anyhow::Result<(Policy, Option<Arc<GateStats>>)> {
    Ok(learned::build_policy(name, jobs, learned)?)
}

#[derive(Debug, Args)]
pub struct TrainPolicyArgs {
    /// Training episodes: `TRACE[@CLUSTER][:replay|:inflation]`, comma-separated (openb
    /// traces default to inflation on `openb`, others to replay on their own cluster).
    #[arg(long, value_delimiter = ',', required = true)]
    traces: Vec<String>,
    /// Validation episodes (same syntax); the gate's threshold is chosen on them.
    #[arg(long, value_delimiter = ',', required = true)]
    valid_traces: Vec<String>,
    /// Output directory of the artifact (created).
    #[arg(long)]
    out: PathBuf,
    /// The candidates the network learns to rank: `ranked` (the fallback's choice, FGD's
    /// and best fit's best nodes) or `wide` (those, then one node of every further class
    /// of place for one-worker jobs, up to 16 candidates). Recorded in the artifact.
    #[arg(long, default_value = "ranked")]
    candidates: CandidateSet,
    #[arg(long, allow_negative_numbers = true, default_value_t = 0)]
    seed: u64,
    /// Seeds per training trace (episodes use seeds 1000 + seed …, never an evaluation seed).
    #[arg(long, allow_negative_numbers = true, default_value_t = 2)]
    seeds_per_trace: u64,
    /// Seeds per validation trace (seeds 2000 + seed …): the snapshot and the gate are
    /// chosen on all of them, so more seeds make the choice less a matter of one seed's luck.
    #[arg(long, allow_negative_numbers = true, default_value_t = 1)]
    valid_seeds_per_trace: u64,
    #[arg(long, allow_negative_numbers = true, default_value_t = 8)]
    bc_epochs: usize,
    /// Expert-iteration rounds on the inflation episodes (rollout labels; 0: none).
    #[arg(long, allow_negative_numbers = true, default_value_t = 0)]
    expert_rounds: usize,
    /// Cross-entropy passes per expert round.
    #[arg(long, allow_negative_numbers = true, default_value_t = 4)]
    expert_epochs: usize,
    /// Weight (repetitions) of a rollout-labelled decision against a cloned one.
    #[arg(long, allow_negative_numbers = true, default_value_t = 4)]
    expert_weight: usize,
    /// Rollout-labelled decisions per inflation episode and round.
    #[arg(long, allow_negative_numbers = true, default_value_t = 200)]
    rollout_decisions: usize,
    /// Labelled decisions are drawn from arrived loads in [FROM, TO) %.
    #[arg(long, allow_negative_numbers = true, default_value_t = 70.0)]
    rollout_from: f64,
    #[arg(long, allow_negative_numbers = true, default_value_t = 100.0)]
    rollout_to: f64,
    /// A rollout stops at this arrived load (%) …
    #[arg(long, allow_negative_numbers = true, default_value_t = 100.5)]
    rollout_until: f64,
    /// … or after this many arrivals.
    #[arg(long, allow_negative_numbers = true, default_value_t = 1000)]
    rollout_horizon: usize,
    /// Futures resampled from the trace per labelled decision (0: the episode's own).
    #[arg(long, allow_negative_numbers = true, default_value_t = 0)]
    rollout_futures: usize,
    /// Threads rolling candidates out.
    #[arg(long, allow_negative_numbers = true, default_value_t = 1)]
    rollout_threads: usize,
    /// RL iterations (REINFORCE or PPO).
    #[arg(long, allow_negative_numbers = true, default_value_t = 6)]
    episodes: usize,
    /// How an RL iteration's samples update the network: one REINFORCE pass, or PPO's
    /// clipped surrogate over `--ppo-epochs` passes.
    #[arg(long, value_enum, default_value_t = PolicyGradientArg::Reinforce)]
    policy_gradient: PolicyGradientArg,
    /// PPO: passes over each iteration's samples.
    #[arg(long, allow_negative_numbers = true, default_value_t = 4)]
    ppo_epochs: usize,
    /// PPO: a decision's probability ratio is clipped to [1 − clip, 1 + clip].
    #[arg(long, allow_negative_numbers = true, default_value_t = 0.2)]
    ppo_clip: f32,
    #[arg(long, allow_negative_numbers = true, default_value_t = 2)]
    episodes_per_iteration: usize,
    #[arg(long, allow_negative_numbers = true, default_value_t = 3)]
    eval_every: usize,
    #[arg(long, allow_negative_numbers = true, default_value_t = 32)]
    hidden: usize,
    /// Heuristic the policy falls back to in replay episodes.
    #[arg(long, default_value = "topo-pack")]
    fallback_replay: String,
    /// Heuristic the policy falls back to in inflation episodes.
    #[arg(long, default_value = "fgd")]
    fallback_inflation: String,
}

#[derive(Copy, Clone, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum PolicyGradientArg {
    Reinforce,
    Ppo,
}

/// An episode spec `TRACE[@CLUSTER][:replay|:inflation]` on `seeds`, with the fallback
/// for its mode (`fallbacks`: replay, inflation).
pub fn parse_episode(
    spec: &str,
    fallbacks: (&str, &str),
    seeds: &[u64],
) -> anyhow::Result<EpisodeSpec> {
    if seeds.is_empty() {
        bail!("episode {spec}: at least one seed is needed");
    }
    let (rest, mode) = match spec.rsplit_once(':') {
        Some((r, "replay")) => (r, Some(ModeArg::Replay)),
        Some((r, "inflation")) => (r, Some(ModeArg::Inflation)),
        _ => (spec, None),
    };
    let (trace, cluster) = match rest.split_once('@') {
        Some((t, c)) => (t, Some(c.to_string())),
        None => (rest, None),
    };
    let mode = mode.unwrap_or(if trace.starts_with("openb") {
        ModeArg::Inflation
    } else {
        ModeArg::Replay
    });
    let args = SimArgs {
        mode,
        ..SimArgs::replay(trace, cluster, vec![], seeds[0])
    };
    let e = Experiment::load(&args).with_context(|| format!("episode {spec}"))?;
    let jobs_by_seed = seeds
        .iter()
        .map(|&s| Ok((s, e.jobs_for(s)?.into_owned())))
        .collect::<anyhow::Result<Vec<_>>>()?;
    let fallback = match mode {
        ModeArg::Replay => fallbacks.0.to_string(),
        ModeArg::Inflation => fallbacks.1.to_string(),
    };
    check_name(&fallback)?;
    Ok(EpisodeSpec {
        name: spec.to_string(),
        topo: e.topo.clone(),
        jobs_by_seed,
        config: e.config.clone(),
        fallback,
    })
}

/// FNV-1a 64 over the episode names, seeds and job counts: what the model was trained on.
fn data_hash(specs: &[EpisodeSpec]) -> String {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for s in specs {
        let text = format!(
            "{}|{:?}",
            s.name,
            s.jobs_by_seed
                .iter()
                .map(|(seed, jobs)| (*seed, jobs.len()))
                .collect::<Vec<_>>()
        );
        for b in text.bytes() {
            h ^= u64::from(b);
            h = h.wrapping_mul(0x0100_0000_01b3);
        }
    }
    format!("{h:016x}")
}

pub fn train(a: TrainPolicyArgs) -> anyhow::Result<()> {
    if a.seeds_per_trace == 0 || a.valid_seeds_per_trace == 0 {
        bail!("--seeds-per-trace and --valid-seeds-per-trace must be at least 1");
    }
    let opts = TrainOptions {
        seed: a.seed,
        hidden_size: a.hidden,
        bc_epochs: a.bc_epochs,
        expert_rounds: a.expert_rounds,
        expert_epochs: a.expert_epochs,
        expert_weight: a.expert_weight,
        rollout: RolloutOptions {
            decisions: a.rollout_decisions,
            from_pct: a.rollout_from,
            to_pct: a.rollout_to,
            until_pct: a.rollout_until,
            horizon: a.rollout_horizon,
            futures: a.rollout_futures,
            threads: a.rollout_threads,
            seed: a.seed,
        },
        rl_iterations: a.episodes,
        policy_gradient: match a.policy_gradient {
            PolicyGradientArg::Reinforce => PolicyGradient::Reinforce,
            PolicyGradientArg::Ppo => PolicyGradient::Ppo {
                epochs: a.ppo_epochs,
                clip: a.ppo_clip,
            },
        },
        episodes_per_iteration: a.episodes_per_iteration,
        eval_every: a.eval_every,
        candidates: a.candidates,
        ..TrainOptions::default()
    };
    opts.validate().map_err(|e| anyhow::anyhow!(e))?;
    let started = Instant::now();
    let train_seeds: Vec<u64> = (0..a.seeds_per_trace).map(|k| 1000 + a.seed + k).collect();
    let valid_seeds: Vec<u64> = (0..a.valid_seeds_per_trace)
        .map(|k| 2000 + a.seed + k)
        .collect();
    let train: Vec<EpisodeSpec> = a
        .traces
        .iter()
        .map(|t| parse_episode(t, (&a.fallback_replay, &a.fallback_inflation), &train_seeds))
        .collect::<anyhow::Result<_>>()?;
    let valid: Vec<EpisodeSpec> = a
        .valid_traces
        .iter()
        .map(|t| parse_episode(t, (&a.fallback_replay, &a.fallback_inflation), &valid_seeds))
        .collect::<anyhow::Result<_>>()?;
    let bar = progress_bar();
    let trained = train_policy(&train, &valid, &opts, &mut |e| report(&bar, e))
        .map_err(|e| anyhow::anyhow!(e))?;
    bar.finish_and_clear();
    let seconds = started.elapsed().as_secs_f64();

    let mut meta = PolicyMeta::new(trained.gate.margin_threshold, trained.gate.distance_limit);
    meta.fallback
        .insert("replay".into(), a.fallback_replay.clone());
    meta.fallback
        .insert("inflation".into(), a.fallback_inflation.clone());
    meta.training_data_hash = data_hash(&train);
    meta.eval_scores = validation_scores(&trained.validation);
    meta.training = training_summary(&opts, &trained, seconds);
    meta.candidates = a.candidates;
    save_policy(
        &a.out,
        &trained.network,
        &trained.config,
        &trained.stats,
        meta,
    )
    .with_context(|| format!("saving the policy to {}", a.out.display()))?;

    let mut curves = String::from("phase,step,samples,nll,agreement,value_mse,gain_pct\n");
    for p in &trained.curve {
        curves.push_str(&format!(
            "{},{},{},{},{},{},{}\n",
            p.phase, p.step, p.samples, p.nll, p.agreement, p.value_mse, p.gain_pct
        ));
    }
    crate::cli::output::write_whole(&a.out.join("curves.csv"), curves)?;
    let report = serde_json::json!({
        "train": a.traces,
        "valid": a.valid_traces,
        "train_seeds": train_seeds,
        "valid_seeds": valid_seeds,
        "kept": trained.kept,
        "gate": {"margin_threshold": trained.gate.margin_threshold, "distance_limit": trained.gate.distance_limit},
        "validation": trained.validation,
        "train_seconds": seconds,
        // The same settings as meta.json's `training`, expert iteration included.
        "settings": training_summary(&opts, &trained, seconds),
    });
    crate::cli::output::write_whole(
        &a.out.join("training.json"),
        serde_json::to_string_pretty(&report)?,
    )?;
    println!(
        "trained in {seconds:.0} s; kept {}; gate margin ≥ {:.2}, distance ≤ {:.2}",
        trained.kept, trained.gate.margin_threshold, trained.gate.distance_limit
    );
    print_validation(&trained.validation);
    println!(
        "artifact, curves.csv and training.json in {}",
        a.out.display()
    );
    Ok(())
}

fn progress_bar() -> indicatif::ProgressBar {
    let bar = indicatif::ProgressBar::new(0);
    bar.set_style(
        indicatif::ProgressStyle::with_template(
            "{elapsed_precise} {prefix:>9} [{bar:30}] {pos}/{len} {msg}",
        )
        .unwrap_or_else(|_| indicatif::ProgressStyle::default_bar())
        .progress_chars("=> "),
    );
    bar
}

fn report(bar: &indicatif::ProgressBar, e: ProgressEvent) {
    if bar.prefix() != e.phase {
        bar.set_prefix(e.phase);
        bar.set_length(e.total as u64);
    }
    bar.set_position(e.done as u64);
    bar.println(format!(
        "{:>9} {}/{}: {}",
        e.phase, e.done, e.total, e.message
    ));
}

fn print_validation(rows: &[ValidationRow]) {
    println!(
        "{:<40} {:>12} {:>12} {:>12} {:>10}",
        "validation episode", "fallback", "gated", "ungated", "fallback %"
    );
    for r in rows {
        println!(
            "{:<40} {:>12.2} {:>12.2} {:>12.2} {:>10.1}",
            r.episode,
            r.fallback,
            r.gated,
            r.ungated,
            100.0 * r.fallback_rate
        );
    }
}

#[derive(Debug, Args)]
pub struct TrainGateArgs {
    /// The policy artifact to gate (its `meta.json` is rewritten atomically; the weights
    /// and the trained threshold are kept).
    #[arg(long)]
    model: PathBuf,
    /// The fallback heuristic the threshold is chosen for.
    #[arg(long)]
    fallback: String,
    /// Validation episodes, as for `train policy`; every one runs with `--fallback`.
    #[arg(long, value_delimiter = ',', required = true)]
    valid_traces: Vec<String>,
    /// Validation seeds (training validates on 2000 + its seed; evaluation uses 42 …,
    /// so keep these apart from it).
    // A list: `-1,2` is no number, so negative numbers alone would not let it through.
    #[arg(
        long,
        allow_hyphen_values = true,
        value_delimiter = ',',
        default_value = "2000"
    )]
    seeds: Vec<u64>,
    /// Largest relative worsening against the fallback allowed on any episode.
    #[arg(long, allow_negative_numbers = true, default_value_t = 0.01)]
    tolerance: f64,
    /// Margin thresholds tried (training's list by default).
    #[arg(long, allow_hyphen_values = true, value_delimiter = ',')]
    margins: Option<Vec<f32>>,
}

/// `marshal train gate`: the trainer's threshold selection again, for another fallback.
pub fn gate(a: TrainGateArgs) -> anyhow::Result<()> {
    check_name(&a.fallback)?;
    let valid: Vec<EpisodeSpec> = a
        .valid_traces
        .iter()
        .map(|t| parse_episode(t, (&a.fallback, &a.fallback), &a.seeds))
        .collect::<anyhow::Result<_>>()?;
    let margins = a
        .margins
        .clone()
        .unwrap_or_else(|| TrainOptions::default().margins);
    let started = Instant::now();
    let bar = progress_bar();
    let (choice, _) = regate(
        &a.model,
        &a.fallback,
        &valid,
        &margins,
        a.tolerance,
        &mut |e| report(&bar, e),
    )
    .map_err(|e| anyhow::anyhow!(e))?;
    bar.finish_and_clear();
    if choice.within_tolerance {
        println!(
            "gate for fallback {}: margin ≥ {:.2} (best mean gain within {:.1} % of {} on every episode; {:.0} s)",
            a.fallback,
            choice.gate.margin_threshold,
            100.0 * a.tolerance,
            a.fallback,
            started.elapsed().as_secs_f64()
        );
    } else {
        println!(
            "gate for fallback {}: closed (no margin threshold stayed within {:.1} % of {}; every decision falls back; {:.0} s)",
            a.fallback,
            100.0 * a.tolerance,
            a.fallback,
            started.elapsed().as_secs_f64()
        );
    }
    print_validation(&choice.validation);
    println!(
        "recorded in {} (gates.{})",
        a.model.join("meta.json").display(),
        a.fallback
    );
    Ok(())
}

#[derive(Debug, Args)]
pub struct TrainDeclineArgs {
    /// The policy artifact (its `meta.json` gets the head, replaced atomically; the
    /// network and its gates are kept).
    #[arg(long)]
    model: PathBuf,
    /// Training episodes (inflation only), as for `train policy`.
    #[arg(long, value_delimiter = ',', required = true)]
    traces: Vec<String>,
    /// Validation episodes (inflation only): the head is stored only if it is nowhere
    /// worse than the network without it by more than `--tolerance`.
    #[arg(long, value_delimiter = ',', required = true)]
    valid_traces: Vec<String>,
    /// Seeds the search runs each training trace on (1000 + … keeps them apart from
    /// validation and evaluation).
    #[arg(
        long,
        allow_hyphen_values = true,
        value_delimiter = ',',
        default_value = "1000"
    )]
    seeds: Vec<u64>,
    /// Validation seeds.
    #[arg(
        long,
        allow_hyphen_values = true,
        value_delimiter = ',',
        default_value = "2000"
    )]
    valid_seeds: Vec<u64>,
    /// Seed of the search's draws.
    #[arg(long, allow_negative_numbers = true, default_value_t = 0)]
    seed: u64,
    #[arg(long, allow_negative_numbers = true, default_value_t = DeclineOptions::default().iterations)]
    iterations: usize,
    /// Heads drawn per iteration.
    #[arg(long, allow_negative_numbers = true, default_value_t = DeclineOptions::default().population)]
    population: usize,
    /// The best this many set the next iteration's distribution.
    #[arg(long, allow_negative_numbers = true, default_value_t = DeclineOptions::default().elite)]
    elite: usize,
    /// The rule the search starts from: decline while the whole-GPU pressure (the
    /// whole-GPU demand forecast to arrive before 100 % arrived load, over the idle
    /// GPUs) is at least this.
    #[arg(long, allow_negative_numbers = true, default_value_t = DeclineOptions::default().init_threshold)]
    init_threshold: f32,
    /// The initial spread of every weight.
    #[arg(long, allow_negative_numbers = true, default_value_t = DeclineOptions::default().init_std)]
    init_std: f32,
    /// Largest relative loss against the network without a head allowed on any
    /// validation episode.
    #[arg(long, allow_negative_numbers = true, default_value_t = DeclineOptions::default().tolerance)]
    tolerance: f64,
    /// Also search a share-ties switch with the head: the workloads (a box around their
    /// mixes) whose shares FGD with sum-of-squares ties (`fgd-sumsq`) places instead of
    /// the network. Needs FGD as the fallback.
    #[arg(long)]
    share_ties: bool,
    /// Episodes run at once.
    #[arg(long, allow_negative_numbers = true, default_value_t = 1)]
    threads: usize,
}

/// `marshal train decline`: the decline head's search, its validation, and the record.
pub fn decline(a: TrainDeclineArgs) -> anyhow::Result<()> {
    let model = LearnedModel::try_load(&a.model)
        .map_err(|e| anyhow::anyhow!("policy model {}: {e}", a.model.display()))?;
    let fallback = model.fallback_for("inflation");
    let specs = |traces: &[String], seeds: &[u64]| -> anyhow::Result<Vec<EpisodeSpec>> {
        traces
            .iter()
            .map(|t| parse_episode(t, (&fallback, &fallback), seeds))
            .collect()
    };
    let train = specs(&a.traces, &a.seeds)?;
    let valid = specs(&a.valid_traces, &a.valid_seeds)?;
    let opts = DeclineOptions {
        seed: a.seed,
        iterations: a.iterations,
        population: a.population,
        elite: a.elite,
        init_threshold: a.init_threshold,
        init_std: a.init_std,
        tolerance: a.tolerance,
        share_ties: a.share_ties,
        threads: a.threads,
    };
    let started = Instant::now();
    let bar = progress_bar();
    let search = train_decline(&a.model, &train, &valid, &opts, &mut |e| report(&bar, e))
        .map_err(|e| anyhow::anyhow!(e))?;
    bar.finish_and_clear();
    for r in &search.curve {
        println!(
            "iteration {:>2}: best {:+.2} % (mean gain {:+.2} %), elite {:+.2} %, population {:+.2} %",
            r.iteration,
            100.0 * r.best,
            100.0 * r.best_gain,
            100.0 * r.elite_mean,
            100.0 * r.mean
        );
    }
    println!(
        "best head: training fitness {:+.2} %, weights {:?}",
        100.0 * search.training_fitness,
        search.head.weights
    );
    match &search.head.share_ties {
        Some(ties) => println!(
            "share-ties switch: on while the workload's {:?} lie in {:?}",
            ties.feature_names, ties.bounds
        ),
        None if a.share_ties => {
            println!("share-ties switch: off for every training workload (none recorded)")
        }
        None => {}
    }
    println!("validation (unallocated GPUs at 100 %, without → with the head):");
    for r in &search.validation {
        println!(
            "  {:<36} {:8.1} → {:8.1}  ({:+.2} %, {} shares declined{})",
            r.episode,
            r.without,
            r.with,
            -100.0 * (r.with - r.without) / r.without.max(f64::MIN_POSITIVE),
            r.declined,
            if a.share_ties {
                format!(", {} with sum-of-squares ties", r.sum_of_squares_ties)
            } else {
                String::new()
            }
        );
    }
    match &search.stored {
        Some(_) => println!(
            "decline head recorded in {} ({:.0} s)",
            a.model.join("meta.json").display(),
            started.elapsed().as_secs_f64()
        ),
        None if search.training_fitness <= 0.0 => println!(
            "no decline head recorded: no head the search drew beat having none on the training \
             episodes (any earlier head was removed; {:.0} s)",
            started.elapsed().as_secs_f64()
        ),
        None => println!(
            "no decline head recorded: it was more than {:.1} % worse than the network without \
             it on a validation episode (any earlier head was removed; {:.0} s)",
            100.0 * a.tolerance,
            started.elapsed().as_secs_f64()
        ),
    }
    Ok(())
}
