//! Every schema survives Parquet unchanged; validation nulls or rejects broken values.

mod common;

use std::path::Path;

use common::*;
use marshal_telemetry::reader::{kv, read_metadata};
use marshal_telemetry::schema::{META_KIND, META_SCHEMA_VERSION, col};
use marshal_telemetry::*;

fn write_all(dir: &Path, rows: impl Into<Records>) -> SinkStats {
    let sink = TelemetrySink::open(SinkConfig::new(dir)).unwrap();
    sink.send(rows).unwrap();
    sink.finish().unwrap()
}

#[test]
fn gpu_samples_round_trip_through_parquet() {
    let dir = tempfile::tempdir().unwrap();
    let mut rows = gpu_series(&["n1", "n2"], 4, DAY0_US, 50);
    // A row with every nullable field null.
    rows.push(GpuSample {
        timestamp_us: DAY0_US + 7,
        cluster: "c1".into(),
        node: "n1".into(),
        gpu_index: 9,
        gpu_uuid: "GPU-bare".into(),
        gpu_type: "T4".into(),
        ..Default::default()
    });
    let stats = write_all(dir.path(), rows.clone());
    assert_eq!(stats.rows_written, rows.len() as u64);
    assert!(stats.validation.is_clean(), "{:?}", stats.validation);

    let (mut back, report) =
        read_all::<GpuSample>(dir.path(), Query::new(TelemetryKind::Gpu)).unwrap();
    assert!(report.errors.is_empty(), "{:?}", report.errors);
    back.sort_by_key(gpu_key);
    rows.sort_by_key(gpu_key);
    assert_eq!(back, rows);
}

#[test]
fn node_samples_round_trip_through_parquet() {
    let dir = tempfile::tempdir().unwrap();
    let mut rows: Vec<NodeSample> = (0..100)
        .map(|i| node_sample("n1", DAY0_US + i * SEC))
        .collect();
    rows[3].net_ports = None;
    rows[4].net_ports = Some(vec![]);
    rows[5].cpu_util_pct = None;
    rows[6].host_mem_total_bytes = None;
    let stats = write_all(dir.path(), rows.clone());
    assert_eq!(stats.rows_written, 100);
    let (back, report) =
        read_all::<NodeSample>(dir.path(), Query::new(TelemetryKind::Node)).unwrap();
    assert!(report.errors.is_empty());
    assert_eq!(back, rows, "node rows are written in time order");
}

#[test]
fn step_profiles_round_trip_through_parquet() {
    let dir = tempfile::tempdir().unwrap();
    let mut rows: Vec<StepProfile> = (0..30)
        .map(|i| {
            step(
                if i % 2 == 0 { "job-a" } else { "job-b" },
                i,
                DAY0_US + i as i64 * SEC,
            )
        })
        .collect();
    rows[1].phase = None;
    rows[2].peak_mem_bytes = None;
    rows[3].phase = Some(MemPhase::Checkpoint);
    let stats = write_all(dir.path(), rows.clone());
    assert_eq!(stats.rows_written, 30);
    let (mut back, _) =
        read_all::<StepProfile>(dir.path(), Query::new(TelemetryKind::Step)).unwrap();
    let key = |s: &StepProfile| (s.job_id.to_string(), s.step);
    back.sort_by_key(key);
    rows.sort_by_key(key);
    assert_eq!(back, rows);
    // Step files are partitioned by date only.
    let listing = list_files(dir.path()).unwrap();
    assert_eq!(listing.files.len(), 1);
    assert!(
        listing.files[0]
            .path
            .ends_with("kind=step/date=2025-03-14/part-000001.parquet")
    );
}

#[test]
fn files_carry_schema_version_and_kind_metadata() {
    let dir = tempfile::tempdir().unwrap();
    write_all(dir.path(), gpu_series(&["n1"], 1, DAY0_US, 3));
    let listing = list_files(dir.path()).unwrap();
    let md = read_metadata(&listing.files[0].path).unwrap();
    assert_eq!(
        kv(&md, META_SCHEMA_VERSION),
        Some(SCHEMA_VERSION.to_string().as_str())
    );
    assert_eq!(kv(&md, META_KIND), Some("gpu"));
}

#[test]
fn record_batch_conversion_without_parquet() {
    let rows = gpu_series(&["n1"], 2, DAY0_US, 5);
    let mut report = ValidationReport::default();
    let batch = GpuSample::to_batch(&rows, &mut report).unwrap();
    assert_eq!(batch.num_rows(), 10);
    assert_eq!(batch.schema(), GpuSample::schema());
    assert_eq!(GpuSample::from_batch(&batch).unwrap(), rows);
    // A batch lacking a column is a clear error, not a panic.
    let projected = batch.project(&[0, 1]).unwrap();
    let err = GpuSample::from_batch(&projected).unwrap_err().to_string();
    assert!(err.contains("missing column"), "{err}");
}

#[test]
fn a_null_in_a_required_column_of_another_tools_file_is_an_error_not_a_zero() {
    use std::sync::Arc;

    use arrow_array::{Array, RecordBatch, TimestampMicrosecondArray, UInt16Array};
    let rows = gpu_series(&["n1"], 2, DAY0_US, 2);
    let batch = GpuSample::to_batch(&rows, &mut ValidationReport::default()).unwrap();
    // Another writer may declare the columns nullable and leave holes in them: Arrow
    // keeps a 0 under a null, which read as a value would date the row to 1970.
    let with_null = |name: &str, array: Arc<dyn Array>| {
        let schema = batch.schema();
        let i = schema.index_of(name).unwrap();
        let mut fields: Vec<_> = schema.fields().iter().map(|f| f.as_ref().clone()).collect();
        fields[i] = fields[i].clone().with_nullable(true);
        let mut columns = batch.columns().to_vec();
        columns[i] = array;
        RecordBatch::try_new(Arc::new(arrow_schema::Schema::new(fields)), columns).unwrap()
    };
    let ts =
        TimestampMicrosecondArray::from(vec![Some(DAY0_US), None, Some(DAY0_US), Some(DAY0_US)])
            .with_timezone("UTC");
    let err = GpuSample::from_batch(&with_null(col::TIMESTAMP, Arc::new(ts)))
        .unwrap_err()
        .to_string();
    assert!(err.contains("null in required column timestamp"), "{err}");
    let index = UInt16Array::from(vec![Some(0), Some(1), None, Some(1)]);
    let err = GpuSample::from_batch(&with_null(col::GPU_INDEX, Arc::new(index)))
        .unwrap_err()
        .to_string();
    assert!(err.contains("null in required column gpu_index"), "{err}");
}

/// Items of list columns are not nullable either: a per-link counter or a port's byte
/// count that another writer left null must not read as 0.
#[test]
fn a_null_inside_a_list_of_another_tools_file_is_an_error_not_a_zero() {
    use std::sync::Arc;

    use arrow_array::cast::AsArray;
    use arrow_array::types::UInt64Type;
    use arrow_array::{Array, ArrayRef, ListArray, RecordBatch, StructArray, UInt64Array};
    use arrow_schema::{DataType, Field, Schema};

    // `batch` with column `name` replaced by `array`, whose type may differ in nullability.
    let replace = |batch: &RecordBatch, name: &str, array: ArrayRef| {
        let schema = batch.schema();
        let i = schema.index_of(name).unwrap();
        let mut fields: Vec<_> = schema.fields().iter().map(|f| f.as_ref().clone()).collect();
        fields[i] = fields[i].clone().with_data_type(array.data_type().clone());
        let mut columns = batch.columns().to_vec();
        columns[i] = array;
        RecordBatch::try_new(Arc::new(Schema::new(fields)), columns).unwrap()
    };

    let rows = gpu_series(&["n1"], 2, DAY0_US, 2);
    let batch = GpuSample::to_batch(&rows, &mut ValidationReport::default()).unwrap();
    let links = ListArray::from_iter_primitive::<UInt64Type, _, _>(vec![
        Some(vec![Some(1), Some(2)]),
        Some(vec![Some(3), None]),
        None,
        Some(vec![]),
    ]);
    let err = GpuSample::from_batch(&replace(
        &batch,
        col::NVLINK_TX_PER_LINK_KIB,
        Arc::new(links),
    ))
    .unwrap_err()
    .to_string();
    assert!(
        err.contains("null item in list column nvlink_tx_per_link_kib"),
        "{err}"
    );

    let nodes = vec![node_sample("n1", DAY0_US), node_sample("n2", DAY0_US)];
    let batch = NodeSample::to_batch(&nodes, &mut ValidationReport::default()).unwrap();
    let ports = batch
        .column_by_name(col::NET_PORTS)
        .unwrap()
        .as_list::<i32>();
    let items = ports.values().as_struct();
    let nullable: Vec<Field> = items
        .fields()
        .iter()
        .map(|f| f.as_ref().clone().with_nullable(true))
        .collect();
    let mut columns = items.columns().to_vec();
    let tx = columns[1].as_primitive::<UInt64Type>();
    assert_eq!(items.fields()[1].name(), col::TX_BYTES);
    let holed: UInt64Array = (0..tx.len())
        .map(|j| (j != 2).then(|| tx.value(j)))
        .collect();
    columns[1] = Arc::new(holed);
    let values = StructArray::new(nullable.clone().into(), columns, None);
    let item = Arc::new(Field::new("item", DataType::Struct(nullable.into()), false));
    let holed_ports = ListArray::new(item, ports.offsets().clone(), Arc::new(values), None);
    let err = NodeSample::from_batch(&replace(&batch, col::NET_PORTS, Arc::new(holed_ports)))
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("null tx_bytes in an item of list column net_ports"),
        "{err}"
    );
    // Unchanged, the same batch reads back whole.
    assert_eq!(NodeSample::from_batch(&batch).unwrap(), nodes);
}

#[test]
fn broken_values_are_nulled_or_rows_rejected_and_counted() {
    let dir = tempfile::tempdir().unwrap();
    let base = gpu("n1", 0, DAY0_US + SEC);
    let mut rows = vec![base.clone(); 8];
    for (i, r) in rows.iter_mut().enumerate() {
        r.timestamp_us = DAY0_US + i as i64 * SEC;
        r.gpu_index = i as u16;
    }
    rows[0].sm_util_pct = Some(f32::NAN);
    rows[1].power_mw = Some(20_000_000); // 20 kW: no board draws that
    rows[2].temperature_c = Some(-3.0);
    rows[3].mem_util_pct = Some(140.0);
    rows[4].mem_used_bytes = Some(100 << 30); // more than the 80 GiB installed
    rows[5].timestamp_us = -1; // rejected
    rows[6].node = "".into(); // rejected
    rows[7].sm_util_pct = Some(f32::NEG_INFINITY);
    rows[7].mem_util_pct = Some(-0.1);

    let stats = write_all(dir.path(), rows.clone());
    let v = &stats.validation;
    assert_eq!(v.rows_in, 8);
    assert_eq!(v.rows_rejected, 2);
    assert_eq!(v.rejected_count(col::TIMESTAMP, Issue::Negative), 1);
    assert_eq!(v.rejected_count(col::NODE, Issue::Empty), 1);
    assert_eq!(v.nulled_count(col::SM_UTIL_PCT, Issue::NonFinite), 2);
    assert_eq!(v.nulled_count(col::POWER_MW, Issue::OutOfRange), 1);
    assert_eq!(v.nulled_count(col::TEMPERATURE_C, Issue::Negative), 1);
    assert_eq!(v.nulled_count(col::MEM_UTIL_PCT, Issue::OutOfRange), 1);
    assert_eq!(v.nulled_count(col::MEM_UTIL_PCT, Issue::Negative), 1);
    assert_eq!(v.nulled_count(col::MEM_USED_BYTES, Issue::OutOfRange), 1);
    assert_eq!(v.total_nulled(), 7);
    assert_eq!(stats.rows_written, 6);
    assert_eq!(
        stats.rows_received,
        stats.rows_written + v.rows_rejected + stats.rows_dropped
    );

    let (back, _) = read_all::<GpuSample>(dir.path(), Query::new(TelemetryKind::Gpu)).unwrap();
    let by_gpu = |g: u16| back.iter().find(|s| s.gpu_index == g).unwrap();
    assert_eq!(back.len(), 6);
    assert!(back.iter().all(|s| s.gpu_index != 5 && s.gpu_index != 6));
    assert_eq!(by_gpu(0).sm_util_pct, None);
    assert_eq!(
        by_gpu(0).mem_util_pct,
        base.mem_util_pct,
        "only the broken value is nulled"
    );
    assert_eq!(by_gpu(1).power_mw, None);
    assert_eq!(by_gpu(2).temperature_c, None);
    assert_eq!(by_gpu(3).mem_util_pct, None);
    assert_eq!(by_gpu(4).mem_used_bytes, None);
    assert_eq!(by_gpu(4).mem_total_bytes, Some(80 << 30));
    assert_eq!(
        (by_gpu(7).sm_util_pct, by_gpu(7).mem_util_pct),
        (None, None)
    );
    assert!(
        back.iter()
            .all(|s| s.sm_util_pct.is_none_or(f32::is_finite))
    );
}

#[test]
fn broken_step_times_reject_the_row() {
    let mut rows: Vec<StepProfile> = (0..4).map(|i| step("j", i, DAY0_US)).collect();
    rows[0].step_time_s = f64::NAN;
    rows[1].step_time_s = -1.0;
    rows[2].step_time_s = 0.0;
    let mut report = ValidationReport::default();
    let batch = StepProfile::to_batch(&rows, &mut report).unwrap();
    assert_eq!(batch.num_rows(), 1);
    assert_eq!(report.rejected_count(col::STEP_TIME_S, Issue::NonFinite), 1);
    assert_eq!(report.rejected_count(col::STEP_TIME_S, Issue::Negative), 1);
    assert_eq!(
        report.rejected_count(col::STEP_TIME_S, Issue::OutOfRange),
        1
    );
}
