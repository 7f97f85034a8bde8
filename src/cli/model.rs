//! `marshal model promote`: install a candidate policy artifact only if it wins.

use std::path::PathBuf;

use anyhow::bail;
use clap::Args;
use marshal_trainer::policy::EpisodeSpec;
use marshal_trainer::promote::{PromoteOptions, TraceRow, promote, record_path};

use crate::cli::policy::parse_episode;

#[derive(Debug, Args)]
pub struct PromoteArgs {
    /// The candidate artifact (must load: checksum, schema, feature layout).
    #[arg(long)]
    candidate: PathBuf,
    /// The installed artifact — the directory `marshal serve` loads and polls. It is
    /// replaced only if the candidate wins (the old one is kept as `<current>.prev`).
    #[arg(long)]
    current: PathBuf,
    /// Validation episodes `TRACE[@CLUSTER][:replay|:inflation]`, comma-separated; each
    /// artifact runs with its own fallback for the episode's objective.
    #[arg(long, value_delimiter = ',', required = true)]
    valid_traces: Vec<String>,
    /// Seeds per trace: 2000, 2001, … (validation seeds; evaluation uses 42 …).
    #[arg(long, default_value_t = 1)]
    seeds: u64,
    /// Largest relative worsening against the current artifact allowed on any trace.
    #[arg(long, default_value_t = 0.02)]
    max_regression: f64,
}

fn print_row(r: &TraceRow) {
    println!(
        "{:<36} {:>9} {:>14.2} {:>14.2} {:>9} {:>18} {:>18}",
        r.trace,
        r.objective,
        r.current,
        r.candidate,
        format!("{:+.2} %", 100.0 * r.change),
        format!(
            "{} {:.0} %",
            r.current_fallback,
            100.0 * r.current_fallback_rate
        ),
        format!(
            "{} {:.0} %",
            r.candidate_fallback,
            100.0 * r.candidate_fallback_rate
        ),
    );
}

pub fn run_promote(a: PromoteArgs) -> anyhow::Result<()> {
    if a.seeds == 0 {
        bail!("--seeds must be at least 1");
    }
    let opts = PromoteOptions {
        max_regression: a.max_regression,
    };
    opts.validate()?;
    let seeds: Vec<u64> = (0..a.seeds).map(|k| 2000 + k).collect();
    // The fallback in each spec is replaced by each artifact's own; these are placeholders.
    let specs: Vec<EpisodeSpec> = a
        .valid_traces
        .iter()
        .map(|t| parse_episode(t, ("topo-pack", "fgd"), &seeds))
        .collect::<anyhow::Result<_>>()?;
    println!(
        "{:<36} {:>9} {:>14} {:>14} {:>9} {:>18} {:>18}",
        "trace", "objective", "current", "candidate", "change", "cur. fb", "cand. fb"
    );
    let record = promote(&a.candidate, &a.current, &specs, &opts, &mut print_row)?;
    println!("{}", record.reason);
    if let Some(prev) = &record.previous {
        println!(
            "installed {} at {} (version {}); the replaced artifact is in {prev}",
            a.candidate.display(),
            a.current.display(),
            record.candidate_hash
        );
    } else if record.promoted {
        println!(
            "installed {} at {} (version {})",
            a.candidate.display(),
            a.current.display(),
            record.candidate_hash
        );
    } else {
        println!("{} is unchanged", a.current.display());
    }
    println!(
        "decision recorded in {}",
        record_path(&a.current)?.display()
    );
    Ok(())
}
