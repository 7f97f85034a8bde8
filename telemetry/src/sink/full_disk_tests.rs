//! The sink under a file system that refuses writes: nothing it accepted is lost while
//! the refusal lasts, memory stays bounded, and giving up at shutdown is counted.

use std::path::Path;
use std::time::{Duration, Instant};

use super::*;
use crate::faults::{DEVICE_ERROR, FaultOp, NO_SPACE, PERMISSION_DENIED, inject};
use crate::reader::{Query, read_all};

fn sample(gpu: u16, ts: i64) -> GpuSample {
    GpuSample {
        timestamp_us: ts,
        cluster: "c".into(),
        node: "n1".into(),
        gpu_index: gpu,
        gpu_uuid: format!("GPU-{gpu}").into(),
        gpu_type: "H100".into(),
        sm_util_pct: Some(50.0),
        ..Default::default()
    }
}

/// `n` rows of 4 GPUs, one second apart, starting at `from` seconds.
fn rows(from: i64, n: i64) -> Vec<GpuSample> {
    (from..from + n)
        .map(|i| sample((i % 4) as u16, 1_700_000_000_000_000 + i * 1_000_000))
        .collect()
}

/// Small row groups and files, so that a few hundred rows exercise every step.
fn config(root: &Path) -> SinkConfig {
    let mut cfg = SinkConfig::new(root);
    cfg.write.row_group_rows = 64;
    cfg.write.data_page_rows = 32;
    cfg.max_file_bytes = 4096;
    cfg
}

fn published_timestamps(root: &Path) -> Vec<i64> {
    let (rows, report) = read_all::<GpuSample>(root, Query::new(TelemetryKind::Gpu)).unwrap();
    assert!(report.errors.is_empty(), "{:?}", report.errors);
    let mut ts: Vec<i64> = rows.iter().map(|r| r.timestamp_us).collect();
    ts.sort_unstable();
    ts
}

fn expected_timestamps(from: i64, n: i64) -> Vec<i64> {
    let mut ts: Vec<i64> = rows(from, n).iter().map(|r| r.timestamp_us).collect();
    ts.sort_unstable();
    ts
}

fn tmp_files(root: &Path) -> Vec<std::path::PathBuf> {
    fn walk(dir: &Path, out: &mut Vec<std::path::PathBuf>) {
        for entry in std::fs::read_dir(dir).into_iter().flatten().flatten() {
            let path = entry.path();
            if path.is_dir() {
                walk(&path, out);
            } else if path.to_string_lossy().ends_with(".tmp") {
                out.push(path);
            }
        }
    }
    let mut out = Vec::new();
    walk(root, &mut out);
    out
}

/// Waits until the writer thread reports a stall.
fn wait_for_stall(sink: &TelemetrySink) -> String {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        if let Some(reason) = sink.stats().stall {
            return reason;
        }
        assert!(
            Instant::now() < deadline,
            "the sink never noticed the refusal"
        );
        std::thread::sleep(Duration::from_millis(5));
    }
}

#[test]
fn a_full_disk_in_the_middle_of_files_loses_no_row() {
    let dir = tempfile::tempdir().unwrap();
    let sink = TelemetrySink::open(config(dir.path())).unwrap();
    sink.send(rows(0, 300)).unwrap();
    sink.flush().unwrap();
    let before = sink.stats();
    assert_eq!(before.rows_written, 300);

    let full = inject(dir.path(), FaultOp::Write, NO_SPACE);
    // Row groups and whole files (4 KiB each) are written into the refused disk.
    sink.send(rows(300, 600)).unwrap();
    let reason = wait_for_stall(&sink);
    assert!(reason.contains("os error 28"), "{reason}");
    match sink.flush() {
        Err(TelemetryError::SinkStalled { rows, reason, .. }) => {
            assert_eq!(rows, 600, "every row sent since the disk filled waits");
            assert!(reason.contains("os error 28"), "{reason}");
        }
        other => panic!("flush must say the rows wait, got {other:?}"),
    }
    let during = sink.stats();
    assert_eq!(during.rows_dropped, 0);
    assert!(during.backlog_bytes > 0, "{during:?}");
    assert_eq!(during.stalls, 1);
    assert_eq!(
        during.error_count, 1,
        "one episode, one error: {:?}",
        during.errors
    );
    assert!(
        during.errors[0].contains("kept in memory"),
        "{:?}",
        during.errors
    );

    drop(full);
    sink.flush().unwrap();
    let stats = sink.finish().unwrap();
    assert_eq!(stats.rows_written, 900);
    assert_eq!(stats.rows_dropped, 0);
    assert_eq!((stats.stall, stats.backlog_bytes), (None, 0));
    assert_eq!(
        published_timestamps(dir.path()),
        expected_timestamps(0, 900)
    );
    assert!(tmp_files(dir.path()).is_empty());
}

#[test]
fn rows_wait_for_a_directory_that_cannot_be_written() {
    let dir = tempfile::tempdir().unwrap();
    let sink = TelemetrySink::open(config(dir.path())).unwrap();
    let denied = inject(dir.path(), FaultOp::Create, PERMISSION_DENIED);
    sink.send(rows(0, 200)).unwrap();
    match sink.flush() {
        Err(TelemetryError::SinkStalled { rows, reason, .. }) => {
            assert_eq!(rows, 200);
            assert!(reason.contains("creating"), "{reason}");
            assert!(reason.contains("os error 13"), "{reason}");
        }
        other => panic!("expected SinkStalled, got {other:?}"),
    }
    assert_eq!(sink.stats().files_committed, 0);
    drop(denied);
    sink.flush().unwrap();
    let stats = sink.finish().unwrap();
    assert_eq!((stats.rows_written, stats.rows_dropped), (200, 0));
    assert_eq!(
        published_timestamps(dir.path()),
        expected_timestamps(0, 200)
    );
}

#[test]
fn a_refused_sync_or_rename_is_tried_again_and_the_file_published_once() {
    for op in [FaultOp::Sync, FaultOp::SyncDir, FaultOp::Rename] {
        let dir = tempfile::tempdir().unwrap();
        let sink = TelemetrySink::open(config(dir.path())).unwrap();
        let refused = inject(dir.path(), op, DEVICE_ERROR);
        sink.send(rows(0, 50)).unwrap();
        assert!(
            matches!(
                sink.flush(),
                Err(TelemetryError::SinkStalled { rows: 50, .. })
            ),
            "{op:?}"
        );
        drop(refused);
        sink.flush().unwrap();
        let stats = sink.finish().unwrap();
        assert_eq!(
            (stats.rows_written, stats.files_committed),
            (50, 1),
            "{op:?}"
        );
        assert_eq!(published_timestamps(dir.path()), expected_timestamps(0, 50));
        assert!(tmp_files(dir.path()).is_empty(), "{op:?}");
    }
}

/// A file system that cannot `fsync` a directory at all (EINVAL, as some network and
/// FUSE file systems answer) is not a refusal: files are published, nothing stalls.
#[test]
fn a_file_system_that_cannot_sync_directories_does_not_stall_the_sink() {
    const INVALID_ARGUMENT: i32 = 22;
    let dir = tempfile::tempdir().unwrap();
    let sink = TelemetrySink::open(config(dir.path())).unwrap();
    let _never = inject(dir.path(), FaultOp::SyncDir, INVALID_ARGUMENT);
    sink.send(rows(0, 50)).unwrap();
    sink.flush().unwrap();
    let stats = sink.finish().unwrap();
    assert_eq!((stats.rows_written, stats.files_committed), (50, 1));
    assert_eq!(published_timestamps(dir.path()), expected_timestamps(0, 50));
}

/// Sends batches of 50 rows until the queue is full (at most `batches`); returns the
/// rows taken and the batch refused, if one was.
fn send_until_full(sink: &TelemetrySink, batches: i64) -> (i64, Option<i64>) {
    let mut accepted = 0;
    for batch in 0..batches {
        match sink.send_timeout(rows(batch * 50, 50), Duration::from_millis(20)) {
            Ok(()) => accepted += 50,
            Err(TrySendError::Full(back)) => {
                assert_eq!(back.len(), 50, "the rows come back");
                return (accepted, Some(batch));
            }
            Err(e) => panic!("{e}"),
        }
    }
    (accepted, None)
}

/// Once the file system takes writes again, every row taken is published, none lost.
fn publishes_what_it_took(sink: TelemetrySink, root: &Path, accepted: i64) {
    sink.flush().unwrap();
    let stats = sink.finish().unwrap();
    assert_eq!(
        (stats.rows_written, stats.rows_dropped),
        (accepted as u64, 0)
    );
    assert_eq!(published_timestamps(root), expected_timestamps(0, accepted));
}

#[test]
fn a_stalled_sink_stops_taking_rows_at_its_memory_bound() {
    let dir = tempfile::tempdir().unwrap();
    let mut cfg = config(dir.path());
    cfg.max_buffered_rows = 100;
    cfg.channel_capacity = 2;
    let sink = TelemetrySink::open(cfg).unwrap();
    let denied = inject(dir.path(), FaultOp::Create, NO_SPACE);
    let (accepted, refused) = send_until_full(&sink, 200);
    let refused = refused.expect("the queue fills once the writer stops taking rows");
    // The writer stops at its bound (100 rows), plus at most the queue's 2 messages and
    // the message it was taking.
    assert!(
        accepted <= 100 + 3 * 50,
        "{accepted} rows accepted before batch {refused}"
    );
    drop(denied);
    publishes_what_it_took(sink, dir.path(), accepted);
}

/// A refused rename leaves finished files waiting, each with its descriptor and almost
/// no bytes: their number, not the memory bound, must stop intake.
#[test]
fn a_stalled_sink_stops_taking_rows_when_finished_files_pile_up() {
    let dir = tempfile::tempdir().unwrap();
    let mut cfg = config(dir.path());
    cfg.max_open_files = 3;
    cfg.channel_capacity = 2;
    let sink = TelemetrySink::open(cfg).unwrap();
    let refused = inject(dir.path(), FaultOp::Rename, DEVICE_ERROR);
    let (accepted, full) = send_until_full(&sink, 400);
    assert!(
        full.is_some(),
        "{accepted} rows taken while no file could be published"
    );
    // A 4 KiB file holds a few hundred rows: three of them, the open one, the queue.
    assert!(accepted <= 3_000, "{accepted} rows accepted");
    drop(refused);
    publishes_what_it_took(sink, dir.path(), accepted);
}

#[test]
fn shutdown_gives_up_after_its_grace_and_counts_the_rows() {
    let dir = tempfile::tempdir().unwrap();
    let mut cfg = config(dir.path());
    cfg.shutdown_grace = Duration::from_millis(200);
    let sink = TelemetrySink::open(cfg).unwrap();
    sink.send(rows(0, 100)).unwrap();
    sink.flush().unwrap();
    let _full = inject(dir.path(), FaultOp::Write, NO_SPACE);
    sink.send(rows(100, 250)).unwrap();
    let started = Instant::now();
    let stats = sink.finish().unwrap();
    assert!(started.elapsed() >= Duration::from_millis(200));
    assert_eq!((stats.rows_written, stats.rows_dropped), (100, 250));
    let last = stats.errors.last().unwrap();
    assert!(
        last.contains("250 rows") && last.contains("gave up"),
        "{last}"
    );
    assert!(tmp_files(dir.path()).is_empty(), "no half file is left");
    assert_eq!(
        published_timestamps(dir.path()),
        expected_timestamps(0, 100)
    );
}

#[test]
fn a_sink_paused_at_its_bound_still_shuts_down_and_counts_what_it_took() {
    let dir = tempfile::tempdir().unwrap();
    let mut cfg = config(dir.path());
    cfg.max_buffered_rows = 10;
    cfg.channel_capacity = 2;
    cfg.shutdown_grace = Duration::from_millis(100);
    let sink = TelemetrySink::open(cfg).unwrap();
    let _denied = inject(dir.path(), FaultOp::Create, NO_SPACE);
    let mut accepted = 0;
    while sink
        .send_timeout(rows(accepted, 10), Duration::from_millis(20))
        .is_ok()
    {
        accepted += 10;
        assert!(accepted < 10_000, "the sink never paused");
    }
    // Paused with its queue full: shutdown takes the queued rows in, retries for its
    // grace and gives up, counting every row it accepted.
    let started = Instant::now();
    let stats = sink.finish().unwrap();
    assert!(started.elapsed() < Duration::from_secs(5));
    assert_eq!(stats.rows_received, accepted as u64);
    assert_eq!(
        (stats.rows_written, stats.rows_dropped),
        (0, accepted as u64)
    );
}
