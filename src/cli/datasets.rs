//! `marshal datasets`: what the traces hold, and samples of them.

use std::collections::BTreeMap;
use std::sync::Arc;

use anyhow::Context as _;
use clap::{Args, Subcommand};
use marshal_scheduler::domain::{Job, JobId, Topology};
use marshal_scheduler::sim::percentile;
use rand::SeedableRng;
use rand::seq::index::sample;
use serde::Serialize;

use crate::cli::output::Format;
use crate::cli::sim::default_cluster_for;

#[derive(Debug, Args)]
pub struct DatasetsArgs {
    #[command(subcommand)]
    command: DatasetsCommand,
}

#[derive(Debug, Subcommand)]
enum DatasetsCommand {
    /// Trace names: bundled, and read from the traces directory when present.
    List,
    /// Jobs, span, GPU-count and duration distributions, and load against a cluster.
    Describe(DescribeArgs),
    /// A seeded random sample of a trace's jobs, described and optionally written out.
    Sample(SampleArgs),
    /// A synthetic workload: a trace's job mix arriving at a target load on a cluster.
    Synth(SynthArgs),
    /// Fit the speed model's calibrated constants to the bundled profiles.
    Calibrate,
    /// The workload kinds jobs are enriched with, and the measurements behind them.
    Workloads {
        #[arg(long, value_enum, default_value_t = Format::Table)]
        format: Format,
    },
    /// The incumbent's outcomes CSV for `marshal shadow --outcomes`, from `sacct` or
    /// `kubectl get pods -o json`.
    Outcomes(crate::cli::outcomes_export::OutcomesArgs),
}

#[derive(Debug, Args)]
struct SynthArgs {
    /// Trace whose jobs (shape and duration) are drawn.
    #[arg(long)]
    like: String,
    #[arg(long, allow_negative_numbers = true)]
    jobs: usize,
    /// Offered load: GPU time asked for over the cluster's GPU time (e.g. 0.8).
    #[arg(long, allow_negative_numbers = true)]
    load: f64,
    /// Cluster the load is relative to (default: the trace's own).
    #[arg(long)]
    cluster: Option<String>,
    /// Bursty arrivals: rate multiplier during bursts (Poisson when absent).
    #[arg(long, allow_negative_numbers = true)]
    burst_factor: Option<f64>,
    /// Mean burst length, hours.
    #[arg(long, allow_negative_numbers = true, default_value_t = 1.0)]
    burst_hours: f64,
    /// Mean calm period between bursts, hours.
    #[arg(long, allow_negative_numbers = true, default_value_t = 4.0)]
    calm_hours: f64,
    #[arg(long, allow_negative_numbers = true, default_value_t = 42)]
    seed: u64,
    /// Write the workload as a trace file that `marshal sim --trace` reads.
    #[arg(long)]
    out: Option<std::path::PathBuf>,
    #[arg(long, value_enum, default_value_t = Format::Table)]
    format: Format,
}

#[derive(Debug, Args)]
struct DescribeArgs {
    /// A trace name (see `marshal datasets list`) or a path to a trace file.
    trace: String,
    /// Cluster to express the load against (default: the trace's own).
    #[arg(long)]
    cluster: Option<String>,
    #[arg(long, value_enum, default_value_t = Format::Table)]
    format: Format,
}

#[derive(Debug, Args)]
struct SampleArgs {
    trace: String,
    /// Number of jobs to draw (without replacement; submission order is kept).
    #[arg(long, allow_negative_numbers = true)]
    jobs: usize,
    #[arg(long, allow_negative_numbers = true, default_value_t = 42)]
    seed: u64,
    /// Write the sample as a trace file that `marshal sim --trace` reads.
    #[arg(long)]
    out: Option<std::path::PathBuf>,
    #[arg(long)]
    cluster: Option<String>,
    #[arg(long, value_enum, default_value_t = Format::Table)]
    format: Format,
}

pub fn run(args: DatasetsArgs) -> anyhow::Result<()> {
    match args.command {
        DatasetsCommand::List => {
            println!("bundled:   {}", marshal_datasets::TRACE_NAMES.join(", "));
            println!(
                "unbundled: {} (read from $MARSHAL_TRACES_DIR or ../shared/traces)",
                marshal_datasets::UNBUNDLED_TRACE_NAMES.join(", ")
            );
            Ok(())
        }
        DatasetsCommand::Describe(a) => {
            let (topo, jobs) = load(&a.trace, a.cluster.as_deref())?;
            print(&describe(&a.trace, &jobs, &topo), a.format)
        }
        DatasetsCommand::Sample(a) => {
            let (topo, jobs) = load(&a.trace, a.cluster.as_deref())?;
            let picked = sample_jobs(&jobs, a.jobs, a.seed)?;
            write_out(a.out.as_deref(), &picked, &topo)?;
            let name = format!("{} (sample of {}, seed {})", a.trace, picked.len(), a.seed);
            print(&describe(&name, &picked, &topo), a.format)
        }
        DatasetsCommand::Calibrate => calibrate(),
        DatasetsCommand::Workloads { format } => workloads(format),
        DatasetsCommand::Outcomes(a) => crate::cli::outcomes_export::run(a),
        DatasetsCommand::Synth(a) => {
            let (topo, template) = load(&a.like, a.cluster.as_deref())?;
            let arrivals = match a.burst_factor {
                None => marshal_datasets::Arrivals::Poisson,
                Some(factor) => marshal_datasets::Arrivals::Bursty {
                    factor,
                    mean_burst_s: a.burst_hours * 3600.0,
                    mean_calm_s: a.calm_hours * 3600.0,
                },
            };
            let spec = marshal_datasets::SyntheticSpec {
                jobs: a.jobs,
                load: a.load,
                cluster_capacity: reference_capacity(&topo),
                arrivals,
                seed: a.seed,
            };
            let jobs = marshal_datasets::synthesize(&template, &spec)?;
            write_out(a.out.as_deref(), &jobs, &topo)?;
            let name = format!(
                "synthetic like {} (load {}, seed {})",
                a.like, a.load, a.seed
            );
            print(&describe(&name, &jobs, &topo), a.format)
        }
    }
}

fn workloads(format: Format) -> anyhow::Result<()> {
    let speed = marshal_scheduler::sim::SpeedModel::default();
    let mut library = marshal_datasets::WorkloadLibrary::bundled(&speed)?;
    let memory = match marshal_datasets::load_lucid_profiles() {
        Ok((lucid, _)) => format!(
            "memory of {} kinds from Lucid's profiles",
            library.attach_lucid_memory(&lucid)
        ),
        Err(e) => format!("no memory measurements ({e})"),
    };
    let kinds: Vec<_> = library.catalog.iter().map(|(_, k)| k.clone()).collect();
    if format == Format::Json {
        println!("{}", serde_json::to_string_pretty(&kinds)?);
        return Ok(());
    }
    println!("{} workload kinds; {memory}", kinds.len());
    println!(
        "{:<36} {:<14} {:>6} {:>6} {:>11} {:>11} {:>7} {:>8}",
        "kind", "comm", "K80", "P100", "c (small)", "c (large)", "coloc", "mem GiB"
    );
    for k in &kinds {
        let ratio = |gpu: &str| {
            k.relative_throughput
                .get(gpu)
                .map_or("-".to_string(), |r| format!("{r:.2}"))
        };
        let curve = |end: Option<&(f64, f64)>| {
            end.map_or(format!("{:.2}", k.comm_share), |(b, c)| {
                format!("{c:.2}@{b}")
            })
        };
        println!(
            "{:<36} {:<14} {:>6} {:>6} {:>11} {:>11} {:>7.2} {:>8}",
            k.name,
            format!("{:?}", k.comm),
            ratio("K80"),
            ratio("P100"),
            curve(k.comm_share_by_local_batch.first()),
            curve(k.comm_share_by_local_batch.last()),
            k.colocation_speed,
            k.peak_memory_gib()
                .map_or("-".to_string(), |m| format!("{m:.1}"))
        );
    }
    Ok(())
}

fn calibrate() -> anyhow::Result<()> {
    let defaults = marshal_scheduler::sim::SpeedModel::default();
    let (profiles, _) = marshal_datasets::pollux_placement_profiles()?;
    let fit = marshal_datasets::fit_data_parallel_share(&profiles, defaults.reference_gbps)
        .context("the Pollux profiles hold no packed/spread pair")?;
    println!(
        "data-parallel communication share at {} GB/s: {:.4} (median of {} packed/spread \
         pairs of the Pollux profiles; median error of the ratio it predicts {:.0} %; default {})",
        fit.reference_gbps,
        fit.share,
        fit.points.len(),
        fit.median_ratio_error * 100.0,
        defaults.data_parallel_comm
    );
    let (gavel, _) = marshal_datasets::gavel_throughputs()?;
    let catalog = marshal_scheduler::domain::GpuCatalog::default();
    for (gpu, class, jobs) in marshal_datasets::gavel_gpu_classes(&gavel) {
        let ours = match gpu.as_str() {
            "k80" => "K80",
            "p100" => "P100",
            _ => "V100M16",
        };
        let default = catalog
            .id(ours)
            .map_or(f64::NAN, |id| catalog.get(id).throughput);
        println!(
            "GPU class {gpu}: {class:.3} of a V100 over {jobs} Gavel job types (catalog {ours}: {default})"
        );
    }
    Ok(())
}

fn write_out(path: Option<&std::path::Path>, jobs: &[Job], topo: &Topology) -> anyhow::Result<()> {
    if let Some(path) = path {
        let (format, text) = marshal_datasets::write_trace(jobs, &topo.catalog)?;
        crate::cli::output::write_whole(path, text)?;
        eprintln!(
            "wrote {} jobs to {} ({format:?} format)",
            jobs.len(),
            path.display()
        );
    }
    Ok(())
}

fn load(trace: &str, cluster: Option<&str>) -> anyhow::Result<(Arc<Topology>, Vec<Job>)> {
    let cluster = cluster.unwrap_or_else(|| default_cluster_for(trace));
    let spec = marshal_datasets::load_cluster(cluster)
        .with_context(|| format!("loading cluster {cluster}"))?;
    let topo = Arc::new(Topology::build(&spec)?);
    let (jobs, report) = marshal_datasets::load_trace(trace, &topo.catalog)
        .with_context(|| format!("loading trace {trace}"))?;
    if report.rows_skipped > 0 {
        eprintln!("{report}");
    }
    Ok((topo, jobs))
}

/// `count` jobs drawn without replacement, in submission order, rebased and renumbered.
pub fn sample_jobs(jobs: &[Job], count: usize, seed: u64) -> anyhow::Result<Vec<Job>> {
    anyhow::ensure!(count > 0, "--jobs 0: a sample needs at least one job");
    anyhow::ensure!(
        count <= jobs.len(),
        "--jobs {count}: more than the trace's {} jobs",
        jobs.len()
    );
    let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(seed);
    let mut picked: Vec<usize> = sample(&mut rng, jobs.len(), count).into_vec();
    picked.sort_unstable();
    let t0 = jobs[picked[0]].submit_time;
    Ok(picked
        .into_iter()
        .enumerate()
        .map(|(i, k)| Job {
            id: JobId(i as u32),
            submit_time: jobs[k].submit_time - t0,
            ..jobs[k].clone()
        })
        .collect())
}

#[derive(Debug, Serialize)]
pub struct Description {
    trace: String,
    jobs: usize,
    span_s: f64,
    /// Jobs by GPUs they ask for (a shared GPU counts as 1; CPU-only jobs as 0).
    gpus_per_job: BTreeMap<u32, usize>,
    shared_gpu_jobs: usize,
    cpu_only_jobs: usize,
    duration_mean_s: Option<f64>,
    duration_p50_s: Option<f64>,
    duration_p90_s: Option<f64>,
    duration_p99_s: Option<f64>,
    duration_max_s: Option<f64>,
    gpu_hours: f64,
    cluster: String,
    cluster_gpus: u32,
    /// The cluster's GPUs weighted by throughput class: what trace durations are
    /// measured against.
    cluster_reference_gpus: f64,
    /// GPU time the jobs ask for over the cluster's (reference) GPU time during the
    /// submission span.
    load_pct: Option<f64>,
    /// GPUs the jobs ask for at once, as a share of the cluster (the inflation view).
    requested_pct_of_capacity: f64,
}

/// GPUs weighted by their model's throughput class.
fn reference_capacity(topo: &Topology) -> f64 {
    topo.gpus()
        .iter()
        .map(|g| topo.catalog.get(g.model).throughput)
        .sum()
}

pub fn describe(trace: &str, jobs: &[Job], topo: &Topology) -> Description {
    let mut gpus_per_job = BTreeMap::new();
    for job in jobs {
        *gpus_per_job.entry(job.gpu_count()).or_default() += 1;
    }
    let first = jobs
        .iter()
        .map(|j| j.submit_time)
        .fold(f64::INFINITY, f64::min);
    let last = jobs
        .iter()
        .map(|j| j.submit_time)
        .fold(f64::NEG_INFINITY, f64::max);
    let span = if jobs.is_empty() { 0.0 } else { last - first };
    let mut durations: Vec<f64> = jobs
        .iter()
        .map(|j| j.total_work)
        .filter(|&d| d > 0.0)
        .collect();
    let gpu_seconds: f64 = jobs
        .iter()
        .map(|j| j.gpu_milli() as f64 / 1000.0 * j.total_work)
        .sum();
    let requested: f64 = jobs.iter().map(|j| j.gpu_milli() as f64).sum::<f64>() / 1000.0;
    let cluster_gpus = topo.gpu_count();
    let capacity = reference_capacity(topo);
    Description {
        trace: trace.to_string(),
        jobs: jobs.len(),
        span_s: span,
        gpus_per_job,
        shared_gpu_jobs: jobs.iter().filter(|j| j.gpu.is_shared()).count(),
        cpu_only_jobs: jobs.iter().filter(|j| j.gpu_count() == 0).count(),
        duration_mean_s: (!durations.is_empty())
            .then(|| durations.iter().sum::<f64>() / durations.len() as f64),
        duration_p50_s: percentile(&mut durations, 0.5),
        duration_p90_s: percentile(&mut durations, 0.9),
        duration_p99_s: percentile(&mut durations, 0.99),
        duration_max_s: durations.last().copied(),
        gpu_hours: gpu_seconds / 3600.0,
        cluster: topo.name.clone(),
        cluster_gpus,
        cluster_reference_gpus: capacity,
        load_pct: (span > 0.0 && gpu_seconds > 0.0 && capacity > 0.0)
            .then(|| gpu_seconds / (capacity * span) * 100.0),
        requested_pct_of_capacity: requested / cluster_gpus.max(1) as f64 * 100.0,
    }
}

fn print(d: &Description, format: Format) -> anyhow::Result<()> {
    if format == Format::Json {
        println!("{}", serde_json::to_string_pretty(d)?);
        return Ok(());
    }
    let hours = |s: Option<f64>| s.map_or("-".to_string(), |s| format!("{:.2}", s / 3600.0));
    println!(
        "{}: {} jobs over {:.1} days",
        d.trace,
        d.jobs,
        d.span_s / 86_400.0
    );
    let histogram: Vec<String> = d
        .gpus_per_job
        .iter()
        .map(|(g, n)| {
            format!(
                "{g}: {n} ({:.1} %)",
                *n as f64 / d.jobs.max(1) as f64 * 100.0
            )
        })
        .collect();
    println!("  GPUs per job   {}", histogram.join(", "));
    println!(
        "  shared-GPU jobs {}, CPU-only jobs {}",
        d.shared_gpu_jobs, d.cpu_only_jobs
    );
    println!(
        "  duration (h)   mean {}, p50 {}, p90 {}, p99 {}, max {}",
        hours(d.duration_mean_s),
        hours(d.duration_p50_s),
        hours(d.duration_p90_s),
        hours(d.duration_p99_s),
        hours(d.duration_max_s)
    );
    println!("  GPU-hours      {:.0}", d.gpu_hours);
    match d.load_pct {
        Some(load) => println!(
            "  load           {load:.1} % of {}'s {} GPUs ({:.0} reference GPUs) over the submission span",
            d.cluster, d.cluster_gpus, d.cluster_reference_gpus
        ),
        None => println!("  load           - (no durations, or all jobs arrive at once)"),
    }
    println!(
        "  requested      {:.1} % of {}'s GPUs if all were present at once",
        d.requested_pct_of_capacity, d.cluster
    );
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use marshal_scheduler::domain::ClusterSpec;

    fn topo() -> Topology {
        let spec = ClusterSpec::from_toml(
            "name='c'\n[[nodes]]\ncount=2\ngpu_model='T4'\ngpus=4\ncpu_milli=1\nmemory_mib=1\n",
        )
        .unwrap();
        Topology::build(&spec).unwrap()
    }

    fn jobs() -> Vec<Job> {
        (0..10)
            .map(|i| Job::whole_gpus(JobId(i), 1 + i % 2, i as f64 * 100.0, 3600.0))
            .collect()
    }

    #[test]
    fn describe_counts_shapes_and_computes_load() {
        let d = describe("t", &jobs(), &topo());
        assert_eq!(d.jobs, 10);
        assert_eq!(d.gpus_per_job, BTreeMap::from([(1, 5), (2, 5)]));
        assert_eq!(d.span_s, 900.0);
        assert_eq!(d.gpu_hours, 15.0);
        // 15 GPU-hours over 8 T4s (3.6 reference GPUs at class 0.45) × 900 s.
        assert!((d.cluster_reference_gpus - 3.6).abs() < 1e-9);
        assert!((d.load_pct.unwrap() - 15.0 * 3600.0 / (3.6 * 900.0) * 100.0).abs() < 1e-9);
    }

    #[test]
    fn samples_are_seeded_ordered_and_rebased() {
        let all = jobs();
        let a = sample_jobs(&all, 4, 7).unwrap();
        assert_eq!(a, sample_jobs(&all, 4, 7).unwrap());
        assert_eq!(a.len(), 4);
        assert_eq!(a[0].submit_time, 0.0);
        assert!(a.windows(2).all(|w| w[0].submit_time <= w[1].submit_time));
        assert!(sample_jobs(&all, 11, 7).is_err());
    }
}
