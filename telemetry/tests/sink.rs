//! Partitioning, rolling, atomic visibility and accounting of the sink.

mod common;

use std::path::{Path, PathBuf};
use std::time::Duration;

use common::*;
use marshal_telemetry::*;

fn rel(root: &Path, files: &[DataFile]) -> Vec<String> {
    files
        .iter()
        .map(|f| {
            f.path
                .strip_prefix(root)
                .unwrap()
                .to_string_lossy()
                .into_owned()
        })
        .collect()
}

fn gpu_rows_in(path: &Path) -> Vec<GpuSample> {
    let file = DataFile {
        path: path.to_path_buf(),
        partition: None,
        bytes: 0,
    };
    Scan::from_files(vec![file], Query::new(TelemetryKind::Gpu))
        .unwrap()
        .rows::<GpuSample>()
        .unwrap()
        .collect()
}

#[test]
fn files_are_partitioned_by_kind_date_and_node() {
    let dir = tempfile::tempdir().unwrap();
    let sink = TelemetrySink::open(SinkConfig::new(dir.path())).unwrap();
    // Two nodes, 30 s either side of midnight, and one awkward node name.
    sink.send(gpu_series(
        &["n1", "n2"],
        2,
        DAY0_US + 86_400 * SEC - 30 * SEC,
        60,
    ))
    .unwrap();
    sink.send(vec![gpu("rack 1/n=3", 0, DAY0_US)]).unwrap();
    sink.send(vec![node_sample("n1", DAY0_US)]).unwrap();
    let stats = sink.finish().unwrap();
    assert_eq!(stats.rows_written, 2 * 2 * 60 + 2);

    let listing = list_files(dir.path()).unwrap();
    assert_eq!(
        rel(dir.path(), &listing.files),
        [
            "kind=gpu/date=2025-03-14/node=n1/part-000001.parquet",
            "kind=gpu/date=2025-03-14/node=n2/part-000001.parquet",
            "kind=gpu/date=2025-03-14/node=rack%201%2Fn%3D3/part-000001.parquet",
            "kind=gpu/date=2025-03-15/node=n1/part-000001.parquet",
            "kind=gpu/date=2025-03-15/node=n2/part-000001.parquet",
            "kind=node/date=2025-03-14/node=n1/part-000001.parquet",
        ]
    );
    let p = listing.files[2].partition.as_ref().unwrap();
    assert_eq!(p.node.as_deref(), Some("rack 1/n=3"));
    // Every file's rows lie in its date and node.
    for f in listing
        .files
        .iter()
        .filter(|f| f.partition.as_ref().unwrap().kind == TelemetryKind::Gpu)
    {
        let part = f.partition.as_ref().unwrap();
        let rows = gpu_rows_in(&f.path);
        assert!(!rows.is_empty());
        for r in rows {
            assert!(r.timestamp_us >= part.date.start_us() && r.timestamp_us < part.date.end_us());
            assert_eq!(Some(r.node.to_string()), part.node);
        }
    }
}

#[test]
fn files_roll_by_size() {
    let dir = tempfile::tempdir().unwrap();
    let mut cfg = SinkConfig::new(dir.path());
    cfg.write.row_group_rows = 100;
    cfg.max_file_bytes = 1; // every row group closes its file
    let sink = TelemetrySink::open(cfg).unwrap();
    sink.send(gpu_series(&["n1"], 4, DAY0_US, 100)).unwrap(); // 400 rows
    let stats = sink.finish().unwrap();
    assert_eq!(stats.files_committed, 4);
    assert_eq!(
        stats.files.iter().map(|f| f.rows).collect::<Vec<_>>(),
        [100; 4]
    );
    let listing = list_files(dir.path()).unwrap();
    assert_eq!(listing.files.len(), 4);
    assert!(listing.files[3].path.ends_with("part-000004.parquet"));

    // With a realistic limit the same rows fit in one file.
    let dir2 = tempfile::tempdir().unwrap();
    let mut cfg = SinkConfig::new(dir2.path());
    cfg.write.row_group_rows = 100;
    let sink = TelemetrySink::open(cfg).unwrap();
    sink.send(gpu_series(&["n1"], 4, DAY0_US, 100)).unwrap();
    assert_eq!(sink.finish().unwrap().files_committed, 1);
}

#[test]
fn files_roll_by_data_time_span() {
    let dir = tempfile::tempdir().unwrap();
    let mut cfg = SinkConfig::new(dir.path());
    cfg.max_file_span = Duration::from_secs(3600);
    let sink = TelemetrySink::open(cfg).unwrap();
    // 3 hours at one sample per 10 s, sent in 1-minute batches.
    let rows: Vec<GpuSample> = (0..3 * 360)
        .map(|i| gpu("n1", 0, DAY0_US + i * 10 * SEC))
        .collect();
    for chunk in rows.chunks(6) {
        sink.send(chunk.to_vec()).unwrap();
    }
    let stats = sink.finish().unwrap();
    assert_eq!(stats.files_committed, 3);
    for f in &stats.files {
        let rows = gpu_rows_in(&f.path);
        let lo = rows.iter().map(|r| r.timestamp_us).min().unwrap();
        let hi = rows.iter().map(|r| r.timestamp_us).max().unwrap();
        assert!(
            hi - lo < 3600 * SEC,
            "{} spans {} s",
            f.path.display(),
            (hi - lo) / SEC
        );
        assert_eq!(rows.len(), 360);
    }
}

#[test]
fn files_roll_by_wall_time_and_become_visible_without_flush() {
    let dir = tempfile::tempdir().unwrap();
    let mut cfg = SinkConfig::new(dir.path());
    cfg.max_file_age = Duration::from_millis(100);
    let sink = TelemetrySink::open(cfg).unwrap();
    sink.send(gpu_series(&["n1"], 2, DAY0_US, 10)).unwrap();
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    // The writer thread publishes the file, then counts it: wait for both.
    let files = loop {
        let l = list_files(dir.path()).unwrap();
        let counted = sink.stats().rows_written == 20;
        if (!l.files.is_empty() && counted) || std::time::Instant::now() > deadline {
            break l.files;
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    assert_eq!(
        files.len(),
        1,
        "the aged file is published while the sink is open"
    );
    assert_eq!(sink.stats().rows_written, 20);
    // Later rows go to a new file.
    sink.send(gpu_series(&["n1"], 2, DAY0_US + 100 * SEC, 10))
        .unwrap();
    let stats = sink.finish().unwrap();
    assert_eq!(stats.files_committed, 2);
}

#[test]
fn nothing_is_visible_until_a_file_is_complete() {
    let dir = tempfile::tempdir().unwrap();
    let sink = TelemetrySink::open(SinkConfig::new(dir.path())).unwrap();
    sink.send(gpu_series(&["n1"], 8, DAY0_US, 60)).unwrap();
    // Buffered, not published: readers see nothing.
    std::thread::sleep(Duration::from_millis(50));
    let l = list_files(dir.path()).unwrap();
    assert!(l.files.is_empty(), "{:?}", l.files);
    let (rows, _) = read_all::<GpuSample>(dir.path(), Query::new(TelemetryKind::Gpu)).unwrap();
    assert!(rows.is_empty());
    sink.flush().unwrap();
    let (rows, _) = read_all::<GpuSample>(dir.path(), Query::new(TelemetryKind::Gpu)).unwrap();
    assert_eq!(rows.len(), 480);
    drop(sink);
}

#[test]
fn tmp_files_are_ignored_by_readers_and_skipped_by_numbering() {
    let dir = tempfile::tempdir().unwrap();
    let part: PathBuf = dir.path().join("kind=gpu/date=2025-03-14/node=n1");
    std::fs::create_dir_all(&part).unwrap();
    // A file a crashed writer left half written, and a stray temp name.
    std::fs::write(part.join(".part-000007.parquet.tmp"), b"PAR1 half a file").unwrap();
    std::fs::write(part.join("part-000008.parquet.tmp"), b"PAR1 half a file").unwrap();

    let sink = TelemetrySink::open(SinkConfig::new(dir.path())).unwrap();
    sink.send(gpu_series(&["n1"], 1, DAY0_US, 5)).unwrap();
    let stats = sink.finish().unwrap();
    assert!(
        stats.files[0].path.ends_with("part-000009.parquet"),
        "{:?}",
        stats.files
    );

    let listing = list_files(dir.path()).unwrap();
    assert_eq!(listing.files.len(), 1);
    assert_eq!(listing.ignored.len(), 2);
    let scan = Scan::new(dir.path(), Query::new(TelemetryKind::Gpu)).unwrap();
    let rows: usize = scan.map(|b| b.num_rows()).sum();
    assert_eq!(rows, 5);
    // No leftover temporary files from the sink itself.
    let tmp_left = walk(dir.path())
        .into_iter()
        .filter(|p| p.to_string_lossy().ends_with(".tmp"))
        .count();
    assert_eq!(tmp_left, 2);
}

fn walk(dir: &Path) -> Vec<PathBuf> {
    let mut out = Vec::new();
    for e in std::fs::read_dir(dir).unwrap().flatten() {
        if e.file_type().unwrap().is_dir() {
            out.extend(walk(&e.path()));
        } else {
            out.push(e.path());
        }
    }
    out
}

#[test]
fn open_file_and_buffer_limits_keep_every_row() {
    let dir = tempfile::tempdir().unwrap();
    let mut cfg = SinkConfig::new(dir.path());
    cfg.max_open_files = 2;
    cfg.max_buffered_rows = 50;
    cfg.channel_capacity = 1;
    let sink = TelemetrySink::open(cfg).unwrap();
    let nodes = ["a", "b", "c", "d", "e"];
    for s in 0..20 {
        sink.send(gpu_series(&nodes, 4, DAY0_US + s * SEC, 1))
            .unwrap();
    }
    let stats = sink.finish().unwrap();
    assert_eq!(stats.rows_written, 5 * 4 * 20);
    assert_eq!(stats.rows_dropped, 0);
    assert!(stats.files_committed >= 5);
    let (rows, report) = read_all::<GpuSample>(dir.path(), Query::new(TelemetryKind::Gpu)).unwrap();
    assert_eq!(rows.len(), 400);
    assert!(report.errors.is_empty());
}

#[test]
fn a_partition_that_cannot_be_written_holds_its_rows_and_not_the_others() {
    let dir = tempfile::tempdir().unwrap();
    // A regular file where the partition directory for node "x" must go.
    std::fs::create_dir_all(dir.path().join("kind=gpu/date=2025-03-14")).unwrap();
    std::fs::write(
        dir.path().join("kind=gpu/date=2025-03-14/node=x"),
        b"not a dir",
    )
    .unwrap();
    let mut cfg = SinkConfig::new(dir.path());
    cfg.shutdown_grace = Duration::from_millis(100);
    let sink = TelemetrySink::open(cfg).unwrap();
    sink.send(gpu_series(&["x", "y"], 1, DAY0_US, 3)).unwrap();
    // Node x's rows wait (the obstacle might be removed); node y's are published.
    match sink.flush() {
        Err(TelemetryError::SinkStalled { rows, reason, .. }) => {
            assert_eq!(rows, 3);
            assert!(reason.contains("node=x"), "{reason}");
        }
        other => panic!("expected SinkStalled, got {other:?}"),
    }
    assert_eq!(sink.stats().rows_written, 3);
    sink.send(gpu_series(&["y"], 1, DAY0_US + 10 * SEC, 3))
        .unwrap();
    // Still there at shutdown: after the grace, x's rows are given up, counted.
    let stats = sink.finish().unwrap();
    assert_eq!(stats.error_count, 2, "{:?}", stats.errors);
    assert!(stats.errors[0].contains("node=x"), "{:?}", stats.errors);
    assert!(
        stats.errors[1].contains("3 rows") && stats.errors[1].contains("gave up"),
        "{:?}",
        stats.errors
    );
    assert_eq!(stats.rows_dropped, 3);
    assert_eq!(stats.rows_written, 6);
    assert_eq!(stats.rows_received, stats.rows_written + stats.rows_dropped);
}

#[test]
fn an_idle_sink_writes_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let sink = TelemetrySink::open(SinkConfig::new(dir.path())).unwrap();
    sink.send(Vec::<GpuSample>::new()).unwrap();
    sink.flush().unwrap();
    let stats = sink.finish().unwrap();
    assert_eq!(
        (
            stats.batches,
            stats.rows_received,
            stats.files_committed,
            stats.error_count
        ),
        (0, 0, 0, 0)
    );
    assert!(walk(dir.path()).is_empty());
}

#[test]
fn rows_are_written_in_file_order_even_when_they_arrive_out_of_order() {
    let dir = tempfile::tempdir().unwrap();
    let sink = TelemetrySink::open(SinkConfig::new(dir.path())).unwrap();
    // Time-major, as a sampler sends them, plus late rows for GPU 1 and an out-of-order GPU 2.
    sink.send(gpu_series(&["n1"], 2, DAY0_US + 10 * SEC, 5))
        .unwrap();
    sink.send(vec![gpu("n1", 1, DAY0_US + SEC), gpu("n1", 1, DAY0_US)])
        .unwrap();
    sink.send(vec![gpu("n1", 2, DAY0_US + 2 * SEC), gpu("n1", 2, DAY0_US)])
        .unwrap();
    let nodes: Vec<NodeSample> = [3, 1, 2]
        .iter()
        .map(|s| node_sample("n1", DAY0_US + s * SEC))
        .collect();
    sink.send(nodes).unwrap();
    let steps = vec![
        step("b", 2, DAY0_US),
        step("a", 7, DAY0_US),
        step("b", 1, DAY0_US),
        step("a", 3, DAY0_US),
    ];
    sink.send(steps).unwrap();
    let stats = sink.finish().unwrap();
    assert_eq!(stats.rows_written, 10 + 2 + 2 + 3 + 4);

    let gpu_file = &stats
        .files
        .iter()
        .find(|f| f.path.to_string_lossy().contains("kind=gpu"))
        .unwrap()
        .path;
    let order: Vec<(u16, i64)> = gpu_rows_in(gpu_file)
        .iter()
        .map(|s| (s.gpu_index, (s.timestamp_us - DAY0_US) / SEC))
        .collect();
    assert_eq!(
        order,
        [
            (0, 10),
            (0, 11),
            (0, 12),
            (0, 13),
            (0, 14),
            (1, 0),
            (1, 1),
            (1, 10),
            (1, 11),
            (1, 12),
            (1, 13),
            (1, 14),
            (2, 0),
            (2, 2)
        ]
    );
    let (nodes, _) = read_all::<NodeSample>(dir.path(), Query::new(TelemetryKind::Node)).unwrap();
    let t: Vec<i64> = nodes
        .iter()
        .map(|n| (n.timestamp_us - DAY0_US) / SEC)
        .collect();
    assert_eq!(t, [1, 2, 3]);
    let (steps, _) = read_all::<StepProfile>(dir.path(), Query::new(TelemetryKind::Step)).unwrap();
    let s: Vec<(String, u64)> = steps
        .iter()
        .map(|s| (s.job_id.to_string(), s.step))
        .collect();
    assert_eq!(
        s,
        [
            ("a".into(), 3),
            ("a".into(), 7),
            ("b".into(), 1),
            ("b".into(), 2)
        ]
    );
}

#[test]
fn dropping_the_sink_publishes_what_it_buffered() {
    let dir = tempfile::tempdir().unwrap();
    {
        let sink = TelemetrySink::open(SinkConfig::new(dir.path())).unwrap();
        sink.send(gpu_series(&["n1", "n2"], 2, DAY0_US, 30))
            .unwrap();
        // No finish(): Drop finishes the files.
    }
    let listing = list_files(dir.path()).unwrap();
    assert_eq!(listing.files.len(), 2);
    assert!(listing.ignored.is_empty(), "no temporary file left behind");
    let (rows, report) = read_all::<GpuSample>(dir.path(), Query::new(TelemetryKind::Gpu)).unwrap();
    assert_eq!(rows.len(), 120);
    assert!(report.errors.is_empty());
}

/// The batch intake (`GpuBatch`) and the row intake (`Vec<GpuSample>`) must be the same
/// sink: same validation (broken values nulled, broken identities rejected, both
/// counted), same files, same rows back — including rows out of order, rows of several
/// nodes and days in one message, per-link lists and small row groups.
#[test]
fn gpu_batches_and_rows_write_the_same_files_with_the_same_validation() {
    let mut messages: Vec<Vec<GpuSample>> = Vec::new();
    for t in 0..40 {
        // Two nodes per message; the last ticks cross midnight.
        let ts = DAY0_US + 86_400 * SEC - 20 * SEC + t * SEC;
        let mut m = gpu_series(&["n1", "n2"], 3, ts, 1);
        match t {
            3 => m[0].sm_util_pct = Some(f32::NAN),
            4 => m[1].power_mw = Some(u32::MAX),
            5 => m[2].temperature_c = Some(-3.0),
            6 => m[3].mem_util_pct = Some(140.0),
            7 => m[4].mem_used_bytes = Some(100 << 30),
            8 => m[5].timestamp_us = -1,
            9 => m[0].node = "".into(),
            10 => m[1].gpu_uuid = "".into(),
            11 => m.reverse(), // out of order within the message
            _ => {}
        }
        messages.push(m);
    }
    // A late row for an earlier second.
    messages.push(vec![gpu("n1", 1, DAY0_US + 86_400 * SEC - 30 * SEC)]);

    let write = |dir: &Path, batches: bool| {
        let mut cfg = SinkConfig::new(dir);
        cfg.write.row_group_rows = 50;
        let sink = TelemetrySink::open(cfg).unwrap();
        let mut b = GpuBatchBuilder::new();
        for m in &messages {
            if batches {
                for s in m {
                    b.push_sample(s);
                }
                sink.send(b.take()).unwrap();
            } else {
                sink.send(m.clone()).unwrap();
            }
        }
        sink.finish().unwrap()
    };
    let (a, b) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let rows = write(a.path(), false);
    let batches = write(b.path(), true);
    assert_eq!(batches.validation, rows.validation);
    assert_eq!(batches.validation.rows_rejected, 3);
    assert_eq!(batches.validation.total_nulled(), 5);
    assert_eq!(batches.rows_written, rows.rows_written);
    assert_eq!(
        batches.rows_received,
        batches.rows_written + batches.validation.rows_rejected
    );
    assert_eq!(
        rel(b.path(), &list_files(b.path()).unwrap().files),
        rel(a.path(), &list_files(a.path()).unwrap().files)
    );
    for f in list_files(a.path()).unwrap().files {
        let other = b.path().join(f.path.strip_prefix(a.path()).unwrap());
        assert_eq!(
            gpu_rows_in(&other),
            gpu_rows_in(&f.path),
            "{}",
            f.path.display()
        );
    }
}

#[test]
fn a_batch_with_ids_from_another_builder_rejects_those_rows() {
    let dir = tempfile::tempdir().unwrap();
    let mut other = GpuBatchBuilder::new();
    for i in 0..10 {
        other.intern(&format!("s{i}"));
    }
    let foreign = other.intern("foreign");
    let mut b = GpuBatchBuilder::new();
    let (c, n, u, t) = (
        b.intern("c"),
        b.intern("n1"),
        b.intern("GPU-1"),
        b.intern("H100"),
    );
    b.push(GpuRow::new(DAY0_US, c, n, 0, u, t));
    b.push(GpuRow::new(DAY0_US, c, n, 1, foreign, t));
    let sink = TelemetrySink::open(SinkConfig::new(dir.path())).unwrap();
    sink.send(b.take()).unwrap();
    let stats = sink.finish().unwrap();
    assert_eq!(stats.rows_written, 1);
    assert_eq!(
        stats
            .validation
            .rejected_count(schema::col::GPU_UUID, Issue::Empty),
        1
    );
}

#[test]
fn a_fast_zstd_level_reaches_every_page_and_the_file_records_it() {
    let rows = gpu_series(&["n1"], 8, DAY0_US, 2_000);
    let write = |level: i32| {
        let dir = tempfile::tempdir().unwrap();
        let mut cfg = SinkConfig::new(dir.path());
        cfg.write.zstd_level = level;
        let sink = TelemetrySink::open(cfg).unwrap();
        sink.send(rows.clone()).unwrap();
        assert_eq!(sink.finish().unwrap().rows_written, rows.len() as u64);
        let files = list_files(dir.path()).unwrap().files;
        assert_eq!(files.len(), 1);
        let path = files[0].path.clone();
        (dir, path)
    };
    let (_one_dir, one) = write(1);
    let (_fast_dir, fast) = write(-7);
    assert_eq!(gpu_rows_in(&fast), gpu_rows_in(&one));
    let recorded = |path: &Path| {
        let md = marshal_telemetry::reader::read_metadata(path).unwrap();
        let kv = md.file_metadata().key_value_metadata().unwrap();
        kv.iter()
            .find(|kv| kv.key == marshal_telemetry::schema::META_ZSTD_LEVEL)
            .and_then(|kv| kv.value.clone())
    };
    assert_eq!(recorded(&one).as_deref(), Some("1"));
    assert_eq!(recorded(&fast).as_deref(), Some("-7"));
    // ZSTD's fastest levels give up compression: the level reached the encoders (the
    // column chunks' bytes, not the footer, which records the level too).
    let chunk_bytes = |path: &Path| -> i64 {
        let md = marshal_telemetry::reader::read_metadata(path).unwrap();
        md.row_groups()
            .iter()
            .flat_map(|rg| rg.columns())
            .map(|c| c.compressed_size())
            .sum()
    };
    let (fast_bytes, one_bytes) = (chunk_bytes(&fast), chunk_bytes(&one));
    assert!(fast_bytes > one_bytes, "{fast_bytes} vs {one_bytes}");
}

#[test]
fn zstd_level_zero_or_beyond_zstd_is_refused() {
    for level in [0, 23, i32::MIN] {
        let dir = tempfile::tempdir().unwrap();
        let mut cfg = SinkConfig::new(dir.path());
        cfg.write.zstd_level = level;
        let e = TelemetrySink::open(cfg).err().unwrap().to_string();
        assert!(e.contains(&format!("zstd level {level}")), "{e}");
    }
}

#[test]
fn a_sample_repeating_the_one_before_is_rejected_as_a_duplicate() {
    let dir = tempfile::tempdir().unwrap();
    let sink = TelemetrySink::open(SinkConfig::new(dir.path())).unwrap();
    let series = gpu_series(&["n1"], 2, DAY0_US, 3);
    sink.send(series.clone()).unwrap();
    // The same tick again, row by row (a retried source): each repeats its GPU's last.
    let last_tick: Vec<GpuSample> = series[series.len() - 2..].to_vec();
    sink.send(last_tick.clone()).unwrap();
    sink.flush().unwrap();
    // The previous row is looked for in the open file only: after a flush, the same
    // tick starts a new file and is kept.
    sink.send(last_tick).unwrap();
    // Host rows: the node's previous timestamp.
    sink.send(vec![node_sample("n1", DAY0_US), node_sample("n1", DAY0_US)])
        .unwrap();
    // An older timestamp again is out of order, not a duplicate of the last: kept.
    sink.send(vec![series[0].clone()]).unwrap();
    let stats = sink.finish().unwrap();
    let v = &stats.validation;
    assert_eq!(v.rejected_count("timestamp", Issue::Duplicate), 3, "{v}");
    assert_eq!(v.rows_rejected, 3);
    assert_eq!(stats.rows_written, 6 + 2 + 1 + 1);
    let (rows, _) = read_all::<GpuSample>(dir.path(), Query::new(TelemetryKind::Gpu)).unwrap();
    assert_eq!(rows.len(), 9);
}

#[test]
fn retention_deletes_the_days_past_it_and_keeps_the_rest() {
    let dir = tempfile::tempdir().unwrap();
    let now_us = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_micros() as i64;
    // A previous run's files: a day long past, and today.
    let first = TelemetrySink::open(SinkConfig::new(dir.path())).unwrap();
    first.send(gpu_series(&["n1"], 1, DAY0_US, 10)).unwrap();
    first.send(gpu_series(&["n1"], 1, now_us, 10)).unwrap();
    first.finish().unwrap();
    let today = marshal_telemetry::partition::Date::of_us(now_us);
    assert_eq!(list_files(dir.path()).unwrap().files.len(), 2);

    let mut cfg = SinkConfig::new(dir.path());
    cfg.retention = Some(Duration::from_secs(30 * 86_400));
    let sink = TelemetrySink::open(cfg).unwrap();
    sink.flush().unwrap(); // answered after the sweep the sink starts with
    let stats = sink.stats();
    assert_eq!(stats.pruned_files, 1);
    assert!(stats.pruned_bytes > 0);
    assert!(stats.errors.is_empty(), "{:?}", stats.errors);
    let left = list_files(dir.path()).unwrap();
    assert_eq!(
        rel(dir.path(), &left.files),
        [format!("kind=gpu/date={today}/node=n1/part-000001.parquet")]
    );
    assert!(!dir.path().join("kind=gpu/date=2025-03-14").exists());

    // Rows dated before the horizon are still taken and written (the next sweep, an
    // hour on, deletes them); the deleted partition's numbering starts again.
    sink.send(gpu_series(&["n1"], 1, DAY0_US, 10)).unwrap();
    let stats = sink.finish().unwrap();
    assert_eq!(stats.rows_written, 10);
    assert!(
        dir.path()
            .join("kind=gpu/date=2025-03-14/node=n1/part-000001.parquet")
            .exists()
    );
}
