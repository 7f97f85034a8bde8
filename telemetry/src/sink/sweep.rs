//! The sink's side of retention ([`crate::retention`]): an hourly sweep on the writer
//! thread, which knows which partitions it is writing.

use std::collections::HashSet;
use std::path::PathBuf;
use std::time::{Duration, SystemTime};

use super::{SinkStats, Worker, lock};
use crate::retention::{first_day_kept, prune_before};

/// How often the writer sweeps (and once when it starts). Partitions are whole days, so
/// an hour late costs at most an hour's extra keep.
pub(super) const EVERY: Duration = Duration::from_secs(3600);

impl Worker {
    /// Deletes the days older than the retention, except partitions with an open file or
    /// a finished file waiting to be published; forgets the sequence numbers of the
    /// partitions it deleted (so that map stays bounded too).
    pub(super) fn sweep_expired(&mut self) {
        let Some(retention) = self.ctx.cfg.retention else {
            return;
        };
        let Some(keep_from) = first_day_kept(SystemTime::now(), retention) else {
            return;
        };
        let in_use: HashSet<PathBuf> = self
            .files
            .values()
            .map(|f| f.dir.clone())
            .chain(self.ctx.unpublished.iter().map(|u| u.dir().to_path_buf()))
            .collect();
        let report = prune_before(&self.ctx.cfg.root, keep_from, &in_use);
        self.ctx
            .next_seq
            .retain(|dir, _| !report.partitions.iter().any(|p| dir.starts_with(p)));
        if report.files > 0 {
            tracing::info!(
                files = report.files,
                bytes = report.bytes,
                before = %keep_from,
                "telemetry sink: days past the retention deleted"
            );
        }
        if !report.foreign.is_empty() {
            tracing::warn!(
                files = report.foreign.len(),
                first = %report.foreign[0].display(),
                "telemetry sink: expired partitions hold files that are not telemetry; left in place"
            );
        }
        let mut s = lock(&self.ctx.stats);
        s.pruned_files += report.files;
        s.pruned_bytes += report.bytes;
        for e in report.errors {
            tracing::warn!("telemetry sink: retention: {e}");
            s.error_count += 1;
            if s.errors.len() < SinkStats::MAX_LISTED {
                s.errors.push(format!("retention: {e}"));
            }
        }
    }
}
