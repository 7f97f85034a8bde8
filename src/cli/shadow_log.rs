//! `marshal shadow --report-log`: a live advisor's shadow log, summarised, or joined with
//! the incumbent's outcomes into the input of the same replay as a recorded trace.

use std::collections::BTreeMap;
use std::path::Path;
use std::sync::Arc;

use anyhow::bail;
use marshal_scheduler::domain::Topology;
use marshal_scheduler::service::convert::MAX_WORKERS;
use marshal_scheduler::service::records::{DecisionRecord, Verdict};
use marshal_scheduler::shadow::{Advice, LiveReport, join_live};
use serde_json::json;

use crate::cli::output::Format;
use crate::cli::shadow::{ReplayInput, warn_skipped};

/// What a live shadow log holds, counted.
#[derive(Debug, Default, serde::Serialize)]
pub(crate) struct LogSummary {
    file: String,
    decisions: u64,
    jobs: u64,
    /// Jobs that got a Place recommendation at least once.
    jobs_placed: u64,
    by_verdict: BTreeMap<String, u64>,
    by_path: BTreeMap<String, u64>,
    by_policy: BTreeMap<String, u64>,
    first_at_us: Option<i64>,
    last_at_us: Option<i64>,
}

/// Latest decision time a log record may carry: a trace's 10¹² s, in microseconds.
const MAX_AT_US: i64 = marshal_datasets::MAX_TRACE_SECONDS as i64 * 1_000_000;

/// Records of a shadow log shown one by one when left out; the rest are counted.
const LEFT_OUT_SHOWN: usize = 10;

/// Reads a shadow log; a line that is not a decision record is an error naming
/// `file:line`. Two exceptions, left out with a warning naming `file:line`:
/// - a last line with no newline that does not parse: a record torn by a crash (or
///   still being written), which no caller received;
/// - a record that parses but cannot be replayed: a decision time before 1970 or past
///   10¹² s, or a job spec the service would have refused (no worker, more than
///   `MAX_WORKERS`, a share outside 1–999 milli, …). The advisor never writes one, so
///   such a line was edited or damaged; the rest of the log is still usable.
///
/// Line breaks may be `\n`, `\r\n` or a lone `\r` (JSON escapes both inside strings).
fn read_log(path: &Path) -> anyhow::Result<Vec<DecisionRecord>> {
    let text = marshal_datasets::read_text_file(path)?;
    let text = if text.contains('\r') {
        text.replace("\r\n", "\n").replace('\r', "\n")
    } else {
        text
    };
    let file = path.display();
    let torn_tail = !text.is_empty() && !text.ends_with('\n');
    let line_count = text.lines().count();
    let mut records = Vec::new();
    let mut left_out = 0usize;
    for (i, line) in text.lines().enumerate() {
        if line.trim().is_empty() {
            continue;
        }
        match serde_json::from_str::<DecisionRecord>(line) {
            Ok(r) => match unreplayable(&r) {
                None => records.push(r),
                Some(why) => {
                    left_out += 1;
                    if left_out <= LEFT_OUT_SHOWN {
                        eprintln!("warning: {file}:{}: left out job {:?}: {why}", i + 1, r.job);
                    }
                }
            },
            Err(e) if torn_tail && i + 1 == line_count => eprintln!(
                "warning: {file}:{}: left out a torn last record (no newline; the advisor \
                 stopped or is still writing it): {e}",
                i + 1
            ),
            Err(e) => {
                return Err(anyhow::Error::new(e).context(format!(
                    "{file}:{}: not a shadow-log decision record",
                    i + 1
                )));
            }
        }
    }
    if left_out > LEFT_OUT_SHOWN {
        eprintln!(
            "warning: {file}: left out {left_out} records that cannot be replayed ({} more \
             than shown)",
            left_out - LEFT_OUT_SHOWN
        );
    }
    Ok(records)
}

/// Why a parsed record cannot be replayed, if it cannot.
fn unreplayable(r: &DecisionRecord) -> Option<String> {
    if !(0..=MAX_AT_US).contains(&r.at_us) {
        return Some(format!(
            "decision time at_us {} is not between 1970 and 10^12 s",
            r.at_us
        ));
    }
    if r.spec.workers > MAX_WORKERS {
        return Some(format!(
            "{} workers; the service takes at most {MAX_WORKERS}",
            r.spec.workers
        ));
    }
    r.spec.validate().err().map(|e| e.to_string())
}

pub(crate) fn summarise_log(path: &Path) -> anyhow::Result<LogSummary> {
    let mut s = LogSummary {
        file: path.display().to_string(),
        ..LogSummary::default()
    };
    let mut jobs = std::collections::BTreeSet::new();
    let mut placed = std::collections::BTreeSet::new();
    for r in read_log(path)? {
        s.decisions += 1;
        let verdict = format!("{:?}", r.verdict).to_lowercase();
        if r.verdict == Verdict::Place {
            placed.insert(r.job.clone());
        }
        jobs.insert(r.job);
        *s.by_verdict.entry(verdict).or_default() += 1;
        *s.by_path.entry(r.path).or_default() += 1;
        *s.by_policy.entry(r.policy).or_default() += 1;
        s.first_at_us = Some(s.first_at_us.map_or(r.at_us, |t| t.min(r.at_us)));
        s.last_at_us = Some(s.last_at_us.map_or(r.at_us, |t| t.max(r.at_us)));
    }
    s.jobs = jobs.len() as u64;
    s.jobs_placed = placed.len() as u64;
    Ok(s)
}

pub(crate) fn print_log_summary(s: &LogSummary, format: Format) -> anyhow::Result<()> {
    match format {
        Format::Json => println!("{}", serde_json::to_string_pretty(s)?),
        Format::Table => {
            println!(
                "{}: {} decisions on {} jobs ({} recommended a placement at least once)",
                s.file, s.decisions, s.jobs, s.jobs_placed
            );
            println!(
                "{}",
                json!({"by_verdict": s.by_verdict, "by_path": s.by_path, "by_policy": s.by_policy})
            );
        }
    }
    Ok(())
}

/// The log joined with the outcomes file by job id: the replay's input on `topo`, and
/// the join's report. Unmatched jobs on either side are counted and named on stderr.
pub(crate) fn join_outcomes(
    log: &Path,
    outcomes: &Path,
    topo: Arc<Topology>,
) -> anyhow::Result<(ReplayInput, LiveReport)> {
    let advice: Vec<Advice> = read_log(log)?
        .into_iter()
        .map(|r| Advice {
            placed_on: (r.verdict == Verdict::Place)
                .then(|| r.placement.iter().map(|w| w.node.clone()).collect()),
            job: r.job,
            at_us: r.at_us,
            spec: r.spec,
        })
        .collect();
    let name = outcomes.display().to_string();
    let text = marshal_datasets::read_text_file(outcomes)?;
    let (rows, parsed) = marshal_datasets::parse_incumbent_outcomes(&name, &text)?;
    warn_skipped(&parsed);
    let join = join_live(&advice, &rows);
    warn_unmatched(
        &join.log_only,
        &format!("jobs of {} have no outcome row", log.display()),
    );
    warn_unmatched(
        &join.outcomes_only,
        &format!("outcome rows of {name} are not in the log"),
    );
    if join.jobs.is_empty() {
        bail!(
            "no job of {} has an outcome row in {name}: the `job` column must hold the ids \
             the foreign scheduler sent to Advise",
            log.display()
        );
    }
    let mut report = join.report;
    report.outcome_rows_skipped = parsed.rows_skipped as u64;
    let input = ReplayInput {
        topo,
        jobs: join.jobs,
        recorded: join.recorded,
        trace: log.display().to_string(),
    };
    Ok((input, report))
}

/// Says how many ids were not joined, naming the first few.
fn warn_unmatched(ids: &[String], what: &str) {
    const SHOWN: usize = 5;
    if ids.is_empty() {
        return;
    }
    let more = if ids.len() > SHOWN { ", …" } else { "" };
    eprintln!(
        "warning: {} {what} (not replayed): {}{more}",
        ids.len(),
        ids[..ids.len().min(SHOWN)].join(", ")
    );
}
