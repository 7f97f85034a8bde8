//! Listing, predicate pushdown, projection, damaged files, summary, compaction, replay.

mod common;

use std::path::{Path, PathBuf};

use common::*;
use marshal_telemetry::schema::col;
use marshal_telemetry::*;

const NODES: [&str; 3] = ["n1", "n2", "n3"];
const GPUS: u16 = 4;
const SECS: i64 = 600;

/// 3 nodes × 4 GPUs × 600 s on two days; one row group per minute and GPU set.
fn dataset(dir: &Path) -> Vec<GpuSample> {
    let mut cfg = SinkConfig::new(dir);
    cfg.write.row_group_rows = GPUS as usize * 60; // one minute of one node per row group
    let sink = TelemetrySink::open(cfg).unwrap();
    let mut all = Vec::new();
    for day in [0, 1] {
        let rows = gpu_series(&NODES, GPUS, DAY0_US + day * 86_400 * SEC, SECS);
        for chunk in rows.chunks(NODES.len() * GPUS as usize) {
            sink.send(chunk.to_vec()).unwrap();
        }
        all.extend(rows);
    }
    let stats = sink.finish().unwrap();
    assert_eq!(stats.rows_written, all.len() as u64);
    all
}

#[test]
fn time_node_and_job_predicates_return_exactly_the_matching_rows_and_prune() {
    let dir = tempfile::tempdir().unwrap();
    let all = dataset(dir.path());
    let (start, end) = (DAY0_US + 130 * SEC, DAY0_US + 250 * SEC); // two minutes of day 0
    let query = Query::new(TelemetryKind::Gpu)
        .time_range(start, end)
        .nodes(["n2"])
        .jobs(["job-1"]);
    let (mut got, report) = read_all::<GpuSample>(dir.path(), query).unwrap();

    let mut expected: Vec<GpuSample> = all
        .into_iter()
        .filter(|s| s.timestamp_us >= start && s.timestamp_us < end)
        .filter(|s| &*s.node == "n2" && s.job_id.as_deref() == Some("job-1"))
        .collect();
    got.sort_by_key(gpu_key);
    expected.sort_by_key(gpu_key);
    assert_eq!(expected.len(), 120 * 2);
    assert_eq!(got, expected);

    assert!(report.errors.is_empty());
    assert_eq!(report.files_listed, 6);
    // Other nodes and the other day are never opened.
    assert_eq!(report.files_pruned_by_partition, 5);
    assert_eq!(report.files_read, 1);
    // 10 row groups (minutes) in the file; minutes 2–4 overlap [130 s, 250 s).
    assert_eq!(report.row_groups_total, 10);
    assert_eq!(report.row_groups_pruned, 7);
    assert_eq!(report.rows_scanned, 3 * 240);
    assert_eq!(report.rows_returned, 240);
}

#[test]
fn statistics_prune_whole_files_inside_a_matching_partition() {
    let dir = tempfile::tempdir().unwrap();
    dataset(dir.path());
    // Day 0 after the data ends: partitions match, statistics do not.
    let q = Query::new(TelemetryKind::Gpu).time_range(DAY0_US + 3600 * SEC, DAY0_US + 7200 * SEC);
    let scan = Scan::new(dir.path(), q).unwrap();
    let report = {
        let mut s = scan;
        assert_eq!(s.by_ref().count(), 0);
        s.into_report()
    };
    assert_eq!(report.files_pruned_by_partition, 3);
    assert_eq!(report.files_pruned_by_stats, 3);
    assert_eq!(report.files_read, 0);
    assert_eq!(report.row_groups_pruned, 30);
    assert_eq!(report.rows_scanned, 0);
}

#[test]
fn projection_reads_only_the_requested_columns() {
    let dir = tempfile::tempdir().unwrap();
    dataset(dir.path());
    let q = Query::new(TelemetryKind::Gpu)
        .columns([col::SM_UTIL_PCT, col::TIMESTAMP])
        .nodes(["n1"])
        .time_range(DAY0_US, DAY0_US + 60 * SEC);
    let batches: Vec<_> = Scan::new(dir.path(), q.clone()).unwrap().collect();
    let rows: usize = batches.iter().map(|b| b.num_rows()).sum();
    assert_eq!(rows, 60 * GPUS as usize);
    for b in &batches {
        let names: Vec<_> = b
            .schema()
            .fields()
            .iter()
            .map(|f| f.name().clone())
            .collect();
        assert_eq!(
            names,
            [col::TIMESTAMP, col::SM_UTIL_PCT],
            "schema order, filter column not added"
        );
    }
    // Typed rows need every column.
    assert!(matches!(
        Scan::new(dir.path(), q).unwrap().rows::<GpuSample>(),
        Err(TelemetryError::InvalidQuery(_))
    ));
    // Unknown columns and impossible filters are refused up front.
    let bad = Query::new(TelemetryKind::Gpu).columns(["no_such_column"]);
    assert!(matches!(
        Scan::new(dir.path(), bad),
        Err(TelemetryError::InvalidQuery(_))
    ));
    let bad = Query::new(TelemetryKind::Step).nodes(["n1"]);
    assert!(matches!(
        Scan::new(dir.path(), bad),
        Err(TelemetryError::InvalidQuery(_))
    ));
}

/// Adds a truncated copy of a good file and a garbage file to `n1`'s day-0 partition.
fn damage(dir: &Path) -> (PathBuf, PathBuf) {
    let part = dir.join("kind=gpu/date=2025-03-14/node=n1");
    let good = std::fs::read(part.join("part-000001.parquet")).unwrap();
    let truncated = part.join("part-000100.parquet");
    std::fs::write(&truncated, &good[..good.len() / 2]).unwrap();
    let garbage = part.join("part-000101.parquet");
    std::fs::write(&garbage, b"this is not parquet at all, not even close.....").unwrap();
    (truncated, garbage)
}

#[test]
fn truncated_and_garbage_files_are_reported_and_skipped() {
    let dir = tempfile::tempdir().unwrap();
    let all = dataset(dir.path());
    let (truncated, garbage) = damage(dir.path());
    let (rows, report) = read_all::<GpuSample>(dir.path(), Query::new(TelemetryKind::Gpu)).unwrap();
    assert_eq!(rows.len(), all.len(), "every good file is still read");
    let bad: Vec<&PathBuf> = report.errors.iter().map(|e| &e.path).collect();
    assert_eq!(bad, [&truncated, &garbage]);
    assert!(report.errors.iter().all(|e| !e.reason.is_empty()));
    assert!(
        report.errors[0].reason.contains("Parquet"),
        "{}",
        report.errors[0].reason
    );
    assert_eq!(report.files_read, 6);
}

#[test]
fn files_from_a_newer_schema_version_are_refused() {
    use marshal_telemetry::writer::writer_properties;
    use parquet::arrow::ArrowWriter;
    use parquet::file::metadata::KeyValue;

    let dir = tempfile::tempdir().unwrap();
    let part = dir.path().join("kind=gpu/date=2025-03-14/node=n1");
    std::fs::create_dir_all(&part).unwrap();
    let schema = GpuSample::schema();
    let mut props = writer_properties(
        TelemetryKind::Gpu,
        &schema,
        &[],
        &WriteOptions::default(),
        vec![],
    )
    .unwrap();
    // Overwrite the version key.
    props = props
        .into_builder()
        .set_key_value_metadata(Some(vec![
            KeyValue::new("marshal.telemetry.schema_version".into(), "999".to_string()),
            KeyValue::new("marshal.telemetry.kind".into(), "gpu".to_string()),
        ]))
        .build();
    let f = std::fs::File::create(part.join("part-000001.parquet")).unwrap();
    let mut w = ArrowWriter::try_new(f, schema, Some(props)).unwrap();
    let mut report = ValidationReport::default();
    w.write(&GpuSample::to_batch(&gpu_series(&["n1"], 1, DAY0_US, 3), &mut report).unwrap())
        .unwrap();
    w.close().unwrap();

    let (rows, report) = read_all::<GpuSample>(dir.path(), Query::new(TelemetryKind::Gpu)).unwrap();
    assert!(rows.is_empty());
    assert_eq!(report.errors.len(), 1);
    assert!(
        report.errors[0].reason.contains("schema version"),
        "{}",
        report.errors[0].reason
    );
}

/// Writes `batch` to the file `path` (its directory created) as a file of `kind` claiming
/// schema `version`, with the sink's writer settings.
fn write_batch(
    path: &std::path::Path,
    kind: TelemetryKind,
    version: &str,
    batch: &arrow_array::RecordBatch,
) {
    write_batch_compressed(path, kind, version, batch, None);
}

/// [`write_batch`] with every column compressed by `compression` where given.
fn write_batch_compressed(
    path: &std::path::Path,
    kind: TelemetryKind,
    version: &str,
    batch: &arrow_array::RecordBatch,
    compression: Option<parquet::basic::Compression>,
) {
    use marshal_telemetry::writer::writer_properties;
    use parquet::arrow::ArrowWriter;
    use parquet::file::metadata::KeyValue;

    std::fs::create_dir_all(path.parent().unwrap()).unwrap();
    let props = writer_properties(kind, &batch.schema(), &[], &WriteOptions::default(), vec![])
        .unwrap()
        .into_builder()
        .set_key_value_metadata(Some(vec![
            KeyValue::new(
                "marshal.telemetry.schema_version".into(),
                version.to_string(),
            ),
            KeyValue::new("marshal.telemetry.kind".into(), kind.to_string()),
        ]));
    let props = match compression {
        Some(c) => props.set_compression(c),
        None => props,
    }
    .build();
    let f = std::fs::File::create(path).unwrap();
    let mut w = ArrowWriter::try_new(f, batch.schema(), Some(props)).unwrap();
    w.write(batch).unwrap();
    w.close().unwrap();
}

/// Writes `rows` as a file of `kind` claiming schema `version`, under `part`.
fn write_with_version<R: Record>(
    part: &std::path::Path,
    kind: TelemetryKind,
    version: &str,
    rows: &[R],
) {
    let batch = R::to_batch(rows, &mut ValidationReport::default()).unwrap();
    write_batch(&part.join("part-000001.parquet"), kind, version, &batch);
}

/// `rows` as a GPU batch, with the columns named in `replace` swapped for the arrays given
/// (of any type) and the columns in `append` added: a file as another tool might write it.
fn foreign_gpu_batch(
    rows: &[GpuSample],
    replace: &[(&str, arrow_array::ArrayRef)],
    append: &[(&str, arrow_array::ArrayRef)],
) -> arrow_array::RecordBatch {
    use std::sync::Arc;
    let batch = GpuSample::to_batch(rows, &mut ValidationReport::default()).unwrap();
    let mut columns = batch.columns().to_vec();
    let mut fields: Vec<_> = batch.schema().fields().iter().cloned().collect();
    for (name, array) in replace {
        let i = batch.schema().index_of(name).unwrap();
        columns[i] = array.clone();
        fields[i] = Arc::new(
            fields[i]
                .as_ref()
                .clone()
                .with_data_type(array.data_type().clone()),
        );
    }
    for (name, array) in append {
        columns.push(array.clone());
        fields.push(Arc::new(arrow_schema::Field::new(
            *name,
            array.data_type().clone(),
            true,
        )));
    }
    let schema = Arc::new(arrow_schema::Schema::new(fields));
    arrow_array::RecordBatch::try_new(schema, columns).unwrap()
}

/// A GPU file as another tool might write it: `rows` with some columns overwritten by
/// values (or types) the sink would not have written.
fn write_unvalidated_gpu_file(
    part: &std::path::Path,
    rows: &[GpuSample],
    overwrite: &[(&str, arrow_array::ArrayRef)],
) {
    write_batch(
        &part.join("part-000001.parquet"),
        TelemetryKind::Gpu,
        &SCHEMA_VERSION.to_string(),
        &foreign_gpu_batch(rows, overwrite, &[]),
    );
}

/// Writes `rows` through a sink of its own into `dir`.
fn record<R>(dir: &std::path::Path, rows: Vec<R>)
where
    Vec<R>: Into<Records>,
{
    let sink = TelemetrySink::open(SinkConfig::new(dir)).unwrap();
    sink.send(rows).unwrap();
    sink.finish().unwrap();
}

/// pyarrow, DuckDB and Spark compress with Snappy unless told otherwise; other tools
/// pick LZ4 or gzip. Files from any of them read like the sink's own.
#[test]
fn files_other_tools_compressed_with_snappy_lz4_or_gzip_are_read() {
    use parquet::basic::{Compression, GzipLevel};

    let dir = tempfile::tempdir().unwrap();
    let rows = gpu_series(&["n1"], 2, DAY0_US, 5);
    let batch = GpuSample::to_batch(&rows, &mut ValidationReport::default()).unwrap();
    let part = dir.path().join("kind=gpu/date=2025-03-14/node=n1");
    let codecs = [
        Compression::SNAPPY,
        Compression::LZ4_RAW,
        Compression::GZIP(GzipLevel::default()),
    ];
    for (i, codec) in codecs.into_iter().enumerate() {
        let path = part.join(format!("part-00000{}.parquet", i + 1));
        write_batch_compressed(
            &path,
            TelemetryKind::Gpu,
            &SCHEMA_VERSION.to_string(),
            &batch,
            Some(codec),
        );
        let file = std::fs::File::open(&path).unwrap();
        let meta = parquet::file::reader::FileReader::metadata(
            &parquet::file::reader::SerializedFileReader::new(file).unwrap(),
        )
        .clone();
        assert_eq!(meta.row_group(0).column(0).compression(), codec);
    }
    let (got, report) = read_all::<GpuSample>(dir.path(), Query::new(TelemetryKind::Gpu)).unwrap();
    assert!(report.errors.is_empty(), "{:?}", report.errors);
    assert_eq!(report.files_read, 3);
    let expected: Vec<GpuSample> = rows.iter().cycle().take(3 * rows.len()).cloned().collect();
    let (mut got, mut expected) = (got, expected);
    got.sort_by_key(gpu_key);
    expected.sort_by_key(gpu_key);
    assert_eq!(got, expected);
}

#[test]
fn summary_leaves_out_and_counts_values_the_sink_would_have_nulled() {
    use arrow_array::{Float32Array, UInt64Array};
    use std::sync::Arc;

    let dir = tempfile::tempdir().unwrap();
    let rows = gpu_series(&["n1"], 1, DAY0_US, 4);
    let sm = Float32Array::from(vec![Some(50.0), Some(f32::NAN), Some(150.0), Some(30.0)]);
    let mu = Float32Array::from(vec![Some(-1.0), Some(20.0), Some(f32::INFINITY), None]);
    let used = UInt64Array::from(vec![Some(10 << 30), Some(90 << 30), None, Some(12 << 30)]);
    write_unvalidated_gpu_file(
        &dir.path().join("kind=gpu/date=2025-03-14/node=n1"),
        &rows,
        &[
            (col::SM_UTIL_PCT, Arc::new(sm)),
            (col::MEM_UTIL_PCT, Arc::new(mu)),
            (col::MEM_USED_BYTES, Arc::new(used)),
        ],
    );
    let s = summarize(dir.path()).unwrap();
    assert_eq!(s.gpus.len(), 1);
    let g = &s.gpus[0];
    assert_eq!(g.rows, 4);
    // NaN and 150 % out of SM; −1 % and ∞ out of memory utilisation; 90 of 80 GiB out.
    assert_eq!(g.invalid_values, 5);
    assert_eq!(g.mean_sm_util_pct, Some(40.0));
    assert_eq!(g.max_sm_util_pct, Some(50.0));
    assert_eq!(g.mean_mem_util_pct, Some(20.0));
    assert_eq!(g.peak_mem_used_bytes, Some(12 << 30));
}

#[test]
fn summary_names_files_of_other_types_instead_of_dropping_them_silently() {
    use arrow_array::{Float64Array, TimestampNanosecondArray};
    use std::sync::Arc;

    let dir = tempfile::tempdir().unwrap();
    let rows = gpu_series(&["n1"], 1, DAY0_US, 4);
    let f64_util = Float64Array::from(vec![Some(50.0); 4]);
    write_unvalidated_gpu_file(
        &dir.path().join("kind=gpu/date=2025-03-14/node=n1"),
        &rows,
        &[(col::SM_UTIL_PCT, Arc::new(f64_util))],
    );
    let ns: Vec<i64> = rows.iter().map(|r| r.timestamp_us * 1000).collect();
    write_unvalidated_gpu_file(
        &dir.path().join("kind=gpu/date=2025-03-14/node=n2"),
        &rows,
        &[(col::TIMESTAMP, Arc::new(TimestampNanosecondArray::from(ns)))],
    );
    let s = summarize(dir.path()).unwrap();
    let reasons: Vec<String> = s
        .errors
        .iter()
        .map(|e| format!("{}: {}", e.path.display(), e.reason))
        .collect();
    assert_eq!(reasons.len(), 2, "{reasons:?}");
    assert!(
        reasons.iter().any(|r| r.contains("node=n1")
            && r.contains("per-GPU figures leave this file out: a column has another type")),
        "{reasons:?}"
    );
    assert!(
        reasons
            .iter()
            .any(|r| r.contains("node=n2") && r.contains("expected microsecond timestamps")),
        "{reasons:?}"
    );
    assert!(s.gpus.is_empty());
    // The nanosecond file is left out of the span rather than stretching it a thousandfold.
    let gpu = &s.kinds[0];
    assert_eq!((gpu.files, gpu.rows), (1, 4));
    assert_eq!(gpu.last_us.unwrap() - gpu.first_us.unwrap(), 3 * SEC);
}

#[test]
fn gpu_files_of_schema_version_1_are_refused_node_files_are_read() {
    let dir = tempfile::tempdir().unwrap();
    write_with_version(
        &dir.path().join("kind=gpu/date=2025-03-14/node=n1"),
        TelemetryKind::Gpu,
        "1",
        &gpu_series(&["n1"], 1, DAY0_US, 3),
    );
    let node = NodeSample {
        timestamp_us: DAY0_US,
        cluster: "c".into(),
        node: "n1".into(),
        cpu_util_pct: Some(12.0),
        ..Default::default()
    };
    write_with_version(
        &dir.path().join("kind=node/date=2025-03-14/node=n1"),
        TelemetryKind::Node,
        "1",
        std::slice::from_ref(&node),
    );

    let (rows, report) = read_all::<GpuSample>(dir.path(), Query::new(TelemetryKind::Gpu)).unwrap();
    assert!(rows.is_empty(), "a version-1 GPU file must not be misread");
    assert_eq!(report.errors.len(), 1);
    let reason = &report.errors[0].reason;
    assert!(
        reason.contains("schema version Some(\"1\")")
            && reason.contains("gpu files of versions 2..=2")
            && reason.contains("re-record"),
        "{reason}"
    );
    let (nodes, report) =
        read_all::<NodeSample>(dir.path(), Query::new(TelemetryKind::Node)).unwrap();
    assert!(report.errors.is_empty(), "{:?}", report.errors);
    assert_eq!(nodes, vec![node]);
}

#[test]
fn summary_reports_counts_span_and_per_gpu_figures() {
    let dir = tempfile::tempdir().unwrap();
    let mut all = dataset(dir.path());
    let sink = TelemetrySink::open(SinkConfig::new(dir.path())).unwrap();
    let steps: Vec<StepProfile> = (0..5)
        .map(|i| step("j", i, DAY0_US + i as i64 * SEC))
        .collect();
    sink.send(steps).unwrap();
    // A memory peak on one GPU.
    let mut peak = gpu("n3", 2, DAY0_US + 86_400 * SEC + 700 * SEC);
    peak.mem_used_bytes = Some(79 << 30);
    peak.sm_util_pct = Some(100.0);
    sink.send(vec![peak.clone()]).unwrap();
    all.push(peak);
    sink.finish().unwrap();
    let (garbage_a, garbage_b) = damage(dir.path());

    let s = summarize(dir.path()).unwrap();
    let gpu_kind = s
        .kinds
        .iter()
        .find(|k| k.kind == TelemetryKind::Gpu)
        .unwrap();
    assert_eq!(gpu_kind.rows, all.len() as u64);
    assert_eq!(gpu_kind.files, 7);
    assert_eq!(gpu_kind.first_us, Some(DAY0_US));
    assert_eq!(gpu_kind.last_us, Some(DAY0_US + 86_400 * SEC + 700 * SEC));
    assert!(
        gpu_kind
            .schema
            .as_ref()
            .unwrap()
            .field_with_name(col::GPU_UUID)
            .is_ok()
    );
    assert_eq!(
        gpu_kind.schema_versions.iter().copied().collect::<Vec<_>>(),
        [SCHEMA_VERSION]
    );
    let step_kind = s
        .kinds
        .iter()
        .find(|k| k.kind == TelemetryKind::Step)
        .unwrap();
    assert_eq!(step_kind.rows, 5);
    let errs: Vec<_> = s.errors.iter().map(|e| e.path.clone()).collect();
    assert_eq!(
        errs,
        [garbage_a, garbage_b],
        "each damaged file is listed once"
    );

    assert_eq!(s.gpus.len(), NODES.len() * GPUS as usize);
    for g in &s.gpus {
        let mine: Vec<&GpuSample> = all
            .iter()
            .filter(|x| *x.node == g.node && *x.gpu_uuid == g.gpu_uuid)
            .collect();
        assert_eq!(g.rows, mine.len() as u64);
        let max_sm = mine
            .iter()
            .filter_map(|x| x.sm_util_pct)
            .fold(0.0f32, f32::max);
        let mean_sm = mine
            .iter()
            .filter_map(|x| x.sm_util_pct)
            .map(f64::from)
            .sum::<f64>()
            / mine.len() as f64;
        assert_eq!(g.max_sm_util_pct, Some(max_sm));
        assert!((g.mean_sm_util_pct.unwrap() - mean_sm).abs() < 1e-9);
        let peak = mine.iter().filter_map(|x| x.mem_used_bytes).max();
        assert_eq!(g.peak_mem_used_bytes, peak);
    }
    let g = s
        .gpus
        .iter()
        .find(|g| g.node == "n3" && g.gpu_index == 2)
        .unwrap();
    assert_eq!(g.peak_mem_used_bytes, Some(79 << 30));
}

#[test]
fn compaction_merges_a_partition_and_keeps_every_row() {
    let dir = tempfile::tempdir().unwrap();
    let mut cfg = SinkConfig::new(dir.path());
    cfg.write.row_group_rows = 50;
    cfg.max_file_bytes = 1; // a file per row group: many small files
    let sink = TelemetrySink::open(cfg).unwrap();
    let rows = gpu_series(&["n1"], 4, DAY0_US, 100);
    for c in rows.chunks(4) {
        sink.send(c.to_vec()).unwrap();
    }
    sink.finish().unwrap();
    let part = dir.path().join("kind=gpu/date=2025-03-14/node=n1");
    let before = list_files(dir.path()).unwrap().files;
    assert_eq!(before.len(), 8);
    let keep_copy = std::fs::read(&before[0].path).unwrap();

    let report = compact_partition(&part, &CompactOptions::default()).unwrap();
    assert_eq!(report.inputs.len(), 8);
    assert_eq!(report.rows, 400);
    let output = report.output.clone().unwrap();
    assert!(output.ends_with("compact-000009.parquet"));
    let after = list_files(dir.path()).unwrap();
    assert_eq!(after.files.len(), 1);
    assert!(
        before.iter().all(|f| !f.path.exists()),
        "inputs removed after the merge"
    );
    let (mut back, rep) =
        read_all::<GpuSample>(dir.path(), Query::new(TelemetryKind::Gpu)).unwrap();
    assert!(rep.errors.is_empty());
    let mut expected = rows.clone();
    back.sort_by_key(gpu_key);
    expected.sort_by_key(gpu_key);
    assert_eq!(back, expected);

    // A crash after the rename left an input behind: readers skip it, compaction removes it.
    std::fs::write(&before[0].path, &keep_copy).unwrap();
    let listing = list_files(dir.path()).unwrap();
    assert_eq!(listing.files.len(), 1);
    assert_eq!(listing.superseded, [before[0].path.clone()]);
    let (back, _) = read_all::<GpuSample>(dir.path(), Query::new(TelemetryKind::Gpu)).unwrap();
    assert_eq!(back.len(), 400, "no duplicates");
    let report = compact_partition(&part, &CompactOptions::default()).unwrap();
    assert_eq!(report.recovered, [before[0].path.clone()]);
    assert!(report.output.is_none());
    assert!(!before[0].path.exists());
}

#[test]
fn compaction_leaves_damaged_files_alone() {
    let dir = tempfile::tempdir().unwrap();
    let all = dataset(dir.path());
    let (truncated, garbage) = damage(dir.path());
    // Give n1's day-0 partition a second good file.
    let sink = TelemetrySink::open(SinkConfig::new(dir.path())).unwrap();
    let extra = gpu_series(&["n1"], GPUS, DAY0_US + 1000 * SEC, 10);
    sink.send(extra.clone()).unwrap();
    sink.finish().unwrap();

    let reports = compact_all(dir.path(), &CompactOptions::default()).unwrap();
    assert_eq!(reports.len(), 1);
    let r = &reports[0];
    assert_eq!(r.inputs.len(), 2);
    assert_eq!(r.rows, (SECS as u64 + 10) * GPUS as u64);
    let skipped: Vec<_> = r.skipped.iter().map(|e| e.path.clone()).collect();
    assert_eq!(skipped, [truncated.clone(), garbage.clone()]);
    assert!(truncated.exists() && garbage.exists());
    let (rows, report) = read_all::<GpuSample>(dir.path(), Query::new(TelemetryKind::Gpu)).unwrap();
    assert_eq!(rows.len(), all.len() + extra.len());
    assert_eq!(report.errors.len(), 2);
}

#[test]
fn compaction_blames_the_file_of_another_kind_even_when_it_sorts_first() {
    let dir = tempfile::tempdir().unwrap();
    record(dir.path(), gpu_series(&["n1"], 2, DAY0_US, 5));
    record(dir.path(), gpu_series(&["n1"], 2, DAY0_US + 100 * SEC, 5));
    let part = dir.path().join("kind=gpu/date=2025-03-14/node=n1");
    let gpu_files = list_files(dir.path()).unwrap().files;
    assert_eq!(gpu_files.len(), 2);

    // A node-kind file copied into the GPU partition, named to sort before the others.
    let other = tempfile::tempdir().unwrap();
    record(other.path(), vec![node_sample("n1", DAY0_US)]);
    let node_file = list_files(other.path()).unwrap().files.remove(0).path;
    let stray = part.join("part-000000.parquet");
    std::fs::copy(&node_file, &stray).unwrap();

    let report = compact_partition(&part, &CompactOptions::default()).unwrap();
    assert_eq!(report.skipped.len(), 1, "{:?}", report.skipped);
    assert_eq!(report.skipped[0].path, stray);
    assert_eq!(
        report.skipped[0].reason,
        "holds node rows, the partition holds gpu"
    );
    assert_eq!(report.inputs.len(), 2);
    assert_eq!(report.rows, 20);
    assert!(stray.exists(), "the stray file is left in place");
}

#[test]
fn compaction_leaves_a_file_with_columns_of_its_own_in_place() {
    use arrow_array::Int32Array;
    use std::sync::Arc;

    let dir = tempfile::tempdir().unwrap();
    let rows = gpu_series(&["n1"], 2, DAY0_US, 5);
    record(dir.path(), rows.clone());
    let part = dir.path().join("kind=gpu/date=2025-03-14/node=n1");
    let good = list_files(dir.path()).unwrap().files.remove(0).path;
    // The same rows again, plus a column of another tool's.
    let zzz = Arc::new(Int32Array::from(vec![7; rows.len()]));
    let stray = part.join("part-000000.parquet");
    write_batch(
        &stray,
        TelemetryKind::Gpu,
        &SCHEMA_VERSION.to_string(),
        &foreign_gpu_batch(&rows, &[], &[("zzz", zzz)]),
    );

    let report = compact_partition(&part, &CompactOptions::default()).unwrap();
    assert_eq!(report.skipped.len(), 1, "{:?}", report.skipped);
    assert_eq!(report.skipped[0].path, stray);
    assert!(
        report.skipped[0]
            .reason
            .contains("column \"zzz\" is not in the gpu schema"),
        "{}",
        report.skipped[0].reason
    );
    assert!(stray.exists() && good.exists(), "nothing merged or removed");
    assert!(report.output.is_none());
}

/// Compaction rewrites rows through the sink's validation; a file whose values it would
/// null (written by another tool) must not come out of the merge altered.
#[test]
fn compaction_leaves_a_file_it_would_alter_in_place() {
    use arrow_array::Float32Array;
    use std::sync::Arc;

    let dir = tempfile::tempdir().unwrap();
    record(dir.path(), gpu_series(&["n1"], 2, DAY0_US, 5));
    record(dir.path(), gpu_series(&["n1"], 2, DAY0_US + 100 * SEC, 5));
    let part = dir.path().join("kind=gpu/date=2025-03-14/node=n1");
    let foreign = gpu_series(&["n1"], 1, DAY0_US + 200 * SEC, 3);
    let sm = Float32Array::from(vec![Some(40.0), Some(150.0), Some(60.0)]);
    let stray = part.join("part-000000.parquet");
    write_batch(
        &stray,
        TelemetryKind::Gpu,
        &SCHEMA_VERSION.to_string(),
        &foreign_gpu_batch(&foreign, &[(col::SM_UTIL_PCT, Arc::new(sm))], &[]),
    );

    let report = compact_partition(&part, &CompactOptions::default()).unwrap();
    assert_eq!(report.skipped.len(), 1, "{:?}", report.skipped);
    assert_eq!(report.skipped[0].path, stray);
    let reason = &report.skipped[0].reason;
    assert!(
        reason.contains("merging would change it")
            && reason.contains("sm_util_pct out of range ×1"),
        "{reason}"
    );
    assert_eq!(report.inputs.len(), 2);
    assert_eq!(report.rows, 20);
    assert!(stray.exists(), "the foreign file is left in place");
    let (rows, rep) = read_all::<GpuSample>(dir.path(), Query::new(TelemetryKind::Gpu)).unwrap();
    assert!(rep.errors.is_empty(), "{:?}", rep.errors);
    assert_eq!(rows.len(), 23);
    let mut sm: Vec<f32> = rows
        .iter()
        .filter(|r| r.timestamp_us >= DAY0_US + 200 * SEC)
        .filter_map(|r| r.sm_util_pct)
        .collect();
    sm.sort_by(f32::total_cmp);
    assert_eq!(
        sm,
        [40.0, 60.0, 150.0],
        "the foreign values read as written"
    );
}

#[test]
fn replay_returns_recorded_samples_in_time_order_up_to_now() {
    let dir = tempfile::tempdir().unwrap();
    let all = dataset(dir.path());
    let mut src = ReplaySource::open(
        dir.path(),
        Query::new(TelemetryKind::Gpu).nodes(["n1", "n3"]),
    )
    .unwrap();
    let src_dyn: &mut dyn Source = &mut src;
    assert!(src_dyn.sample(DAY0_US - 1).unwrap().is_empty());
    let first = src_dyn.sample(DAY0_US).unwrap();
    assert_eq!(first.len(), 2 * GPUS as usize);
    assert!(
        src_dyn.sample(DAY0_US).unwrap().is_empty(),
        "nothing is returned twice"
    );
    let mut got = first;
    let mut now = DAY0_US;
    while now < DAY0_US + 2 * 86_400 * SEC {
        now += 3600 * SEC;
        let batch = src_dyn.sample(now).unwrap();
        assert!(batch.iter().all(|s| s.timestamp_us <= now));
        got.extend(batch);
    }
    assert!(
        got.windows(2)
            .all(|w| w[0].timestamp_us <= w[1].timestamp_us)
    );
    let expected = all.iter().filter(|s| &*s.node != "n2").count();
    assert_eq!(got.len(), expected);
    assert!(src.report().errors.is_empty());
}

#[test]
fn listing_a_missing_directory_or_a_file_says_which() {
    let dir = tempfile::tempdir().unwrap();
    let missing = dir.path().join("nowhere");
    let e = list_files(&missing).unwrap_err().to_string();
    assert!(
        e.contains("nowhere") && e.contains("no such directory"),
        "{e}"
    );
    let file = dir.path().join("a-file");
    std::fs::write(&file, b"x").unwrap();
    let e = list_files(&file).unwrap_err().to_string();
    assert!(e.contains("a-file") && e.contains("not a directory"), "{e}");
}
