//! `marshal telemetry` and `marshal agent`: recording, inspecting and compacting
//! Parquet telemetry, from NVML or from a simulator replay.

use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use anyhow::{Context as _, bail};
use clap::{Args, Subcommand, ValueEnum};
use marshal_agent::{
    Clock, HostSampler, SimTelemetryOptions, SimulatedTelemetry, SystemClock, run_sampling_loop,
};
use marshal_scheduler::policies;
use marshal_scheduler::service::pem::{PemKind, check_pem};
use marshal_scheduler::service::secret::check_private;
use marshal_scheduler::sim::{self, SimConfig};
use marshal_telemetry::{
    CompactOptions, NvmlConfig, NvmlSource, SinkConfig, Source, TelemetrySink, WriteOptions,
    compact_all, first_day_kept, prune_before, summarize,
};

use crate::cli::output::Format;
use crate::cli::sim::{Experiment, SimArgs};

#[derive(Debug, Args)]
pub struct TelemetryArgs {
    #[command(subcommand)]
    command: TelemetryCommand,
}

#[derive(Debug, Subcommand)]
enum TelemetryCommand {
    /// Record telemetry into a Parquet directory: from NVML for a while, or a whole
    /// simulated replay at full speed.
    Record(RecordArgs),
    /// Schema, row counts, time span and per-GPU summaries of a telemetry directory.
    Inspect {
        dir: PathBuf,
        #[arg(long, value_enum, default_value_t = Format::Table)]
        format: Format,
    },
    /// Merge each partition's small files into one (atomically).
    Compact {
        dir: PathBuf,
        #[command(flatten)]
        parquet: ParquetArgs,
    },
    /// Delete the days of telemetry older than a horizon (whole `date=` partitions, by the
    /// rows' UTC day; files that are not telemetry are left and listed). Do not run it on
    /// a directory a sink without `--retention` is writing: it cannot tell which files
    /// are still open (`marshal agent --retention` sweeps its own directory safely).
    Prune {
        dir: PathBuf,
        /// Keep this much (`30d`, `720h`).
        #[arg(long, allow_hyphen_values = true, value_parser = parse_interval)]
        older_than: Duration,
    },
    /// The GPU topology NVML sees on this machine, as JSON.
    Topology {
        #[command(flatten)]
        nvml: NvmlArgs,
    },
}

/// Where NVML comes from.
#[derive(Debug, Args)]
struct NvmlArgs {
    /// Load NVML from this file instead of the system's `libnvidia-ml.so.1` (a driver
    /// outside the library path, e.g. mounted into a container).
    #[arg(long, value_name = "PATH")]
    nvml_lib: Option<PathBuf>,
}

impl NvmlArgs {
    fn config(&self) -> NvmlConfig {
        NvmlConfig {
            lib_path: self.nvml_lib.clone(),
            ..NvmlConfig::default()
        }
    }
}

#[derive(Copy, Clone, Debug, PartialEq, Eq, ValueEnum)]
pub enum SourceArg {
    Nvml,
    Sim,
}

/// A simulator replay that feeds the simulated source.
#[derive(Debug, Args)]
pub struct SimSourceArgs {
    /// Trace replayed (see `marshal list`).
    #[arg(long, default_value = "itp-195job")]
    trace: String,
    /// Cluster (default: the trace's own).
    #[arg(long)]
    cluster: Option<String>,
    /// Policy that places the jobs.
    #[arg(long, default_value = "topo-pack")]
    policy: String,
    #[arg(long, allow_negative_numbers = true, default_value_t = 42)]
    seed: u64,
    /// Share of multi-GPU runs with a straggling GPU.
    #[arg(long, allow_negative_numbers = true, default_value_t = 0.0)]
    stragglers: f64,
    /// Share of nodes whose links are degraded.
    #[arg(long, allow_negative_numbers = true, default_value_t = 0.0)]
    degraded_nodes: f64,
    /// Relative noise on utilisation and memory.
    #[arg(long, allow_negative_numbers = true, default_value_t = 0.03)]
    noise: f64,
}

#[derive(Debug, Args)]
struct RecordArgs {
    #[arg(long, value_enum)]
    source: SourceArg,
    /// Output directory (created).
    #[arg(long)]
    out: PathBuf,
    /// Add to a directory that already holds telemetry (another node's or another time's
    /// recording). Without it such a directory is refused: a second recording of the
    /// same run would sit beside the first and every reader would count its rows twice.
    #[arg(long)]
    append: bool,
    /// Sampling interval (`500ms`, `1s`, `10s`, `1m`).
    #[arg(long, allow_hyphen_values = true, default_value = "10s", value_parser = parse_interval)]
    interval: Duration,
    /// NVML: how long to record.
    #[arg(long, allow_hyphen_values = true, default_value = "60s", value_parser = parse_interval)]
    duration: Duration,
    /// Simulated: stop after this many simulated hours (default: when the last job ends).
    #[arg(long, allow_negative_numbers = true)]
    hours: Option<f64>,
    #[command(flatten)]
    sim: SimSourceArgs,
    #[command(flatten)]
    nvml: NvmlArgs,
    #[command(flatten)]
    parquet: ParquetArgs,
}

/// How the Parquet files are written.
#[derive(Debug, Args)]
struct ParquetArgs {
    /// ZSTD level: 1 (fast) … 22 (small), or one of ZSTD's fast levels (-1, -2, …: faster
    /// still, larger files).
    #[arg(long, default_value_t = 1, allow_negative_numbers = true)]
    zstd_level: i32,
}

impl ParquetArgs {
    fn write_options(&self) -> WriteOptions {
        WriteOptions {
            zstd_level: self.zstd_level,
            ..WriteOptions::default()
        }
    }

    fn sink_config(&self, out: &std::path::Path) -> SinkConfig {
        let mut config = SinkConfig::new(out);
        config.write = self.write_options();
        config
    }
}

#[derive(Debug, Args)]
pub struct AgentArgs {
    #[arg(long, value_enum)]
    source: SourceArg,
    /// Local Parquet directory.
    #[arg(long)]
    out: PathBuf,
    #[arg(long, allow_hyphen_values = true, default_value = "1s", value_parser = parse_interval)]
    interval: Duration,
    /// The node this agent stands for: with NVML the name it registers and writes its rows
    /// under (default: the host name, which in a container is often not the node's); with
    /// the simulated source the replay's node (default: the cluster's first).
    #[arg(long)]
    node: Option<String>,
    /// Simulated seconds per wall-clock second (simulated source).
    #[arg(long, allow_negative_numbers = true, default_value_t = 1.0)]
    speedup: f64,
    #[command(flatten)]
    sim: SimSourceArgs,
    #[command(flatten)]
    nvml: NvmlArgs,
    #[command(flatten)]
    connect: ConnectArgs,
    #[command(flatten)]
    parquet: ParquetArgs,
    /// Delete the days of telemetry in `--out` older than this (`30d`, `720h`): swept at
    /// start and hourly, by the rows' UTC day; and, with `--exec`, workers' logs last
    /// written longer ago (not those of workers still here). Default: keep everything.
    #[arg(long, allow_hyphen_values = true, value_parser = parse_interval)]
    retention: Option<Duration>,
}

/// Connected mode: register with a `marshal serve`, stream telemetry, run assignments.
#[derive(Debug, Args)]
pub struct ConnectArgs {
    /// The scheduler (`http://host:port`, or `https://…` with `--ca`). Without it the
    /// agent only samples into its Parquet directory.
    #[arg(long)]
    scheduler: Option<String>,
    /// File holding the agent's bearer token (one of the server's `agent_tokens`).
    #[arg(long, requires = "scheduler")]
    token_file: Option<PathBuf>,
    /// CA certificate (PEM) the scheduler's certificate must chain to: TLS.
    #[arg(long, requires = "scheduler")]
    ca: Option<PathBuf>,
    /// Client certificate (PEM) for mutual TLS (with `--key` and `--ca`).
    #[arg(long, requires_all = ["scheduler", "key", "ca"])]
    cert: Option<PathBuf>,
    /// Client key (PEM) for mutual TLS.
    #[arg(long, requires = "cert")]
    key: Option<PathBuf>,
    /// Name to check the scheduler's certificate against (default: the URL's host).
    #[arg(long, requires = "ca")]
    tls_domain: Option<String>,
    /// Runs each assigned worker as `sh -c CMD` in the job's environment, in a session
    /// of its own under a shell that records its exit status in `OUT/jobs/state/`, and
    /// reports that status. Without it the agent writes `OUT/assignments/<job>.<worker>.env`
    /// (and, with the simulated source, completes jobs after their expected run time).
    #[arg(long, requires = "scheduler")]
    exec: Option<String>,
    /// Kill the `--exec` workers when the agent stops (SIGINT/SIGTERM); the scheduler
    /// then requeues them. By default they keep running, and the next agent started
    /// on the same `--out` adopts them and reports how they end.
    #[arg(long, requires = "exec")]
    stop_workers_on_exit: bool,
    /// Stop this node's workers once the scheduler cannot have heard from the agent for
    /// its node timeout plus grace (it says them at registration): by then it has
    /// requeued their jobs, so none runs twice across a network partition. Off by
    /// default: a scheduler down that long (an upgrade) requeues nothing, and every
    /// agent would stop every job. A refused registration stops them regardless, when
    /// the scheduler requeues them.
    #[arg(long, requires = "scheduler")]
    fence_when_silent: bool,
    /// Serves the agent's counters at `http://ADDR/metrics` (Prometheus text):
    /// registrations, whether it is registered now, workers running, stopping and
    /// fenced, reports, telemetry rows by outcome.
    #[arg(long, requires = "scheduler")]
    metrics_listen: Option<std::net::SocketAddr>,
    /// A stopped `--exec` worker (STOP, preemption, cancel, fencing) gets SIGTERM, and
    /// SIGKILL this long after unless it has ended: time to write a checkpoint. Its GPUs
    /// stay its own until then. `0s`: SIGKILL at once.
    #[arg(long, requires = "exec", allow_hyphen_values = true, default_value = "30s", value_parser = parse_grace)]
    stop_grace: Duration,
    /// Telemetry rows held for the scheduler while it is unreachable (the most recent
    /// are kept; every row is in Parquet regardless).
    #[arg(long, allow_negative_numbers = true, default_value_t = marshal_agent::connected::DEFAULT_BACKLOG)]
    backlog: usize,
    /// Longest wait between reconnection attempts.
    #[arg(long, allow_hyphen_values = true, default_value = "10s", value_parser = parse_interval)]
    max_backoff: Duration,
}

impl ConnectArgs {
    fn client(
        &self,
        url: &str,
    ) -> anyhow::Result<marshal_scheduler::service::client::ClientConfig> {
        let read =
            |p: &PathBuf| std::fs::read(p).with_context(|| format!("reading {}", p.display()));
        let token = match &self.token_file {
            Some(p) => {
                check_private(p, "a bearer token").map_err(anyhow::Error::msg)?;
                let t = String::from_utf8(read(p)?).context("the token file is not UTF-8")?;
                let t = t.trim().to_string();
                if t.is_empty() {
                    bail!("{} is empty", p.display());
                }
                Some(t)
            }
            None => None,
        };
        let read_pem = |p: &PathBuf, kind: PemKind| {
            let pem = read(p)?;
            check_pem(&pem, kind).map_err(|e| anyhow::anyhow!("{} {e}", p.display()))?;
            anyhow::Ok(pem)
        };
        let identity = match (&self.cert, &self.key) {
            (Some(c), Some(k)) => Some((read_pem(c, PemKind::Certificate)?, {
                let key = read_pem(k, PemKind::PrivateKey)?;
                check_private(k, "a TLS private key").map_err(anyhow::Error::msg)?;
                key
            })),
            _ => None,
        };
        let config = marshal_scheduler::service::client::ClientConfig {
            url: url.to_string(),
            token,
            ca_pem: self
                .ca
                .as_ref()
                .map(|p| read_pem(p, PemKind::Certificate))
                .transpose()?,
            identity,
            domain: self.tls_domain.clone(),
            ..Default::default()
        };
        config.validate()?;
        Ok(config)
    }
}

/// Parses `250ms`, `1s`, `1.5s`, `2m`, `1h` (a bare number is seconds).
pub fn parse_interval(s: &str) -> Result<Duration, String> {
    let s = s.trim();
    let (number, unit) = match s.find(|c: char| c.is_ascii_alphabetic()) {
        Some(i) => s.split_at(i),
        None => (s, "s"),
    };
    let value: f64 = number
        .trim()
        .parse()
        .map_err(|_| format!("{s:?} is not a duration like 500ms, 1s or 2m"))?;
    let scale = match unit {
        "ms" => 1e-3,
        "s" => 1.0,
        "m" => 60.0,
        "h" => 3600.0,
        "d" => 86_400.0,
        _ => {
            return Err(format!(
                "unknown unit {unit:?} in {s:?}: use ms, s, m, h or d"
            ));
        }
    };
    let secs = value * scale;
    if !(secs.is_finite() && secs > 0.0 && secs < 1e9) {
        return Err(format!("{s:?} must be a positive duration"));
    }
    Ok(Duration::from_secs_f64(secs))
}

/// A stop grace: a duration up to an hour (a START for the worker's GPUs waits that
/// long), or zero.
fn parse_grace(s: &str) -> Result<Duration, String> {
    if s.trim().trim_end_matches(|c: char| c.is_ascii_alphabetic()) == "0" {
        return Ok(Duration::ZERO);
    }
    let grace = parse_interval(s)?;
    if grace > Duration::from_secs(3600) {
        return Err(format!(
            "{s:?} is longer than an hour: a START for the worker's GPUs waits this long"
        ));
    }
    Ok(grace)
}

pub fn run(args: TelemetryArgs) -> anyhow::Result<()> {
    match args.command {
        TelemetryCommand::Record(a) => record(a),
        TelemetryCommand::Inspect { dir, format } => inspect(&dir, format),
        TelemetryCommand::Compact { dir, parquet } => {
            let options = CompactOptions {
                write: parquet.write_options(),
                ..CompactOptions::default()
            };
            let reports = compact_all(&dir, &options)
                .with_context(|| format!("compacting {}", dir.display()))?;
            for r in &reports {
                match &r.output {
                    Some(out) => println!(
                        "{}: {} files → {} ({} rows)",
                        r.dir.display(),
                        r.inputs.len(),
                        out.display(),
                        r.rows
                    ),
                    None => println!("{}: nothing merged", r.dir.display()),
                }
                for e in &r.skipped {
                    eprintln!("warning: skipped {}: {}", e.path.display(), e.reason);
                }
            }
            println!(
                "{} partitions compacted",
                reports.iter().filter(|r| r.output.is_some()).count()
            );
            Ok(())
        }
        TelemetryCommand::Prune { dir, older_than } => prune(&dir, older_than),
        TelemetryCommand::Topology { nvml } => {
            let config = nvml.config();
            let node = config.node.clone();
            let nvml = NvmlSource::open_with(config)?;
            let discovered = nvml.discover_topology()?;
            let cpu_milli =
                std::thread::available_parallelism().map_or(0, |n| n.get() as u32 * 1000);
            let instances = nvml.mig_instances()?;
            let spec = marshal_agent::node_spec(
                &discovered,
                &node,
                cpu_milli,
                HostSampler::new("", &node)
                    .sample(0)
                    .host_mem_total_bytes
                    .map_or(0, |b| b >> 20),
                &marshal_scheduler::domain::GpuCatalog::default(),
            )
            .map(|mut spec| {
                let on = spec.mig_gpus.clone().unwrap_or_default();
                spec.mig_layout = marshal_agent::mig_layout_spec(&on, &instances);
                spec
            });
            let out = serde_json::json!({
                "discovered": discovered,
                "node_spec": spec.as_ref().ok(),
                "node_spec_error": spec.as_ref().err().map(ToString::to_string),
            });
            println!("{}", serde_json::to_string_pretty(&out)?);
            Ok(())
        }
    }
}

/// Replays the trace and wraps the log as a simulated source.
fn simulated(a: &SimSourceArgs, epoch_us: i64) -> anyhow::Result<SimulatedTelemetry> {
    let sim_args = SimArgs::replay(&a.trace, a.cluster.clone(), vec![a.policy.clone()], a.seed);
    let experiment = Experiment::load(&sim_args)?;
    let jobs = experiment.jobs_for(a.seed)?.into_owned();
    let policy = policies::build(&a.policy, &jobs)?;
    let config = SimConfig {
        seed: a.seed,
        ..experiment.config.clone()
    };
    let (_, log) = sim::run_replay(&policy, experiment.topo.clone(), &jobs, &a.trace, &config)?;
    let opts = SimTelemetryOptions {
        cluster: experiment.topo.name.clone(),
        epoch_us,
        seed: a.seed,
        noise: a.noise,
        straggler_fraction: a.stragglers,
        degraded_node_fraction: a.degraded_nodes,
        ..SimTelemetryOptions::default()
    };
    Ok(SimulatedTelemetry::new(
        experiment.topo.clone(),
        jobs,
        &log,
        config.speed,
        opts,
    )?)
}

/// The first `kind=…` entry of `dir`, if it holds telemetry.
fn existing_telemetry(dir: &std::path::Path) -> Option<PathBuf> {
    std::fs::read_dir(dir)
        .ok()?
        .filter_map(Result::ok)
        .map(|e| e.path())
        .filter(|p| {
            p.file_name()
                .and_then(|n| n.to_str())
                .is_some_and(|n| n.starts_with("kind="))
        })
        .min()
}

fn record(a: RecordArgs) -> anyhow::Result<()> {
    if !a.append
        && let Some(found) = existing_telemetry(&a.out)
    {
        bail!(
            "{} already holds telemetry ({}): a second recording would sit beside it and \
             readers would see both; choose an empty directory, or pass --append to add to it",
            a.out.display(),
            found.display()
        );
    }
    let _lock = lock_writer(&a.out)?;
    let sink = TelemetrySink::open(a.parquet.sink_config(&a.out))
        .with_context(|| format!("opening {}", a.out.display()))?;
    match a.source {
        SourceArg::Sim => {
            let epoch_us = SimTelemetryOptions::default().epoch_us;
            let mut sim = simulated(&a.sim, epoch_us)?;
            if let Some(h) = a.hours
                && !(h.is_finite() && h > 0.0)
            {
                bail!("--hours {h}: must be a positive number");
            }
            let end = a.hours.map_or(sim.horizon_s(), |h| h * 3600.0);
            let step = a.interval.as_secs_f64();
            check_recording_length(end, step)?;
            let (mut t, mut gpu_rows, mut step_rows) = (0.0, 0u64, 0u64);
            while t <= end {
                let rows = sim.sample_at(t);
                gpu_rows += rows.len() as u64;
                sink.send(rows)?;
                let profiles = sim.step_profiles_at(t);
                step_rows += profiles.len() as u64;
                sink.send(profiles)?;
                t += step;
            }
            let stats = sink.finish()?;
            warn_validation(&stats);
            println!(
                "recorded {gpu_rows} GPU samples and {step_rows} step profiles over {:.1} simulated hours \
                 ({} files) into {}",
                end / 3600.0,
                stats.files_committed,
                a.out.display()
            );
        }
        SourceArg::Nvml => {
            let config = a.nvml.config();
            let mut host = HostSampler::new(&config.cluster, &config.node);
            let mut source = NvmlSource::open_with(config)?;
            let stop = stop_on_signal()?;
            let ticks = (a.duration.as_secs_f64() / a.interval.as_secs_f64()).ceil() as u64;
            let stats = run_sampling_loop(
                &mut source,
                Some(&mut host),
                &sink,
                a.interval,
                &stop,
                &mut SystemClock::new(),
                Some(ticks),
            )?;
            let sink_stats = sink.finish()?;
            warn_validation(&sink_stats);
            warn_refused(&stats);
            println!(
                "recorded {} GPU samples in {} ticks ({} failed) into {} ({} files)",
                stats.rows,
                stats.ticks,
                stats.source_errors,
                a.out.display(),
                sink_stats.files_committed
            );
        }
    }
    Ok(())
}

/// Holds `dir` for this process: an agent or recording writes its node's partitions and
/// (connected) adopts the workers its directory records, so a second one on the same
/// directory would race it for file names and workers. The lock (`flock`) goes with the
/// process, a crash included.
fn lock_writer(dir: &std::path::Path) -> anyhow::Result<std::fs::File> {
    std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
    let path = dir.join(".marshal-writer.lock");
    let file = std::fs::OpenOptions::new()
        .create(true)
        .truncate(false)
        .write(true)
        .open(&path)
        .with_context(|| format!("opening {}", path.display()))?;
    match file.try_lock() {
        Ok(()) => Ok(file),
        Err(std::fs::TryLockError::WouldBlock) => bail!(
            "{} is in use by another marshal agent or recording (it holds {}); give each \
             its own directory",
            dir.display(),
            path.display()
        ),
        Err(std::fs::TryLockError::Error(e)) => {
            Err(e).with_context(|| format!("locking {}", path.display()))
        }
    }
}

/// Sets the flag when dropped, panics included.
struct StopOnDrop(Arc<AtomicBool>);

impl Drop for StopOnDrop {
    fn drop(&mut self) {
        self.0.store(true, Ordering::Relaxed);
    }
}

/// A flag set by SIGINT or SIGTERM. A second signal exits at once (status 130): a
/// shutdown stuck on a hung NVML call (a GPU off the bus) or a dead disk would otherwise
/// end only with SIGKILL, which loses the files being finished.
fn stop_on_signal() -> anyhow::Result<Arc<AtomicBool>> {
    let stop = Arc::new(AtomicBool::new(false));
    let flag = stop.clone();
    ctrlc::set_handler(move || {
        if second_signal(&flag) {
            eprintln!("marshal: second signal: exiting before the shutdown finished");
            std::process::exit(130);
        }
    })
    .context("installing the SIGINT/SIGTERM handler")?;
    Ok(stop)
}

/// Sets `flag`; `true` if it was set already (this is the second signal).
fn second_signal(flag: &AtomicBool) -> bool {
    flag.swap(true, Ordering::Relaxed)
}

/// The fastest simulated clock: a simulated year in about half a wall-clock minute.
const MAX_SPEEDUP: f64 = 1e6;

/// The most samples one `telemetry record` takes (per GPU): ten million, e.g. 115 days
/// at 1 s or 19 years at 1 min.
const MAX_RECORDED_TICKS: f64 = 1e7;

/// An error unless recording `end_s` simulated seconds every `step_s` takes at most
/// [`MAX_RECORDED_TICKS`] samples.
fn check_recording_length(end_s: f64, step_s: f64) -> anyhow::Result<()> {
    let ticks = end_s / step_s;
    if !ticks.is_finite() || ticks > MAX_RECORDED_TICKS {
        bail!(
            "{:.0} samples per GPU ({} h every {step_s} s): at most {MAX_RECORDED_TICKS:.0}; \
             choose fewer --hours or a longer --interval",
            ticks.ceil(),
            end_s / 3600.0
        );
    }
    Ok(())
}

/// Maps wall time onto simulated time `speedup` times faster, from the agent's start.
struct Accelerated {
    inner: SimulatedTelemetry,
    start_us: i64,
    speedup: f64,
}

impl Source for Accelerated {
    fn sample(
        &mut self,
        now_us: i64,
    ) -> marshal_telemetry::Result<Vec<marshal_telemetry::GpuSample>> {
        let elapsed = now_us.saturating_sub(self.start_us) as f64 * self.speedup;
        self.inner
            .sample(self.start_us.saturating_add(elapsed as i64))
    }
}

/// Says on stderr what the sink's validation rejected or nulled, and what its file
/// system refused, if anything (the rules are the README's "Bad input"): a GPU
/// reporting nonsense or a full disk must not pass unnoticed.
fn warn_validation(stats: &marshal_telemetry::SinkStats) {
    if !stats.validation.is_clean() {
        eprintln!("warning: telemetry validation: {}", stats.validation);
    }
    if stats.error_count > 0 {
        eprintln!(
            "warning: telemetry sink: {} write errors ({} episodes of refused writes), {} rows lost",
            stats.error_count, stats.stalls, stats.rows_dropped
        );
        for e in &stats.errors {
            eprintln!("  {e}");
        }
    }
}

fn prune(dir: &std::path::Path, older_than: Duration) -> anyhow::Result<()> {
    if !dir.is_dir() {
        bail!("{} is not a directory", dir.display());
    }
    let Some(keep_from) = first_day_kept(std::time::SystemTime::now(), older_than) else {
        println!("nothing is older than {older_than:?}");
        return Ok(());
    };
    let report = prune_before(dir, keep_from, &Default::default());
    for p in &report.partitions {
        println!("deleted {}", p.display());
    }
    for f in &report.foreign {
        eprintln!("warning: left {} (not a telemetry file)", f.display());
    }
    println!(
        "{} files ({} bytes) dated before {keep_from} deleted",
        report.files, report.bytes
    );
    if !report.errors.is_empty() {
        for e in &report.errors {
            eprintln!("error: {e}");
        }
        bail!(
            "{} files or directories could not be deleted",
            report.errors.len()
        );
    }
    Ok(())
}

/// Says on stderr how many sampled rows the sink could not take in time.
fn warn_refused(stats: &marshal_agent::LoopStats) {
    if stats.rows_refused > 0 {
        eprintln!(
            "warning: {} sampled rows were dropped: the telemetry sink took none while its \
             file system refused writes and its memory bound was reached",
            stats.rows_refused
        );
    }
}

pub fn agent(a: AgentArgs) -> anyhow::Result<()> {
    let stop = stop_on_signal()?;
    let _lock = lock_writer(&a.out)?;
    let mut sink_config = a.parquet.sink_config(&a.out);
    sink_config.retention = a.retention;
    if a.retention.is_none() {
        eprintln!(
            "agent: no --retention: telemetry in {} is kept for ever (about 15 MB a day for \
             an 8-GPU node)",
            a.out.display()
        );
    }
    let sink =
        TelemetrySink::open(sink_config).with_context(|| format!("opening {}", a.out.display()))?;
    let mut clock = SystemClock::new();
    let mut host = None;
    let connected = a.connect.scheduler.is_some();
    // The node as it registers (connected mode only).
    let mut info = None;
    let mut mig = Vec::new();
    let mut source: Box<dyn Source> = match a.source {
        SourceArg::Nvml => {
            let mut config = a.nvml.config();
            if let Some(node) = &a.node {
                config.node = node.clone();
            }
            host = Some(HostSampler::new(&config.cluster, &config.node));
            let node = config.node.clone();
            let nvml = NvmlSource::open_with(config)?;
            if connected {
                let discovered = nvml.discover_topology()?;
                let cpu_milli =
                    std::thread::available_parallelism().map_or(0, |n| n.get() as u32 * 1000);
                let memory_mib = HostSampler::new("", &node)
                    .sample(0)
                    .host_mem_total_bytes
                    .map_or(0, |b| b >> 20);
                let spec = marshal_agent::node_spec(
                    &discovered,
                    &node,
                    cpu_milli,
                    memory_mib,
                    &marshal_scheduler::domain::GpuCatalog::default(),
                )?;
                mig = nvml.mig_instances()?;
                let mut node_info = marshal_agent::node_info(&spec)?;
                node_info.mig_layout = Some(marshal_agent::mig_layout(&mig));
                info = Some(node_info);
                if !mig.is_empty() {
                    eprintln!("agent: {} MIG instances to hand out", mig.len());
                }
            }
            Box::new(nvml)
        }
        SourceArg::Sim => {
            if !(a.speedup.is_finite() && a.speedup > 0.0 && a.speedup <= MAX_SPEEDUP) {
                bail!(
                    "--speedup {}: must be above 0 and at most {MAX_SPEEDUP}",
                    a.speedup
                );
            }
            let start_us = clock.now_us();
            let mut sim = simulated(&a.sim, start_us)?;
            let node = match &a.node {
                Some(node) => node.clone(),
                None => first_node(&a.sim)?,
            };
            sim.only_node(&node)?;
            if connected {
                info = Some(marshal_agent::inventory_node(
                    &sim_topology(&a.sim)?,
                    &node,
                )?);
            }
            Box::new(Accelerated {
                inner: sim,
                start_us,
                speedup: a.speedup,
            })
        }
    };
    let (Some(url), Some(info)) = (a.connect.scheduler.clone(), info) else {
        eprintln!(
            "agent: sampling every {:?} into {} (Ctrl-C or SIGTERM stops)",
            a.interval,
            a.out.display()
        );
        let stats = run_sampling_loop(
            source.as_mut(),
            host.as_mut(),
            &sink,
            a.interval,
            &stop,
            &mut clock,
            None,
        )?;
        let sink_stats = sink.finish()?;
        warn_validation(&sink_stats);
        warn_refused(&stats);
        eprintln!(
            "agent: stopped after {} ticks, {} rows, {} files",
            stats.ticks, stats.rows, sink_stats.files_committed
        );
        return Ok(());
    };

    use marshal_agent::connected::{
        Backlog, ConnectedConfig, Counters, Mode, TelemetryTap, run_connected,
    };
    use marshal_scheduler::service::tokio;
    let mode = match (&a.connect.exec, a.source) {
        (Some(cmd), _) => Mode::Exec(cmd.clone()),
        (None, SourceArg::Sim) => Mode::Simulated { speedup: a.speedup },
        (None, SourceArg::Nvml) => Mode::EnvOnly,
    };
    let config = ConnectedConfig {
        client: a.connect.client(&url)?,
        node: info.clone(),
        mode,
        out: a.out.clone(),
        flush_interval: a.interval,
        backoff_max: a.connect.max_backoff,
        journal: None,
        mig,
        stop_workers_on_exit: a.connect.stop_workers_on_exit,
        log_retention: a.retention,
        fence_when_silent: a.connect.fence_when_silent,
        stop_grace: a.connect.stop_grace,
    };
    let backlog = Backlog::new(&info.name, a.connect.backlog);
    let counters = Arc::new(Counters::default());
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .context("starting the async runtime")?;
    if let Some(addr) = a.connect.metrics_listen {
        let listener = runtime
            .block_on(tokio::net::TcpListener::bind(addr))
            .with_context(|| format!("cannot listen on --metrics-listen {addr}"))?;
        let bound = listener.local_addr()?;
        let metrics = marshal_agent::connected::AgentMetrics::new(
            &info.name,
            counters.clone(),
            backlog.clone(),
        );
        runtime.spawn(marshal_scheduler::service::metrics::serve_metrics(
            listener,
            Arc::new(metrics),
        ));
        eprintln!("agent: metrics at http://{bound}/metrics");
    }
    let (stop_tx, mut stop_rx) = tokio::sync::watch::channel(false);
    let backlog_for_session = backlog.clone();
    // The connected side returns early only on an error no retry fixes (its directory
    // cannot be written, no boot id for `--exec`) or a panic: the agent then stops
    // sampling and exits with the reason, rather than sample on for ever unregistered
    // while the scheduler requeues this node's jobs.
    let stop_sampling = StopOnDrop(stop.clone());
    let connected = runtime.spawn(async move {
        let _stop_sampling = stop_sampling;
        run_connected(config, backlog_for_session, counters, async move {
            let _ = stop_rx.wait_for(|s| *s).await;
        })
        .await
    });
    let mig = match &info.mig {
        Some(m) if !m.gpus.is_empty() => format!(", MIG mode on GPUs {:?}", m.gpus),
        _ => String::new(),
    };
    eprintln!(
        "agent: node {} ({} × {}{mig}) connected to {url}; sampling every {:?} into {} (Ctrl-C or SIGTERM stops)",
        info.name,
        info.gpus,
        if info.gpu_model.is_empty() {
            "no GPU"
        } else {
            &info.gpu_model
        },
        a.interval,
        a.out.display()
    );
    let mut tap = TelemetryTap(backlog);
    let sampled = marshal_agent::run_sampling_loop_with(
        source.as_mut(),
        host.as_mut(),
        &sink,
        Some(&mut tap),
        a.interval,
        &stop,
        &mut clock,
        None,
    );
    let _ = stop_tx.send(true);
    let stats = runtime
        .block_on(connected)
        .context("the connected agent task")?
        .context("the connected agent (registration, assignments, reports)")?;
    let sampled = sampled?;
    let sink_stats = sink.finish()?;
    warn_validation(&sink_stats);
    warn_refused(&sampled);
    let t = stats.telemetry;
    eprintln!(
        "agent: stopped after {} ticks, {} rows, {} files; {} sessions, {} workers started, \
         {} reports; telemetry: {} streamed, {} refused, {} not streamed (backlog full), {} held at exit",
        sampled.ticks,
        sampled.rows,
        sink_stats.files_committed,
        stats.sessions,
        stats.starts,
        stats.reports,
        t.streamed,
        t.rejected,
        t.dropped,
        t.held
    );
    Ok(())
}

fn sim_topology(a: &SimSourceArgs) -> anyhow::Result<marshal_scheduler::domain::Topology> {
    let cluster = a
        .cluster
        .clone()
        .unwrap_or_else(|| crate::cli::sim::default_cluster_for(&a.trace).to_string());
    let spec = marshal_datasets::load_cluster(&cluster)?;
    Ok(marshal_scheduler::domain::Topology::build(&spec)?)
}

fn first_node(a: &SimSourceArgs) -> anyhow::Result<String> {
    let topo = sim_topology(a)?;
    topo.nodes()
        .first()
        .map(|n| n.name.clone())
        .context("the cluster has no nodes")
}

/// Writes `text` to stdout; a closed pipe (`| head`) is not an error.
fn write_stdout(text: &str) -> anyhow::Result<()> {
    use std::io::Write as _;
    match std::io::stdout().lock().write_all(text.as_bytes()) {
        Err(e) if e.kind() == std::io::ErrorKind::BrokenPipe => Ok(()),
        other => Ok(other?),
    }
}

fn inspect(dir: &std::path::Path, format: Format) -> anyhow::Result<()> {
    use std::fmt::Write as _;
    let summary = summarize(dir).with_context(|| format!("inspecting {}", dir.display()))?;
    if format == Format::Json {
        let kinds: Vec<_> = summary
            .kinds
            .iter()
            .map(|k| {
                serde_json::json!({
                    "kind": k.kind.as_str(),
                    "files": k.files,
                    "row_groups": k.row_groups,
                    "rows": k.rows,
                    "bytes": k.bytes,
                    "bytes_per_row": k.bytes_per_row(),
                    "first_us": k.first_us,
                    "last_us": k.last_us,
                    "schema_versions": k.schema_versions,
                    "columns": k.schema.as_ref().map(|s| s.fields().iter().map(|f| f.name().clone()).collect::<Vec<_>>()),
                })
            })
            .collect();
        let gpus: Vec<_> = summary
            .gpus
            .iter()
            .map(|g| {
                serde_json::json!({
                    "node": g.node, "gpu_index": g.gpu_index, "gpu_uuid": g.gpu_uuid,
                    "gpu_type": g.gpu_type, "rows": g.rows, "first_us": g.first_us,
                    "last_us": g.last_us, "mean_sm_util_pct": g.mean_sm_util_pct,
                    "max_sm_util_pct": g.max_sm_util_pct,
                    "peak_mem_used_bytes": g.peak_mem_used_bytes,
                    "mem_total_bytes": g.mem_total_bytes,
                    "invalid_values": g.invalid_values,
                })
            })
            .collect();
        let errors: Vec<String> = summary
            .errors
            .iter()
            .map(|e| format!("{}: {}", e.path.display(), e.reason))
            .collect();
        println!(
            "{}",
            serde_json::to_string_pretty(&serde_json::json!({
                "root": summary.root, "kinds": kinds, "gpus": gpus, "errors": errors,
                "ignored_files": summary.ignored_files,
            }))?
        );
        return Ok(());
    }
    let mut out = String::new();
    writeln!(out, "{}", dir.display())?;
    for k in &summary.kinds {
        let span = match (k.first_us, k.last_us) {
            (Some(a), Some(b)) => format!("{:.1} h", (b - a) as f64 / 3.6e9),
            _ => "-".into(),
        };
        writeln!(
            out,
            "  {:<5} {:>4} files {:>6} row groups {:>12} rows {:>12} bytes ({}/row), span {span}, schema v{:?}",
            k.kind.as_str(),
            k.files,
            k.row_groups,
            k.rows,
            k.bytes,
            k.bytes_per_row()
                .map_or("-".into(), |b| format!("{b:.2} B")),
            k.schema_versions
        )?;
        if let Some(schema) = &k.schema {
            let cols: Vec<String> = schema
                .fields()
                .iter()
                .map(|f| format!("{}: {}", f.name(), f.data_type()))
                .collect();
            writeln!(out, "        columns: {}", cols.join(", "))?;
        }
    }
    if !summary.gpus.is_empty() {
        writeln!(
            out,
            "  {:<16} {:>3} {:<10} {:>8} {:>9} {:>8} {:>11}",
            "node", "gpu", "type", "rows", "mean SM%", "max SM%", "peak mem GiB"
        )?;
        for g in summary.gpus.iter().take(64) {
            writeln!(
                out,
                "  {:<16} {:>3} {:<10} {:>8} {:>9} {:>8} {:>11}",
                g.node,
                g.gpu_index,
                g.gpu_type,
                g.rows,
                g.mean_sm_util_pct.map_or("-".into(), |v| format!("{v:.1}")),
                g.max_sm_util_pct.map_or("-".into(), |v| format!("{v:.1}")),
                g.peak_mem_used_bytes.map_or("-".into(), |b| format!(
                    "{:.1}",
                    b as f64 / (1u64 << 30) as f64
                ))
            )?;
        }
        if summary.gpus.len() > 64 {
            writeln!(
                out,
                "  … and {} more GPUs (--format json lists all)",
                summary.gpus.len() - 64
            )?;
        }
        let invalid: u64 = summary.gpus.iter().map(|g| g.invalid_values).sum();
        if invalid > 0 {
            writeln!(
                out,
                "  {invalid} values left out of these figures: NaN, negative, utilisation \
                 above 100 % or memory used above installed (files another tool wrote; \
                 --format json counts them per GPU)"
            )?;
        }
    }
    write_stdout(&out)?;
    for e in &summary.errors {
        eprintln!("warning: skipped {}: {}", e.path.display(), e.reason);
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_first_signal_asks_for_a_shutdown_and_the_second_exits() {
        let flag = AtomicBool::new(false);
        assert!(!second_signal(&flag), "the first signal exited at once");
        assert!(flag.load(Ordering::Relaxed));
        assert!(second_signal(&flag));
    }

    #[cfg(unix)]
    #[test]
    fn a_token_file_other_users_can_read_is_refused() {
        use std::os::unix::fs::PermissionsExt as _;
        let tmp = tempfile::tempdir().unwrap();
        let token = tmp.path().join("agent.token");
        std::fs::write(&token, "0123456789abcdef0123456789abcdef\n").unwrap();
        let args = ConnectArgs {
            scheduler: Some("http://127.0.0.1:1".into()),
            token_file: Some(token.clone()),
            ca: None,
            cert: None,
            key: None,
            tls_domain: None,
            exec: None,
            stop_workers_on_exit: false,
            fence_when_silent: false,
            stop_grace: Duration::ZERO,
            metrics_listen: None,
            backlog: 1,
            max_backoff: Duration::from_secs(1),
        };
        let chmod = |m| std::fs::set_permissions(&token, std::fs::Permissions::from_mode(m));
        chmod(0o644).unwrap();
        let e = args.client("http://127.0.0.1:1").unwrap_err().to_string();
        assert!(e.contains("mode 0644") && e.contains("agent.token"), "{e}");
        chmod(0o600).unwrap();
        let config = args.client("http://127.0.0.1:1").unwrap();
        assert_eq!(
            config.token.as_deref(),
            Some("0123456789abcdef0123456789abcdef")
        );
    }

    #[test]
    fn intervals_parse_with_units() {
        assert_eq!(parse_interval("1s"), Ok(Duration::from_secs(1)));
        assert_eq!(parse_interval("250ms"), Ok(Duration::from_millis(250)));
        assert_eq!(parse_interval("2m"), Ok(Duration::from_secs(120)));
        assert_eq!(parse_interval("5"), Ok(Duration::from_secs(5)));
        assert_eq!(parse_interval("30d"), Ok(Duration::from_secs(30 * 86_400)));
        assert!(parse_interval("0s").is_err());
        assert!(parse_interval("1y").is_err());
        assert!(parse_interval("fast").is_err());
        assert!(parse_interval("NaNs").is_err());
    }

    #[test]
    fn a_stop_grace_may_be_zero_and_at_most_an_hour() {
        assert_eq!(parse_grace("0"), Ok(Duration::ZERO));
        assert_eq!(parse_grace("0s"), Ok(Duration::ZERO));
        assert_eq!(parse_grace("30s"), Ok(Duration::from_secs(30)));
        assert_eq!(parse_grace("1h"), Ok(Duration::from_secs(3600)));
        assert!(
            parse_grace("2h")
                .unwrap_err()
                .contains("longer than an hour")
        );
        assert!(parse_grace("-1s").is_err());
        assert!(parse_grace("soon").is_err());
    }

    #[test]
    fn recordings_longer_than_ten_million_samples_are_refused() {
        check_recording_length(115.0 * 86_400.0, 1.0).unwrap();
        check_recording_length(0.0, 1.0).unwrap();
        for (end, step) in [
            (116.0 * 86_400.0, 1.0),
            (f64::INFINITY, 60.0),
            (1e300, 3600.0),
        ] {
            let e = check_recording_length(end, step).unwrap_err().to_string();
            assert!(e.contains("at most 10000000"), "{end} {step}: {e}");
        }
    }
}
