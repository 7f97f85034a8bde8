//! Replaying recorded GPU samples as a [`Source`].
//!
//! [`ReplaySource`] returns, for each `sample(now)`, the recorded rows with
//! `timestamp <= now` that it has not returned yet, in time order. Rows keep their
//! recorded timestamps. Memory is bounded by one UTC day of matching rows: days are
//! disjoint in time, so they are loaded one after the other, each sorted by time.
//! Damaged files are skipped and listed in [`ReplaySource::report`].

use std::collections::{BTreeMap, VecDeque};
use std::path::Path;

use crate::error::{Result, TelemetryError};
use crate::partition::Date;
use crate::reader::{DataFile, Query, Scan, ScanReport, list_files};
use crate::schema::{GpuSample, TelemetryKind};
use crate::source::Source;

/// A source that replays a telemetry directory. See the [module docs](self).
#[derive(Debug)]
pub struct ReplaySource {
    query: Query,
    /// Files grouped by day; files outside the partition layout come first (`None`).
    days: VecDeque<(Option<Date>, Vec<DataFile>)>,
    buffer: VecDeque<GpuSample>,
    report: ScanReport,
}

impl ReplaySource {
    /// Replays the GPU samples under `root` that match `query` (its kind must be GPU and
    /// it must not project columns).
    pub fn open(root: &Path, query: Query) -> Result<Self> {
        if query.kind != TelemetryKind::Gpu || query.columns.is_some() {
            return Err(TelemetryError::InvalidQuery(
                "replay needs a GPU query without projection".into(),
            ));
        }
        let listing = list_files(root)?;
        let mut by_day: BTreeMap<Option<Date>, Vec<DataFile>> = BTreeMap::new();
        for f in listing.files {
            let day = f.partition.as_ref().map(|p| p.date);
            by_day.entry(day).or_default().push(f);
        }
        let report = ScanReport {
            files_ignored: listing.ignored.len(),
            errors: listing.errors,
            ..Default::default()
        };
        Ok(Self {
            query,
            days: by_day.into_iter().collect(),
            buffer: VecDeque::new(),
            report,
        })
    }

    /// Files read, pruned and skipped so far.
    pub fn report(&self) -> &ScanReport {
        &self.report
    }

    /// Time of the next row to be returned, loading the next day if needed.
    pub fn peek_time(&mut self) -> Result<Option<i64>> {
        while self.buffer.is_empty() && !self.days.is_empty() {
            self.load_next_day()?;
        }
        Ok(self.buffer.front().map(|s| s.timestamp_us))
    }

    fn load_next_day(&mut self) -> Result<()> {
        let Some((_, files)) = self.days.pop_front() else {
            return Ok(());
        };
        let mut rows = Scan::from_files(files, self.query.clone())?.rows::<GpuSample>()?;
        let mut day: Vec<GpuSample> = rows.by_ref().collect();
        let r = rows.into_report();
        merge_report(&mut self.report, r);
        day.sort_by_key(|s| (s.timestamp_us, s.node.clone(), s.gpu_index));
        self.buffer.extend(day);
        Ok(())
    }
}

fn merge_report(into: &mut ScanReport, r: ScanReport) {
    into.files_listed += r.files_listed;
    into.files_other_kind += r.files_other_kind;
    into.files_pruned_by_partition += r.files_pruned_by_partition;
    into.files_pruned_by_stats += r.files_pruned_by_stats;
    into.files_read += r.files_read;
    into.row_groups_total += r.row_groups_total;
    into.row_groups_pruned += r.row_groups_pruned;
    into.rows_scanned += r.rows_scanned;
    into.rows_returned += r.rows_returned;
    into.errors.extend(r.errors);
}

impl Source for ReplaySource {
    fn sample(&mut self, now_us: i64) -> Result<Vec<GpuSample>> {
        let mut out = Vec::new();
        while let Some(t) = self.peek_time()? {
            if t > now_us {
                break;
            }
            out.extend(self.buffer.pop_front());
        }
        Ok(out)
    }
}
