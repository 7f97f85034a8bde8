//! `marshal model promote`: install a candidate policy artifact only if it wins;
//! `marshal model keygen`: the key pair that signs promotion records.

use std::path::PathBuf;

use anyhow::bail;
use clap::Args;
use marshal_model::policy::{generate_key_pair, public_key_path, read_signing_key};
use marshal_trainer::policy::EpisodeSpec;
use marshal_trainer::promote::{PromoteOptions, TraceRow, promote_signed, record_path};

#[derive(Debug, Args)]
pub struct KeygenArgs {
    /// The private key file to create (mode 0600; never overwritten). The public key
    /// goes to `<OUT>.pub`, for `promotion_public_keys` in the server's configuration.
    #[arg(long)]
    out: PathBuf,
}

pub fn run_keygen(a: KeygenArgs) -> anyhow::Result<()> {
    let signer = generate_key_pair(&a.out)?;
    println!(
        "key {}: private {} (keep it secret), public {}",
        signer.key_id(),
        a.out.display(),
        public_key_path(&a.out).display()
    );
    Ok(())
}

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
    #[arg(long, allow_negative_numbers = true, default_value_t = 1)]
    seeds: u64,
    /// Largest relative worsening against the current artifact allowed on any trace.
    #[arg(long, allow_negative_numbers = true, default_value_t = 0.02)]
    max_regression: f64,
    /// Sign the record of a promotion with this private key (`marshal model keygen`),
    /// for servers with `promotion_public_keys`. Without it the record is unsigned.
    #[arg(long)]
    signing_key: Option<PathBuf>,
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
    // Read before the (long) evaluation, so a bad key fails at once.
    let signer = a.signing_key.as_deref().map(read_signing_key).transpose()?;
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
    let record = promote_signed(
        &a.candidate,
        &a.current,
        &specs,
        &opts,
        signer.as_ref(),
        &mut print_row,
    )?;
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
    let signed = match (&record.signature, record.promoted) {
        (Some(s), true) => format!(", signed by key {}", s.key_id),
        (Some(s), false) => format!(
            " (the installed artifact's signature by key {} kept)",
            s.key_id
        ),
        (None, _) => String::new(),
    };
    println!(
        "decision recorded in {}{signed}",
        record_path(&a.current)?.display()
    );
    Ok(())
}
