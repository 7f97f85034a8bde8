//! [`ListColumn`] against parquet-rs's own writer as the oracle: the same lists written
//! both ways must read back the same, with the same levels' consequences (value counts,
//! nulls), statistics and page index.

use std::fs::File;
use std::sync::Arc;

use arrow_array::builder::{Int32Builder, ListBuilder, UInt64Builder};
use arrow_array::cast::AsArray;
use arrow_array::types::{Int32Type, UInt64Type};
use arrow_array::{ArrayRef, Int32Array, RecordBatch};
use arrow_schema::{DataType, Field, Schema, SchemaRef};
use parquet::arrow::ArrowWriter;
use parquet::arrow::arrow_reader::ParquetRecordBatchReaderBuilder;
use parquet::basic::{Compression, Encoding, ZstdLevel};
use parquet::file::properties::{EnabledStatistics, WriterProperties};
use parquet::schema::types::ColumnPath;

use crate::test_support::{assert_chunks_match, metadata, xorshift};
use crate::writer::AtomicParquetFile;

const PAGE_ROWS: usize = 50;
const GROUP_ROWS: usize = 300;
const ROWS: usize = 777;
const UNEVEN: [usize; 4] = [1, 130, 299, 347];
/// Leaf paths, in schema order.
const LEAVES: [&str; 4] = [
    "links.list.item",
    "lanes.list.item",
    "after",
    "fixed.list.item",
];

fn item() -> Arc<Field> {
    Arc::new(Field::new("item", DataType::UInt64, false))
}

fn lane() -> Arc<Field> {
    Arc::new(Field::new("item", DataType::Int32, false))
}

fn schema() -> SchemaRef {
    Arc::new(Schema::new(vec![
        Field::new("links", DataType::List(item()), true),
        Field::new("lanes", DataType::List(lane()), false),
        Field::new("after", DataType::Int32, true),
        Field::new("fixed", DataType::List(item()), true),
    ]))
}

fn props(page_stats: bool) -> WriterProperties {
    let mut b = WriterProperties::builder()
        .set_compression(Compression::ZSTD(ZstdLevel::try_new(1).unwrap()))
        .set_max_row_group_row_count(Some(GROUP_ROWS))
        .set_data_page_row_count_limit(PAGE_ROWS)
        // One level per mini-batch: parquet-rs then cuts pages exactly at the row limit.
        .set_write_batch_size(1)
        .set_statistics_enabled(if page_stats {
            EnabledStatistics::Page
        } else {
            EnabledStatistics::Chunk
        });
    for leaf in LEAVES {
        let path = ColumnPath::new(leaf.split('.').map(String::from).collect());
        b = b
            .set_column_dictionary_enabled(path.clone(), false)
            .set_column_encoding(path, Encoding::DELTA_BINARY_PACKED);
    }
    b.build()
}

/// Per row: the `links` list (null, empty, or mostly 12 counters, some beyond the
/// signed range), the `lanes` list (required, often empty), a flat column, and the
/// `fixed` list (always 12 counters, except a page of null lists: the uniform pages).
type Rows = (
    Vec<Option<Vec<u64>>>,
    Vec<Vec<i32>>,
    Vec<Option<i32>>,
    Vec<Option<Vec<u64>>>,
);

fn rows() -> Rows {
    let mut next = xorshift(0x1157_C0DE);
    let (mut links, mut lanes, mut after) = (Vec::new(), Vec::new(), Vec::new());
    let mut fixed = Vec::new();
    for i in 0..ROWS {
        let r = next();
        // Rows 400..450 are a page of nothing but null lists.
        links.push(match (r % 10, (400..450).contains(&i)) {
            (_, true) | (0, _) => None,
            (1, _) => Some(vec![]),
            (2, _) => Some((0..r % 5).map(|k| k * 1000 + i as u64).collect()),
            _ => Some(
                (0..12)
                    .map(|k| (i as u64) * 12 + k + (r >> 63) * (i64::MAX as u64 - 9000))
                    .collect(),
            ),
        });
        lanes.push((0..(r >> 20) % 4).map(|k| (r >> (8 * k)) as i32).collect());
        after.push((!r.is_multiple_of(6)).then_some(i as i32));
        fixed.push((!(600..650).contains(&i)).then(|| (0..12).map(|k| r >> k).collect()));
    }
    (links, lanes, after, fixed)
}

fn batches(lens: &[usize]) -> Vec<RecordBatch> {
    let (links, lanes, after, fixed) = rows();
    let mut out = Vec::new();
    let mut at = 0;
    for &len in lens {
        let mut l = ListBuilder::new(UInt64Builder::new()).with_field(item());
        for v in &links[at..at + len] {
            l.append_option(v.as_ref().map(|v| v.iter().map(|&x| Some(x))));
        }
        let mut n = ListBuilder::new(Int32Builder::new()).with_field(lane());
        for v in &lanes[at..at + len] {
            n.append_value(v.iter().map(|&x| Some(x)));
        }
        let mut f = ListBuilder::new(UInt64Builder::new()).with_field(item());
        for v in &fixed[at..at + len] {
            f.append_option(v.as_ref().map(|v| v.iter().map(|&x| Some(x))));
        }
        let cols: Vec<ArrayRef> = vec![
            Arc::new(l.finish()),
            Arc::new(n.finish()),
            Arc::new(Int32Array::from(after[at..at + len].to_vec())),
            Arc::new(f.finish()),
        ];
        out.push(RecordBatch::try_new(schema(), cols).unwrap());
        at += len;
    }
    assert_eq!(at, ROWS);
    out
}

fn whole_pages() -> Vec<usize> {
    let mut lens = vec![PAGE_ROWS; ROWS / PAGE_ROWS];
    lens.push(ROWS % PAGE_ROWS);
    lens
}

/// (ours, parquet-rs's) file paths. Our batches cut across pages and row groups; one
/// is sliced from a larger array, so its offsets do not start at zero.
fn write_both(dir: &std::path::Path, page_stats: bool) -> (std::path::PathBuf, std::path::PathBuf) {
    let mut ours =
        AtomicParquetFile::create(dir, "ours.parquet", schema(), props(page_stats)).unwrap();
    let reference_path = dir.join("reference.parquet");
    let mut reference = ArrowWriter::try_new(
        File::create(&reference_path).unwrap(),
        schema(),
        Some(props(page_stats)),
    )
    .unwrap();
    let uneven = batches(&UNEVEN);
    ours.write(&uneven[0]).unwrap();
    ours.write(&uneven[1].slice(0, 30)).unwrap();
    ours.write(&uneven[1].slice(30, 100)).unwrap();
    for batch in &uneven[2..] {
        ours.write(batch).unwrap();
    }
    for batch in batches(&whole_pages()) {
        reference.write(&batch).unwrap();
    }
    reference.close().unwrap();
    (ours.commit().unwrap(), reference_path)
}

#[test]
fn lists_read_back_with_parquet_rs() {
    let dir = tempfile::tempdir().unwrap();
    let (ours, _) = write_both(dir.path(), true);
    let reader = crate::test_support::read_batches(&ours);
    let (mut links, mut lanes, mut after) = (Vec::new(), Vec::new(), Vec::new());
    let mut fixed = Vec::new();
    for batch in reader {
        assert_eq!(batch.schema().fields(), schema().fields());
        for list in batch.column(0).as_list::<i32>().iter() {
            links.push(list.map(|l| l.as_primitive::<UInt64Type>().values().to_vec()));
        }
        for list in batch.column(1).as_list::<i32>().iter() {
            lanes.push(list.unwrap().as_primitive::<Int32Type>().values().to_vec());
        }
        after.extend(batch.column(2).as_primitive::<Int32Type>().iter());
        for list in batch.column(3).as_list::<i32>().iter() {
            fixed.push(list.map(|l| l.as_primitive::<UInt64Type>().values().to_vec()));
        }
    }
    assert_eq!((links, lanes, after, fixed), rows());
}

#[test]
fn statistics_and_page_index_match_parquet_rs() {
    for page_stats in [true, false] {
        let dir = tempfile::tempdir().unwrap();
        let (ours, reference) = write_both(dir.path(), page_stats);
        let (ours, reference) = (metadata(&ours), metadata(&reference));
        assert_eq!(ours.num_row_groups(), ROWS.div_ceil(GROUP_ROWS));
        assert_chunks_match(&ours, &reference, &LEAVES, Encoding::DELTA_BINARY_PACKED);
    }
}

#[test]
fn a_null_list_where_none_may_be_is_refused_and_the_file_goes_on() {
    let dir = tempfile::tempdir().unwrap();
    let mut file =
        AtomicParquetFile::create(dir.path(), "x.parquet", schema(), props(true)).unwrap();
    let mut batch = batches(&[ROWS]).remove(0);
    // A null `lanes` list, which the file's schema forbids (so the batch is built with a
    // nullable field).
    let mut lanes = ListBuilder::new(Int32Builder::new()).with_field(lane());
    lanes.append_null();
    let loose = Arc::new(Schema::new(vec![
        Field::new("links", DataType::List(item()), true),
        Field::new("lanes", DataType::List(lane()), true),
        Field::new("after", DataType::Int32, true),
        Field::new("fixed", DataType::List(item()), true),
    ]));
    let one = batch.slice(0, 1);
    let bad = RecordBatch::try_new(
        loose,
        vec![
            one.column(0).clone(),
            Arc::new(lanes.finish()),
            one.column(2).clone(),
            one.column(3).clone(),
        ],
    )
    .unwrap();
    assert!(file.write(&bad).is_err(), "a null in a required list");
    batch = batch.slice(0, 10);
    file.write(&batch).unwrap();
    assert_eq!(file.rows(), 10);
    let meta = metadata(&file.commit().unwrap());
    let rg = meta.row_group(0);
    assert_eq!(rg.num_rows(), 10);
    for c in 0..LEAVES.len() {
        assert!(rg.column(c).num_values() >= 10, "column {c}");
    }
    // Every column holds exactly the 10 rows (the refused row reached none).
    let read: usize =
        ParquetRecordBatchReaderBuilder::try_new(File::open(dir.path().join("x.parquet")).unwrap())
            .unwrap()
            .build()
            .unwrap()
            .map(|b| b.unwrap().num_rows())
            .sum();
    assert_eq!(read, 10);
}

#[test]
fn another_array_type_or_a_null_list_is_an_error_from_the_column() {
    use crate::chunk::ColumnChunkEncoder;
    use parquet::arrow::ArrowSchemaConverter;

    let descr = ArrowSchemaConverter::new().convert(&schema()).unwrap();
    let column = |leaf: usize, field: usize| {
        let data_type = schema().field(field).data_type().clone();
        super::ListColumn::for_leaf(descr.column(leaf), &data_type, &props(true))
            .unwrap()
            .expect("a list column")
    };
    let err = column(0, 0)
        .push(&Int32Array::from(vec![1]))
        .expect_err("an Int32 array into a list column");
    assert!(err.contains("expected a List"), "{err}");
    let mut lanes = ListBuilder::new(Int32Builder::new()).with_field(lane());
    lanes.append_null();
    let err = column(1, 1)
        .push(&lanes.finish())
        .expect_err("a null list in a required list column");
    assert!(err.contains("null lists"), "{err}");
    // The flat column after the lists is not a list.
    assert!(
        super::ListColumn::for_leaf(descr.column(2), &DataType::Int32, &props(true))
            .unwrap()
            .is_none()
    );
}
