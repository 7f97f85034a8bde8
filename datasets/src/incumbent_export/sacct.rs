//! Slurm: `sacct --allocations --parsable2 --format=JobID,Submit,Start,End,State,NodeList`.

use chrono::{FixedOffset, LocalResult, NaiveDateTime, TimeZone as _};

use std::collections::HashMap;

use marshal_scheduler::shadow::IncumbentOutcome;

use super::{IncumbentExport, first_host, outcome};
use crate::table::{Bad, Col, Table, malformed};
use crate::{DatasetError, ParseReport};

const HEADER: &str = "JobID|Submit|Start|End|State|NodeList";

/// Parses `sacct --parsable2` output (`|`-separated, header line present, columns found
/// by name ignoring case; `JobID`, `Start` and `End` required, `State` and `NodeList`
/// used when present, others ignored; `--parsable`'s trailing `|` is accepted).
///
/// - `job` is `JobID` as is (`1234`, array task `1234_7`, het component `1234+0`): the
///   id a Slurm plugin passes to `Advise`. Step rows (`1234.batch`, `1234.0`, what
///   `sacct` prints without `--allocations`) are left out and counted in
///   [`IncumbentExport::steps_left_out`].
/// - Times are `YYYY-MM-DDTHH:MM:SS` on the cluster's wall clock, converted by `clock`
///   (a fixed offset, or a time zone whose offset changes with daylight saving), or Unix
///   seconds (`SLURM_TIME_FORMAT=%s`), told apart per value. A wall-clock time the zone
///   skipped (the hour clocks jump over) is a bad time; one it passed twice (the hour
///   they fall back over) is read as the earlier and counted in
///   [`IncumbentExport::ambiguous_times`].
///   `Start` `Unknown`/`None`, or a `PENDING` state (whose `Start` is only the expected
///   start), is a job never started; `End` `Unknown` one still running.
/// - `node` is the first host of `NodeList` (`gpu[01-03,07]` → `gpu01`), empty for
///   `None assigned`.
///
/// - A job with several rows is a job Slurm requeued (`sacct --duplicates` lists every
///   run; without it only the last): its runs are merged into one row, as the incumbent's
///   outcome is the job's — `scheduled_time` and `node` are those of its first run,
///   `deletion_time` the end of its last, empty while any run is still running or
///   waiting. They are counted in [`IncumbentExport::runs_merged`].
///
/// A row with a bad time or host list is skipped with its line; a missing required
/// column, or no usable row, is an error.
pub fn parse_sacct(
    name: &str,
    text: &str,
    clock: impl Into<WallClock>,
) -> Result<IncumbentExport, DatasetError> {
    let clock = clock.into();
    let table = Table::open_delimited(name, text, HEADER, b'|')?;
    let cols = Cols {
        job: table.column_ignore_case("JobID", HEADER)?,
        start: table.column_ignore_case("Start", HEADER)?,
        end: table.column_ignore_case("End", HEADER)?,
        state: table.find_ignore_case("State"),
        nodes: table.find_ignore_case("NodeList"),
    };
    let mut export = IncumbentExport {
        rows: Vec::new(),
        report: ParseReport::new(name),
        steps_left_out: 0,
        local_times: 0,
        ambiguous_times: 0,
        runs_merged: 0,
    };
    // Where each job's row is, and whether one of its runs has not ended.
    let mut rows: HashMap<String, (usize, bool)> = HashMap::new();
    let mut report = ParseReport::new(name);
    table.for_each_row(&mut report, |row| {
        let job = row.text(cols.job)?;
        if job.contains('.') {
            export.steps_left_out += 1;
            return Ok(());
        }
        let mut time = |col: Col| {
            sacct_time(row.get(col)?, clock, &mut export)
                .map_err(|reason| Bad::new(col.name, reason))
        };
        let pending = match cols.state {
            Some(c) => row.get(c)?.to_ascii_uppercase().starts_with("PENDING"),
            None => false,
        };
        let start = time(cols.start)?.filter(|_| !pending);
        let end = time(cols.end)?;
        let node = match cols.nodes {
            Some(c) => first_host(row.get(c)?).map_err(|reason| Bad::new(c.name, reason))?,
            None => None,
        };
        let run = outcome(job.to_string(), start, end, node, cols.end.name)?;
        match rows.get_mut(job) {
            Some((at, open)) => {
                merge_run(&mut export.rows[*at], open, run);
                export.runs_merged += 1;
            }
            None => {
                rows.insert(job.to_string(), (export.rows.len(), run.deleted.is_none()));
                export.rows.push(run);
            }
        }
        Ok(())
    });
    // Step rows were read but are neither kept nor skipped.
    report.rows_read -= export.steps_left_out;
    export.report = report;
    if export.rows.is_empty() && export.steps_left_out > 0 && export.report.rows_skipped == 0 {
        return Err(malformed(
            name,
            1,
            "JobID",
            format!(
                "only job steps ({} row{} such as 1234.batch); export one row per job \
                 with `sacct --allocations` (-X)",
                export.steps_left_out,
                if export.steps_left_out == 1 { "" } else { "s" }
            ),
        ));
    }
    if export.rows.is_empty() {
        return Err(export.report.no_valid_rows());
    }
    Ok(export)
}

/// Folds another run of a requeued job into its row: the first run started gives the
/// start and the node, the job has ended only when every run has (`open` says one has
/// not), and then at the last run's end.
fn merge_run(row: &mut IncumbentOutcome, open: &mut bool, run: IncumbentOutcome) {
    let earlier = match (run.scheduled, row.scheduled) {
        (Some(new), Some(old)) => new < old,
        (Some(_), None) => true,
        (None, _) => false,
    };
    *open |= run.deleted.is_none();
    row.deleted = match (*open, row.deleted, run.deleted) {
        (true, _, _) => None,
        (false, Some(a), Some(b)) => Some(a.max(b)),
        (false, a, b) => a.or(b),
    };
    if earlier {
        row.scheduled = run.scheduled;
        row.node = run.node;
    }
}

#[derive(Clone, Copy, Debug)]
struct Cols {
    job: Col,
    start: Col,
    end: Col,
    state: Option<Col>,
    nodes: Option<Col>,
}

/// How the cluster's wall-clock times map to UTC.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum WallClock {
    /// One offset for every time: right for a clock on UTC or without daylight saving.
    Offset(FixedOffset),
    /// An IANA time zone: each time takes the offset in force at that moment, so an
    /// export that spans a daylight-saving change is right on both sides of it.
    Zone(chrono_tz::Tz),
}

impl From<FixedOffset> for WallClock {
    fn from(offset: FixedOffset) -> Self {
        WallClock::Offset(offset)
    }
}

/// An IANA time zone name (`Europe/Berlin`, `America/Chicago`, `UTC`), as in
/// `/usr/share/zoneinfo` or `timedatectl`.
pub fn parse_time_zone(s: &str) -> Result<WallClock, String> {
    s.trim()
        .parse::<chrono_tz::Tz>()
        .map(WallClock::Zone)
        .map_err(|_| {
            format!("{s:?} is not an IANA time zone name like Europe/Berlin or America/Chicago")
        })
}

/// One `sacct` time: `None` for `Unknown`, `None` or empty. Wall-clock times are counted
/// in `export`.
fn sacct_time(
    s: &str,
    clock: WallClock,
    export: &mut IncumbentExport,
) -> Result<Option<f64>, String> {
    if s.is_empty() || s.eq_ignore_ascii_case("Unknown") || s.eq_ignore_ascii_case("None") {
        return Ok(None);
    }
    if s.bytes().all(|b| b.is_ascii_digit()) {
        return s
            .parse::<i64>()
            .map(|t| Some(t as f64))
            .map_err(|e| format!("{s:?}: {e}"));
    }
    let local = NaiveDateTime::parse_from_str(s, "%Y-%m-%dT%H:%M:%S")
        .map_err(|e| format!("{s:?} is neither YYYY-MM-DDTHH:MM:SS nor Unix seconds ({e})"))?;
    export.local_times += 1;
    let unix = match clock {
        WallClock::Offset(offset) => {
            local.and_utc().timestamp() - i64::from(offset.local_minus_utc())
        }
        WallClock::Zone(zone) => match zone.from_local_datetime(&local) {
            LocalResult::Single(t) => t.timestamp(),
            LocalResult::Ambiguous(earlier, _) => {
                export.ambiguous_times += 1;
                earlier.timestamp()
            }
            LocalResult::None => {
                return Err(format!(
                    "{s:?} never happened in {zone}: the clocks skipped it (daylight saving)"
                ));
            }
        },
    };
    if unix < 0 {
        return Err(format!("{s:?} is before 1970"));
    }
    Ok(Some(unix as f64))
}

/// A UTC offset: `+HH:MM`, `-HH:MM`, `+HHMM`, `+HH`, or `Z`/`UTC` for zero.
pub fn parse_utc_offset(s: &str) -> Result<FixedOffset, String> {
    let bad = || format!("{s:?} is not a UTC offset like +02:00 or -05:30");
    let t = s.trim();
    if t.eq_ignore_ascii_case("Z") || t.eq_ignore_ascii_case("UTC") {
        return FixedOffset::east_opt(0).ok_or_else(bad);
    }
    let (sign, rest) = match t.as_bytes().first() {
        Some(b'+') => (1, &t[1..]),
        Some(b'-') => (-1, &t[1..]),
        _ => return Err(bad()),
    };
    let digits: String = rest.chars().filter(|&c| c != ':').collect();
    if !digits.bytes().all(|b| b.is_ascii_digit()) {
        return Err(bad());
    }
    let colons = rest.matches(':').count();
    let (h, m) = match (digits.len(), colons) {
        (2, 0) => (&digits[..2], "00"),
        (4, 0) => (&digits[..2], &digits[2..]),
        (4, 1) if rest.find(':') == Some(2) => (&digits[..2], &digits[2..]),
        _ => return Err(bad()),
    };
    let (Ok(h), Ok(m)) = (h.parse::<i32>(), m.parse::<i32>()) else {
        return Err(bad());
    };
    if h > 23 || m > 59 {
        return Err(bad());
    }
    FixedOffset::east_opt(sign * (h * 3600 + m * 60)).ok_or_else(bad)
}
