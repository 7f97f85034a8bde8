//! `marshal datasets outcomes`: the incumbent's outcomes CSV that `marshal shadow
//! --report-log LOG --outcomes FILE` reads, exported from `sacct` or `kubectl`.

use std::path::PathBuf;

use clap::{Args, ValueEnum};
use marshal_datasets::{IncumbentExport, PodId};

/// Skipped rows named on stderr; the rest are counted.
const WARN_FIRST: usize = 5;

#[derive(Debug, Args)]
#[command(after_help = "\
Inputs:
  sacct: sacct --allusers --allocations --parsable2 --format=JobID,Submit,Start,End,State,NodeList \
[--starttime …] > sacct.txt
         (job = JobID as is: 1234, 1234_7, 1234+0; step rows such as 1234.batch are left out)
  pods:  kubectl get pods -A -o json > pods.json
         (job = namespace/name, or name with --pod-id name)
The job ids must be the ids the foreign scheduler passed to Advise (the shadow log's `job`).")]
pub struct OutcomesArgs {
    /// What produced the input.
    #[arg(long, value_enum)]
    from: Source,
    /// `sacct --parsable2` output, or `kubectl get pods -A -o json` output.
    #[arg(long)]
    input: PathBuf,
    /// Where to write the CSV (default: stdout).
    #[arg(long)]
    out: Option<PathBuf>,
    /// sacct only: the UTC offset of the cluster's clock (`+HH:MM`, `-HH:MM`), needed
    /// when sacct printed YYYY-MM-DDTHH:MM:SS local times and the cluster is not on UTC.
    /// Default: UTC. Unix-second times (SLURM_TIME_FORMAT=%s) need none.
    /// A cluster whose clock follows daylight saving needs `--time-zone` instead: one
    /// offset puts the times on one side of a change an hour off.
    #[arg(long, allow_hyphen_values = true, conflicts_with = "time_zone")]
    utc_offset: Option<String>,
    /// sacct only: the cluster clock's IANA time zone (`Europe/Berlin`), for local times
    /// across daylight-saving changes: each time takes the offset in force then.
    #[arg(long)]
    time_zone: Option<String>,
    /// pods only: the job id the caller passed to Advise for a pod (default:
    /// `namespaced`, i.e. namespace/name).
    #[arg(long, value_enum)]
    pod_id: Option<PodIdArg>,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
enum Source {
    /// Slurm accounting: `sacct --allusers --allocations --parsable2 …`.
    Sacct,
    /// Kubernetes: `kubectl get pods -A -o json`.
    Pods,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
enum PodIdArg {
    /// `namespace/name`.
    Namespaced,
    /// The pod's name alone.
    Name,
}

pub fn run(args: OutcomesArgs) -> anyhow::Result<()> {
    let name = args.input.display().to_string();
    let text = marshal_datasets::read_text_file(&args.input)?;
    let export = match args.from {
        Source::Sacct => {
            anyhow::ensure!(
                args.pod_id.is_none(),
                "--pod-id applies to --from pods only"
            );
            let clock = match (&args.utc_offset, &args.time_zone) {
                (_, Some(zone)) => marshal_datasets::parse_time_zone(zone)
                    .map_err(|e| anyhow::anyhow!("--time-zone: {e}"))?,
                (Some(s), None) => marshal_datasets::parse_utc_offset(s)
                    .map_err(|e| anyhow::anyhow!("--utc-offset: {e}"))?
                    .into(),
                (None, None) => marshal_datasets::parse_utc_offset("Z")
                    .map_err(|e| anyhow::anyhow!("UTC: {e}"))?
                    .into(),
            };
            marshal_datasets::parse_sacct(&name, &text, clock)?
        }
        Source::Pods => {
            anyhow::ensure!(
                args.utc_offset.is_none() && args.time_zone.is_none(),
                "--utc-offset and --time-zone apply to --from sacct only (RFC 3339 times carry \
                 their offset)"
            );
            let id = match args.pod_id {
                Some(PodIdArg::Name) => PodId::Name,
                Some(PodIdArg::Namespaced) | None => PodId::Namespaced,
            };
            marshal_datasets::parse_kubectl_pods(&name, &text, id)?
        }
    };
    let csv = marshal_datasets::write_incumbent_outcomes(&export.rows);
    let dest = match &args.out {
        Some(path) => {
            crate::cli::output::write_whole(path, &csv)?;
            path.display().to_string()
        }
        None => {
            print!("{csv}");
            "stdout".to_string()
        }
    };
    summarise(
        &export,
        &dest,
        args.from == Source::Sacct && args.utc_offset.is_none() && args.time_zone.is_none(),
    );
    Ok(())
}

/// One line of counts on stderr, then the first skipped rows as `file:line:` warnings.
fn summarise(export: &IncumbentExport, dest: &str, assumed_utc: bool) {
    let report = &export.report;
    let mut line = format!(
        "marshal datasets outcomes: wrote {} rows to {dest} ({}: {} read, {} skipped",
        export.rows.len(),
        report.source,
        report.rows_read,
        report.rows_skipped
    );
    if export.steps_left_out > 0 {
        line += &format!(", {} job steps left out", export.steps_left_out);
    }
    if export.runs_merged > 0 {
        line += &format!(
            ", {} runs of requeued jobs merged into their job's row",
            export.runs_merged
        );
    }
    line.push(')');
    if assumed_utc && export.local_times > 0 {
        line += &format!(
            "; {} local times read as UTC (pass --time-zone or --utc-offset if the \
             cluster's clock is not)",
            export.local_times
        );
    }
    if export.ambiguous_times > 0 {
        line += &format!(
            "; {} local times fell in an hour the clocks went through twice and were read \
             as the earlier (export with SLURM_TIME_FORMAT=%s to avoid the doubt)",
            export.ambiguous_times
        );
    }
    eprintln!("{line}");
    for row in report.skipped.iter().take(WARN_FIRST) {
        eprintln!(
            "warning: {}:{}: skipped: field `{}`: {}",
            report.source, row.line, row.field, row.reason
        );
    }
    if report.rows_skipped > WARN_FIRST {
        eprintln!(
            "warning: {}: … and {} more rows skipped",
            report.source,
            report.rows_skipped - WARN_FIRST
        );
    }
}
