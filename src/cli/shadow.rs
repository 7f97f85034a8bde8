//! `marshal shadow`: what Marshal would have done beside another scheduler (see the
//! README). Replay mode reads a recorded log; live mode serves only the Advisor; report
//! mode summarises a live mode's shadow log or, given the incumbent's outcomes, replays
//! it like a recorded log. None of them acts.

use std::io::Write as _;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use anyhow::{Context as _, bail};
use clap::Args;
use marshal_datasets::ParseReport;
use marshal_scheduler::domain::{Job, Topology};
use marshal_scheduler::service::{self, ServiceConfig, tokio};
use marshal_scheduler::shadow::{self, LiveReport, MarshalPolicy, Recorded, Shadow, ShadowReport};

use crate::cli::output::Format;
use crate::cli::shadow_log;
use crate::cli::sim::{ModeArg, default_cluster_for};

#[derive(Debug, Args)]
pub struct ShadowArgs {
    /// Replay mode: the recorded log, an openb pod list with `scheduled_time`
    /// (`openb-default`, `openb-<variant>` or a path; an optional `node` column is
    /// honoured) or Alibaba's DLRM serving trace (`dlrm` or a path).
    #[arg(long, conflicts_with_all = ["listen", "report_log"])]
    pub trace: Option<String>,
    /// Cluster (preset, TOML or node CSV); defaults to the trace's own (`openb`, `dlrm-peak`
    /// for `dlrm`). Required with `--outcomes`: a shadow log records no cluster.
    #[arg(long)]
    pub cluster: Option<String>,
    /// Marshal's policy (see `marshal list`; default `topo-pack`); in live mode the
    /// default for calls that name none, and `--config`'s `policy` when not given.
    #[arg(long)]
    pub policy: Option<String>,
    /// The `learned` policy's artifact directory (default: `models/policy-default`).
    #[arg(long)]
    pub model: Option<PathBuf>,
    /// The `learned` policy's fallback heuristic (default: the artifact's).
    #[arg(long)]
    pub fallback: Option<String>,
    /// The heuristic whose placer puts the incumbent's jobs when the log names no node
    /// (default `best-fit`).
    #[arg(long)]
    pub incumbent_placer: Option<String>,
    #[arg(long, allow_negative_numbers = true, default_value_t = 42)]
    pub seed: u64,
    /// Replay mode and `--outcomes`: write `report.json`, `records.jsonl` and
    /// `allocation.csv` here.
    #[arg(long)]
    pub out: Option<PathBuf>,
    #[arg(long, value_enum, default_value_t = Format::Table)]
    pub format: Format,
    /// Live mode: serve the Advisor (and health) on this address (port 0: any free one).
    #[arg(long)]
    pub listen: Option<String>,
    /// Live mode: the shadow log every recommendation is appended to (JSON lines).
    #[arg(long, default_value = "shadow-log.jsonl")]
    pub log: PathBuf,
    /// Live mode: once the log holds this many MiB it becomes `LOG.1` (older ones shift
    /// to `LOG.2`, …) and a new log begins. Default: one file, never rotated.
    #[arg(long, allow_negative_numbers = true, value_parser = clap::value_parser!(u64).range(1..))]
    pub log_rotate_mib: Option<u64>,
    /// Live mode, with `--log-rotate-mib`: rotated logs kept; older ones are deleted.
    #[arg(long, allow_negative_numbers = true, default_value_t = 10, requires = "log_rotate_mib", value_parser = clap::value_parser!(u64).range(1..=1000))]
    pub log_keep: u64,
    /// Live mode: a `marshal serve` configuration file for TLS and client tokens (its
    /// `listen` and `policy` are overridden by the flags).
    #[arg(long)]
    pub config: Option<PathBuf>,
    /// Marshal's policy keeps CPU-only jobs off GPU nodes while a CPU-only node can take
    /// them (see `marshal sim --cpu-nodes-first`); the incumbent's placer does not. Live
    /// mode: the same as `cpu_nodes_first = true` in `--config`.
    #[arg(long)]
    pub cpu_nodes_first: bool,
    /// Summarise a live mode's shadow log (with `--outcomes`: estimate the effect).
    #[arg(long, conflicts_with = "listen")]
    pub report_log: Option<PathBuf>,
    /// With `--report-log`: what the incumbent did with the log's jobs, a CSV
    /// `job,scheduled_time,deletion_time[,node]` in Unix seconds (the log's clock).
    #[arg(long, requires = "report_log")]
    pub outcomes: Option<PathBuf>,
}

/// Marshal's policy when `--policy` is not given (in live mode, nor in `--config`).
const DEFAULT_POLICY: &str = "topo-pack";
/// The incumbent's placer when `--incumbent-placer` is not given.
const DEFAULT_INCUMBENT_PLACER: &str = "best-fit";

/// What both replays run from: a cluster, the log's jobs and what the incumbent did.
#[derive(Debug)]
pub(crate) struct ReplayInput {
    pub topo: Arc<Topology>,
    pub jobs: Vec<Job>,
    pub recorded: Vec<Recorded>,
    /// The log's name in the report.
    pub trace: String,
}

pub fn run(args: ShadowArgs) -> anyhow::Result<()> {
    if let Some(addr) = &args.listen {
        // The advisor answers calls with their own cluster snapshots and replays nothing.
        refuse_unused(
            &args,
            &["--out", "--cluster", "--incumbent-placer"],
            "do not apply with --listen (the advisor replays nothing)",
        )?;
        return live(&args, addr);
    }
    let started = std::time::Instant::now();
    if let Some(log) = &args.report_log {
        let Some(outcomes) = &args.outcomes else {
            refuse_unused(
                &args,
                &[
                    "--out",
                    "--cluster",
                    "--model",
                    "--fallback",
                    "--policy",
                    "--incumbent-placer",
                    "--cpu-nodes-first",
                ],
                "only apply with --outcomes (a shadow log alone is summarised, not replayed)",
            )?;
            let summary = shadow_log::summarise_log(log)?;
            return shadow_log::print_log_summary(&summary, args.format);
        };
        let Some(cluster) = &args.cluster else {
            bail!("--outcomes needs --cluster: a shadow log records no cluster");
        };
        let topo = load_topology(cluster)?;
        let (input, live) = shadow_log::join_outcomes(log, outcomes, topo)?;
        let mut shadow = simulate(&args, input)?;
        shadow.report.live = Some(live);
        return emit(&args, &shadow, started);
    }
    let Some(trace) = &args.trace else {
        bail!("give --trace (replay a recorded log), --listen (live advisor) or --report-log");
    };
    let input = recorded_trace(&args, trace)?;
    let shadow = simulate(&args, input)?;
    emit(&args, &shadow, started)
}

/// Refuses the `flags` among `candidates` that were given, with `why`: an option the mode
/// would ignore is a mistake to report, not a default to apply silently.
fn refuse_unused(args: &ShadowArgs, candidates: &[&str], why: &str) -> anyhow::Result<()> {
    let given = [
        ("--out", args.out.is_some()),
        ("--cluster", args.cluster.is_some()),
        ("--model", args.model.is_some()),
        ("--fallback", args.fallback.is_some()),
        ("--policy", args.policy.is_some()),
        ("--incumbent-placer", args.incumbent_placer.is_some()),
        ("--cpu-nodes-first", args.cpu_nodes_first),
    ];
    let unused: Vec<&str> = given
        .into_iter()
        .filter(|(flag, given)| *given && candidates.contains(flag))
        .map(|(flag, _)| flag)
        .collect();
    if !unused.is_empty() {
        bail!("{} {why}", unused.join(", "));
    }
    Ok(())
}

/// Writes the files, prints the report and how long the replays took.
fn emit(args: &ShadowArgs, shadow: &Shadow, started: std::time::Instant) -> anyhow::Result<()> {
    if let Some(dir) = &args.out {
        write_outputs(dir, shadow)?;
    }
    let mut out = std::io::stdout().lock();
    match args.format {
        Format::Json => writeln!(out, "{}", serde_json::to_string_pretty(&shadow.report)?)?,
        Format::Table => print_table(&shadow.report, &mut out)?,
    }
    eprintln!(
        "marshal shadow: {} jobs replayed twice in {:.1} s",
        shadow.report.replayed,
        started.elapsed().as_secs_f64()
    );
    Ok(())
}

fn load_topology(cluster: &str) -> anyhow::Result<Arc<Topology>> {
    let spec = marshal_datasets::load_cluster(cluster)
        .with_context(|| format!("loading cluster {cluster}"))?;
    Ok(Arc::new(
        Topology::build(&spec).with_context(|| format!("building cluster {cluster}"))?,
    ))
}

/// Prints a parser's skipped rows as `file:line:` warnings on stderr.
pub(crate) fn warn_skipped(report: &ParseReport) {
    for row in &report.skipped {
        eprintln!(
            "warning: {}:{}: skipped: field `{}`: {}",
            report.source, row.line, row.field, row.reason
        );
    }
    if report.skipped.len() < report.rows_skipped {
        eprintln!(
            "warning: {}: … and {} more rows skipped",
            report.source,
            report.rows_skipped - report.skipped.len()
        );
    }
}

fn recorded_trace(args: &ShadowArgs, trace: &str) -> anyhow::Result<ReplayInput> {
    let cluster = args
        .cluster
        .clone()
        .unwrap_or_else(|| default_cluster_for(trace).to_string());
    let topo = load_topology(&cluster)?;
    let (rows, report) = marshal_datasets::load_recorded_trace(trace, &topo.catalog)
        .with_context(|| format!("loading recorded log {trace}"))?;
    warn_skipped(&report);
    let (jobs, recorded) = rows
        .into_iter()
        .map(|(job, run)| {
            let rec = Recorded {
                scheduled: run.scheduled,
                ended: run.deleted,
                node: run.node,
            };
            (job, rec)
        })
        .unzip();
    Ok(ReplayInput {
        topo,
        jobs,
        recorded,
        trace: trace.to_string(),
    })
}

/// Both replays of `input`: the incumbent's recorded decisions and Marshal's policy.
fn simulate(args: &ShadowArgs, input: ReplayInput) -> anyhow::Result<Shadow> {
    let ReplayInput {
        topo,
        jobs,
        recorded,
        trace,
    } = input;
    let policy_name = args.policy.as_deref().unwrap_or(DEFAULT_POLICY);
    crate::cli::policy::check_name(policy_name)?;
    let learned = (policy_name == marshal_scheduler::policies::learned::LEARNED).then(|| {
        crate::cli::policy::load_setup(
            args.model.as_deref(),
            args.fallback.as_deref(),
            ModeArg::Replay,
        )
    });
    let (mut policy, gate) =
        crate::cli::policy::build_policy(policy_name, &jobs, learned.as_ref())?;
    if args.cpu_nodes_first {
        policy = policy.with_cpu_nodes_first();
    }
    let incumbent = args
        .incumbent_placer
        .as_deref()
        .unwrap_or(DEFAULT_INCUMBENT_PLACER);
    let placer =
        marshal_scheduler::policies::build(incumbent, &jobs).context("--incumbent-placer")?;
    Ok(shadow::run_shadow(
        topo,
        &jobs,
        &recorded,
        MarshalPolicy { policy, gate },
        placer,
        &trace,
        args.seed,
    )?)
}

fn write_outputs(dir: &Path, shadow: &Shadow) -> anyhow::Result<()> {
    std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
    let write = |name: &str, text: String| {
        let path = dir.join(name);
        crate::cli::output::write_whole(&path, text)
    };
    write(
        "report.json",
        serde_json::to_string_pretty(&shadow.report)? + "\n",
    )?;
    let mut records = String::new();
    for row in &shadow.rows {
        records.push_str(&serde_json::to_string(row)?);
        records.push('\n');
    }
    write("records.jsonl", records)?;
    let mut alloc = String::from("hour,incumbent_alloc_pct,marshal_alloc_pct\n");
    for (h, a, b) in &shadow.allocation {
        alloc.push_str(&format!("{h},{a:.3},{b:.3}\n"));
    }
    write("allocation.csv", alloc)
}

/// A table line: measure, incumbent, Marshal, effect.
type Line<'a> = (&'a str, Option<f64>, Option<f64>, Option<f64>);

fn print_table(r: &ShadowReport, out: &mut impl std::io::Write) -> std::io::Result<()> {
    writeln!(
        out,
        "trace {} on {} ({} GPUs), seed {}: {} jobs in the log, {} replayed, {} never \
         scheduled by the incumbent (not replayed)",
        r.trace, r.cluster, r.gpus, r.seed, r.jobs_in_log, r.replayed, r.not_replayed
    )?;
    writeln!(
        out,
        "incumbent: recorded starts, placed by {}; {} recorded starts delayed (no room \
         in this cluster model; mean {}, max {}), {} recorded nodes unknown",
        r.incumbent_placer,
        r.incumbent_recorded_start_delayed,
        opt(r.incumbent_delay_mean_s),
        opt(r.incumbent_delay_max_s),
        r.incumbent_recorded_node_unknown
    )?;
    let (i, m, e) = (&r.incumbent, &r.marshal, &r.effect);
    writeln!(
        out,
        "{:<22} {:>14} {:>14} {:>14}",
        "measure",
        "incumbent",
        r.policy.as_str(),
        "effect"
    )?;
    let rows: [Line; 13] = [
        (
            "queue_mean_s",
            i.queue_mean_s,
            m.queue_mean_s,
            e.queue_mean_s,
        ),
        ("queue_p50_s", i.queue_p50_s, m.queue_p50_s, e.queue_p50_s),
        ("queue_p95_s", i.queue_p95_s, m.queue_p95_s, e.queue_p95_s),
        ("queue_p99_s", i.queue_p99_s, m.queue_p99_s, e.queue_p99_s),
        ("jct_mean_s", i.jct_mean_s, m.jct_mean_s, e.jct_mean_s),
        ("jct_p50_s", i.jct_p50_s, m.jct_p50_s, e.jct_p50_s),
        ("jct_p95_s", i.jct_p95_s, m.jct_p95_s, e.jct_p95_s),
        ("jct_p99_s", i.jct_p99_s, m.jct_p99_s, e.jct_p99_s),
        (
            "gpu_alloc_pct",
            Some(i.gpu_alloc_pct),
            Some(m.gpu_alloc_pct),
            Some(m.gpu_alloc_pct - i.gpu_alloc_pct),
        ),
        (
            "gpu_hours_idle",
            Some(i.gpu_hours_idle),
            Some(m.gpu_hours_idle),
            Some(e.gpu_hours_idle),
        ),
        (
            "completed",
            Some(i.completed as f64),
            Some(m.completed as f64),
            Some(m.completed as f64 - i.completed as f64),
        ),
        (
            "rejected",
            Some(i.rejected as f64),
            Some(m.rejected as f64),
            Some(e.rejected as f64),
        ),
        (
            "preemptions",
            Some(i.preemptions as f64),
            Some(m.preemptions as f64),
            None,
        ),
    ];
    for (k, a, b, d) in rows {
        writeln!(out, "{k:<22} {:>14} {:>14} {:>14}", opt(a), opt(b), opt(d))?;
    }
    writeln!(
        out,
        "Marshal starts {} jobs sooner, {} later, {} at the same time",
        e.started_sooner, e.started_later, e.started_same
    )?;
    if let Some(f) = r.fallback_rate {
        writeln!(out, "learned policy fallback rate: {:.1} %", f * 100.0)?;
    }
    if let Some(l) = &r.live {
        print_live(l, out)?;
    }
    Ok(())
}

fn print_live(l: &LiveReport, out: &mut impl std::io::Write) -> std::io::Result<()> {
    writeln!(
        out,
        "live log: {} decisions on {} jobs; {} outcome rows ({} malformed, skipped); {} \
         joined, {} log jobs without an outcome, {} outcomes not in the log; {} started by \
         the incumbent before Marshal was first asked",
        l.log_decisions,
        l.log_jobs,
        l.outcome_rows,
        l.outcome_rows_skipped,
        l.joined,
        l.log_jobs_without_outcome,
        l.outcomes_not_in_log,
        l.started_before_first_advice
    )?;
    let c = &l.recommendation;
    writeln!(
        out,
        "Marshal's first PLACE vs the incumbent's start (from the log): {} sooner, {} later, \
         {} same, {} never recommended, {} recommended but never started by the incumbent; \
         mean lead {} s",
        c.sooner,
        c.later,
        c.same,
        c.never,
        c.incumbent_never,
        opt(c.lead_mean_s)
    )?;
    writeln!(
        out,
        "recommended node = recorded node: {} of {} ({} %)",
        c.node_agree,
        c.node_compared,
        opt(c.node_agree_share.map(|s| s * 100.0))
    )
}

fn opt(v: Option<f64>) -> String {
    v.map_or_else(|| "-".into(), |x| format!("{x:.1}"))
}

fn live(args: &ShadowArgs, addr: &str) -> anyhow::Result<()> {
    let mut config = match &args.config {
        Some(path) => ServiceConfig::from_file(path)?,
        None => ServiceConfig::default(),
    };
    config.listen = addr.to_string();
    // A flag not given leaves the configuration file's choice (`marshal serve`'s rule).
    if let Some(policy) = &args.policy {
        config.policy = policy.clone();
    }
    if let Some(dir) = &args.model {
        config.model = Some(dir.clone());
    }
    if let Some(f) = &args.fallback {
        config.fallback = Some(f.clone());
    }
    config.cpu_nodes_first |= args.cpu_nodes_first;
    crate::cli::policy::check_name(&config.policy)?;
    config.validate()?;
    // The same model slot as `marshal serve`: gate, fallback, hot reload.
    let model_dir = config
        .model
        .clone()
        .unwrap_or_else(crate::cli::policy::default_model_dir);
    let model = service::model_slot(&config, &model_dir);
    if config.policy == marshal_scheduler::policies::learned::LEARNED {
        let status = model.status(&config.policy);
        if !status.loaded {
            eprintln!("warning: {}", status.detail);
        }
    }
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .context("starting the async runtime")?;
    let log = service::shadow::ShadowLog {
        path: args.log.clone(),
        rotate_bytes: args.log_rotate_mib.map(|m| m.saturating_mul(1 << 20)),
        keep: args.log_keep as usize,
    };
    if log.rotate_bytes.is_none() {
        tracing::warn!(log = %log.path.display(), "the shadow log is never rotated and grows with every recommendation (--log-rotate-mib)");
    }
    runtime.block_on(async move {
        let handle = service::start_advisor(&config, &log, model).await?;
        // Tests and scripts read the bound address from this line.
        println!(
            "marshal shadow: advisor listening on {}, logging to {}",
            handle.addr,
            log.path.display()
        );
        let _ = std::io::stdout().flush();
        crate::cli::serve::shut_down_on_signal("marshal shadow", handle.shutdown()).await
    })
}
