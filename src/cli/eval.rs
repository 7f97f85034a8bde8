//! `marshal eval`: policies side by side on the same workloads and seeds, with 95 %
//! confidence intervals, paired differences against the first policy, and plots.
//!
//! Every policy runs on every seed; a seed fixes the workload draw (enrichment), the
//! failures and the node order, so the runs of two policies on one seed are a matched
//! pair and differences are computed per seed before averaging (a paired comparison has
//! far less noise than comparing two means).

use std::path::PathBuf;

use anyhow::Context as _;
use clap::Args;
use marshal_scheduler::sim::SimResult;
use serde_json::{Value, json};

use crate::cli::output::{Format, mean_over_seeds};
use crate::cli::sim::{Experiment, MAX_SEEDS, ModeArg, Run, SimArgs, WorkloadsArg};
use crate::cli::svg::{Chart, Series};

#[derive(Debug, Args)]
#[command(args_conflicts_with_subcommands = true)]
pub struct EvalArgs {
    #[command(subcommand)]
    what: Option<EvalWhat>,
    /// Policies, comma-separated; differences are against the first.
    #[arg(long, value_delimiter = ',')]
    policies: Vec<String>,
    #[arg(long, default_value = "")]
    trace: String,
    #[arg(long)]
    cluster: Option<String>,
    #[arg(long, value_enum, default_value_t = ModeArg::Replay)]
    mode: ModeArg,
    #[arg(long, allow_negative_numbers = true, default_value_t = 42)]
    seed: u64,
    /// Seeds (at least 2 for confidence intervals).
    #[arg(long, allow_negative_numbers = true, default_value_t = 5)]
    seeds: u64,
    #[arg(long, value_enum, default_value_t = Format::Table)]
    format: Format,
    /// Directory for the plots (SVG): JCT CDF in replay mode, allocation against
    /// arrived load in inflation mode.
    #[arg(long)]
    plots: Option<PathBuf>,
    #[arg(long, allow_negative_numbers = true, default_value_t = 130.0)]
    max_arrived_pct: f64,
    #[arg(long, value_enum, default_value_t = WorkloadsArg::Measured)]
    workloads: WorkloadsArg,
    /// The `learned` policy's artifact directory (default: `models/policy-default`).
    #[arg(long)]
    model: Option<PathBuf>,
    /// The `learned` policy's fallback heuristic (default: the artifact's for the mode).
    #[arg(long)]
    fallback: Option<String>,
    /// Every policy keeps CPU-only jobs off GPU nodes while a CPU-only node can take
    /// them (see `marshal sim --cpu-nodes-first`).
    #[arg(long)]
    cpu_nodes_first: bool,
    /// Per-tenant limits for every policy (see `marshal sim --quota`).
    #[arg(long, value_name = "FILE")]
    quota: Option<PathBuf>,
}

/// Two-sided 97.5 % quantile of Student's t with `df` degrees of freedom.
fn t_quantile(df: usize) -> f64 {
    const TABLE: [f64; 30] = [
        12.706, 4.303, 3.182, 2.776, 2.571, 2.447, 2.365, 2.306, 2.262, 2.228, 2.201, 2.179, 2.160,
        2.145, 2.131, 2.120, 2.110, 2.101, 2.093, 2.086, 2.080, 2.074, 2.069, 2.064, 2.060, 2.056,
        2.052, 2.048, 2.045, 2.042,
    ];
    match df {
        0 => f64::NAN,
        1..=30 => TABLE[df - 1],
        _ => 1.96,
    }
}

/// Mean and 95 % confidence half-width (NaN with fewer than two values).
pub fn mean_ci(values: &[f64]) -> (f64, f64) {
    let n = values.len();
    if n == 0 {
        return (f64::NAN, f64::NAN);
    }
    let mean = values.iter().sum::<f64>() / n as f64;
    if n < 2 {
        return (mean, f64::NAN);
    }
    let var = values.iter().map(|v| (v - mean).powi(2)).sum::<f64>() / (n - 1) as f64;
    (mean, t_quantile(n - 1) * (var / n as f64).sqrt())
}

/// The measures compared, by mode: (JSON key, label, scale to display units).
fn measures(mode: ModeArg) -> &'static [(&'static str, &'static str, f64)] {
    match mode {
        ModeArg::Replay => &[
            ("jct_mean_s", "JCT mean (h)", 3600.0),
            ("jct_p99_s", "JCT p99 (h)", 3600.0),
            ("queue_mean_s", "queue (h)", 3600.0),
            ("gpu_alloc_pct", "GPU alloc %", 1.0),
        ],
        ModeArg::Inflation => &[
            ("unallocated_gpus_at_100", "unalloc GPUs @100%", 1.0),
            ("gpu_alloc_pct", "GPU alloc %", 1.0),
        ],
    }
}

fn value(r: &SimResult, key: &str) -> Option<f64> {
    serde_json::to_value(r).ok()?.get(key)?.as_f64()
}

#[derive(Debug, clap::Subcommand)]
enum EvalWhat {
    /// Step-time predictors on held-out jobs and unseen placements, against the lookup
    /// and linear baselines.
    Predictor(crate::cli::predictor::PredictorEvalArgs),
}

/// Confidence intervals need two seeds; past [`MAX_SEEDS`] the runs would not end.
fn check_seeds(seeds: u64) -> anyhow::Result<()> {
    if !(2..=MAX_SEEDS).contains(&seeds) {
        anyhow::bail!(
            "--seeds {seeds}: must be 2 ..= {MAX_SEEDS} (confidence intervals need two seeds)"
        );
    }
    Ok(())
}

pub fn run(a: EvalArgs) -> anyhow::Result<()> {
    if let Some(EvalWhat::Predictor(p)) = a.what {
        return crate::cli::predictor::eval(p);
    }
    if a.policies.is_empty() || a.trace.is_empty() {
        anyhow::bail!("marshal eval needs --policies and --trace (or the `predictor` subcommand)");
    }
    check_seeds(a.seeds)?;
    let sim_args = SimArgs {
        mode: a.mode,
        max_arrived_pct: a.max_arrived_pct,
        workloads: a.workloads,
        model: a.model.clone(),
        fallback: a.fallback.clone(),
        cpu_nodes_first: a.cpu_nodes_first,
        quota: a.quota.clone(),
        ..SimArgs::replay(&a.trace, a.cluster.clone(), a.policies.clone(), a.seed)
    };
    let experiment = Experiment::load(&sim_args)?;
    let groups = experiment.run_all_detailed(&a.policies, a.seed, a.seeds)?;
    let baseline = &groups[0];
    let cols = measures(a.mode);

    let mut per_policy = Vec::new();
    for (policy, runs) in a.policies.iter().zip(&groups) {
        let results: Vec<SimResult> = runs.iter().map(|r| r.result.clone()).collect();
        let mut summary = mean_over_seeds(&results);
        let mut ci = serde_json::Map::new();
        let mut diff = serde_json::Map::new();
        for &(key, _, _) in cols {
            let values: Vec<f64> = results.iter().filter_map(|r| value(r, key)).collect();
            ci.insert(key.into(), json!(mean_ci(&values).1));
            // Paired by seed: the relative difference from the first policy's run.
            let paired: Vec<f64> = runs
                .iter()
                .zip(baseline)
                .filter_map(|(r, b)| {
                    let (x, y) = (value(&r.result, key)?, value(&b.result, key)?);
                    (y != 0.0).then(|| (x - y) / y * 100.0)
                })
                .collect();
            let (m, h) = mean_ci(&paired);
            diff.insert(key.into(), json!({"mean_pct": m, "ci95_pct": h}));
        }
        if let Value::Object(o) = &mut summary {
            o.insert("policy".into(), json!(policy));
            o.insert("ci95".into(), Value::Object(ci));
            o.insert(format!("vs_{}", a.policies[0]), Value::Object(diff));
        }
        per_policy.push(json!({"mean": summary, "runs": results}));
    }

    if let Some(dir) = &a.plots {
        write_plots(dir, &a, &groups)?;
    }
    match a.format {
        Format::Json => println!("{}", serde_json::to_string_pretty(&per_policy)?),
        Format::Table => {
            let first = &groups[0][0].result;
            println!(
                "eval of {} on {} ({} GPUs), {} seeds from {}: mean ± 95 % CI; Δ = paired difference from {}",
                first.trace, first.cluster, first.gpus, a.seeds, a.seed, a.policies[0]
            );
            let mut header = format!("{:<16}", "policy");
            for &(_, label, _) in cols {
                header.push_str(&format!(" {label:>20}"));
            }
            header.push_str(&format!(
                " {:>18}",
                format!("Δ {} %", cols[0].1.split(' ').next().unwrap_or(""))
            ));
            println!("{header}");
            for (policy, v) in a.policies.iter().zip(&per_policy) {
                let m = &v["mean"];
                let mut line = format!("{policy:<16}");
                for &(key, _, scale) in cols {
                    let mean = m[key].as_f64().unwrap_or(f64::NAN) / scale;
                    let h = m["ci95"][key].as_f64().unwrap_or(f64::NAN) / scale;
                    line.push_str(&format!(" {:>20}", format!("{mean:.2} ± {h:.2}")));
                }
                let d = &m[format!("vs_{}", a.policies[0])][cols[0].0];
                line.push_str(&format!(
                    " {:>18}",
                    format!(
                        "{:+.1} ± {:.1}",
                        d["mean_pct"].as_f64().unwrap_or(f64::NAN),
                        d["ci95_pct"].as_f64().unwrap_or(f64::NAN)
                    )
                ));
                println!("{line}");
            }
            for (policy, v) in a.policies.iter().zip(&per_policy) {
                if let Some(rate) = v["mean"]["fallback_rate"].as_f64() {
                    let fallback = experiment
                        .learned
                        .as_ref()
                        .map_or("?", |l| l.fallback.as_str());
                    println!(
                        "{policy}: fallback ({fallback}) decided {:.1} % of placements",
                        100.0 * rate
                    );
                }
                if let Some(n) = v["mean"]["declined_shares"].as_f64() {
                    println!(
                        "{policy}: the decline head left {n:.1} GPU shares unplaced per run \
                         (kept idle GPUs whole)"
                    );
                }
                if let Some(n) = v["mean"]["sum_of_squares_ties"].as_f64() {
                    println!(
                        "{policy}: {n:.1} GPU shares per run were placed with FGD's ties broken \
                         by the sum-of-squares rule (the decline head's share-ties switch)"
                    );
                }
            }
            if let Some(dir) = &a.plots {
                println!("plots in {}", dir.display());
            }
        }
    }
    Ok(())
}

fn write_plots(dir: &std::path::Path, a: &EvalArgs, groups: &[Vec<Run>]) -> anyhow::Result<()> {
    std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
    let trace = &a.trace;
    let chart = match a.mode {
        ModeArg::Replay => Chart {
            title: format!("JCT CDF, {trace} ({} seeds pooled)", a.seeds),
            x_label: "JCT (hours, log scale)".into(),
            y_label: "share of jobs".into(),
            log_x: true,
            series: a
                .policies
                .iter()
                .zip(groups)
                .map(|(p, runs)| {
                    let mut jcts: Vec<f64> = runs
                        .iter()
                        .flat_map(|r| r.jcts_s.iter().map(|s| s / 3600.0))
                        .collect();
                    jcts.sort_by(f64::total_cmp);
                    let n = jcts.len().max(1) as f64;
                    // At most ~200 points per line.
                    let step = (jcts.len() / 200).max(1);
                    let points = jcts
                        .iter()
                        .enumerate()
                        .filter(|(i, _)| i % step == 0 || *i + 1 == jcts.len())
                        .map(|(i, &x)| (x, (i + 1) as f64 / n))
                        .collect();
                    Series {
                        name: p.clone(),
                        points,
                    }
                })
                .collect(),
        },
        ModeArg::Inflation => Chart {
            title: format!(
                "GPU allocation against arrived load, {trace} (mean of {} seeds)",
                a.seeds
            ),
            x_label: "arrived GPU load (% of capacity)".into(),
            y_label: "allocated GPUs (% of capacity)".into(),
            log_x: false,
            series: a
                .policies
                .iter()
                .zip(groups)
                .map(|(p, runs)| {
                    let mut points: std::collections::BTreeMap<u64, Vec<f64>> = Default::default();
                    for r in runs {
                        for (k, v) in r.result.alloc_pct_by_arrived.iter().flatten() {
                            if let Ok(x) = k.parse::<u64>() {
                                points.entry(x).or_default().push(*v);
                            }
                        }
                    }
                    Series {
                        name: p.clone(),
                        points: points
                            .into_iter()
                            .map(|(x, v)| (x as f64, v.iter().sum::<f64>() / v.len() as f64))
                            .collect(),
                    }
                })
                .collect(),
        },
    };
    let name = match a.mode {
        ModeArg::Replay => "jct_cdf.svg",
        ModeArg::Inflation => "allocation.svg",
    };
    let path = dir.join(name);
    crate::cli::output::write_whole(&path, chart.to_svg())?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn seed_counts_are_refused_with_the_range_eval_takes() {
        check_seeds(2).unwrap();
        check_seeds(MAX_SEEDS).unwrap();
        for seeds in [0, 1, MAX_SEEDS + 1] {
            let e = check_seeds(seeds).unwrap_err().to_string();
            assert!(
                e.starts_with(&format!("--seeds {seeds}: must be 2 ..= 10000")),
                "{e}"
            );
        }
    }

    #[test]
    fn confidence_intervals_use_students_t() {
        let (m, h) = mean_ci(&[1.0, 2.0, 3.0]);
        assert_eq!(m, 2.0);
        // sd 1, n 3: t(2) × 1/√3.
        assert!((h - 4.303 / 3f64.sqrt()).abs() < 1e-9);
        assert!(mean_ci(&[5.0]).1.is_nan());
        assert!(mean_ci(&[]).0.is_nan());
        assert_eq!(t_quantile(100), 1.96);
    }
}
