//! Files written through [`BoolColumn`] read back with parquet-rs's own reader: values,
//! nulls, statistics and the page index, pages of one value, of both and of nulls only.

use std::sync::Arc;

use arrow_array::cast::AsArray;
use arrow_array::{ArrayRef, BooleanArray, RecordBatch};
use arrow_schema::{DataType, Field, Schema, SchemaRef};
use parquet::basic::{Compression, Encoding, ZstdLevel};
use parquet::file::page_index::column_index::ColumnIndexMetaData;
use parquet::file::properties::{EnabledStatistics, WriterProperties, WriterVersion};
use parquet::file::statistics::Statistics;
use parquet::schema::types::ColumnPath;

use super::*;
use crate::test_support::xorshift;
use crate::writer::AtomicParquetFile;

const PAGE_ROWS: usize = 50;
const GROUP_ROWS: usize = 300;
const ROWS: usize = 777;

fn schema() -> SchemaRef {
    Arc::new(Schema::new(vec![
        Field::new("mig", DataType::Boolean, true),
        Field::new("flag", DataType::Boolean, false),
    ]))
}

fn props(version: WriterVersion) -> WriterProperties {
    WriterProperties::builder()
        .set_writer_version(version)
        .set_compression(Compression::ZSTD(ZstdLevel::try_new(1).unwrap()))
        .set_max_row_group_row_count(Some(GROUP_ROWS))
        .set_data_page_row_count_limit(PAGE_ROWS)
        .set_statistics_enabled(EnabledStatistics::Chunk)
        .set_column_statistics_enabled(ColumnPath::from("flag"), EnabledStatistics::Page)
        .build()
}

/// `mig`: a page of nulls, then a long run of `false`, a flip to `true`, and a stretch of
/// scattered nulls; `flag`: noise, then long runs.
fn rows() -> (Vec<Option<bool>>, Vec<bool>) {
    let mut next = xorshift(0x0BAD_5EED_1234_5678);
    let mig = (0..ROWS)
        .map(|i| {
            if i < PAGE_ROWS {
                None
            } else if i < 400 {
                Some(false)
            } else if i < 600 {
                Some(true)
            } else {
                (!next().is_multiple_of(3)).then(|| next().is_multiple_of(2))
            }
        })
        .collect();
    let flag = (0..ROWS)
        .map(|i| {
            if i < 350 {
                next() % 2 == 1
            } else {
                i % 200 < 120
            }
        })
        .collect();
    (mig, flag)
}

fn write(dir: &std::path::Path) -> std::path::PathBuf {
    let (mig, flag) = rows();
    let mut file = AtomicParquetFile::create(
        dir,
        "b.parquet",
        schema(),
        props(WriterVersion::PARQUET_2_0),
    )
    .unwrap();
    let mut at = 0;
    for len in [1, 130, 299, 347] {
        let cols: Vec<ArrayRef> = vec![
            Arc::new(BooleanArray::from(mig[at..at + len].to_vec())),
            Arc::new(BooleanArray::from(flag[at..at + len].to_vec())),
        ];
        file.write(&RecordBatch::try_new(schema(), cols).unwrap())
            .unwrap();
        at += len;
    }
    file.commit().unwrap()
}

#[test]
fn booleans_and_nulls_read_back_with_parquet_rs() {
    let dir = tempfile::tempdir().unwrap();
    let path = write(dir.path());
    let reader = crate::test_support::read_batches(&path);
    let (mut mig, mut flag) = (vec![], vec![]);
    for batch in reader {
        mig.extend(batch.column(0).as_boolean().iter());
        flag.extend(batch.column(1).as_boolean().iter().map(Option::unwrap));
    }
    assert_eq!((mig, flag), rows());
}

#[test]
fn statistics_and_the_page_index_hold_each_group_and_page() {
    let dir = tempfile::tempdir().unwrap();
    let path = write(dir.path());
    let (mig, flag) = rows();
    let meta = crate::test_support::metadata(&path);
    assert_eq!(meta.num_row_groups(), ROWS.div_ceil(GROUP_ROWS));
    for g in 0..meta.num_row_groups() {
        let rows = g * GROUP_ROWS..((g + 1) * GROUP_ROWS).min(ROWS);
        let rg = meta.row_group(g);
        let present: Vec<bool> = mig[rows.clone()].iter().flatten().copied().collect();
        let chunk = rg.column(0);
        assert!(chunk.encodings().any(|e| e == Encoding::RLE));
        let Some(Statistics::Boolean(s)) = chunk.statistics() else {
            panic!("boolean stats")
        };
        assert_eq!(
            s.min_opt().copied(),
            present.iter().min().copied(),
            "group {g}"
        );
        assert_eq!(
            s.max_opt().copied(),
            present.iter().max().copied(),
            "group {g}"
        );
        assert_eq!(
            s.null_count_opt(),
            Some((rows.len() - present.len()) as u64)
        );

        let page_index = meta.page_index_for_row_group(g);
        let Some(ColumnIndexMetaData::BOOLEAN(index)) = page_index.column_index(1) else {
            panic!("boolean column index")
        };
        let pages: Vec<_> = flag[rows.clone()].chunks(PAGE_ROWS).collect();
        assert_eq!(page_index.page_locations(1).unwrap().len(), pages.len());
        for (p, page) in pages.iter().enumerate() {
            assert_eq!(index.min_value(p).copied(), page.iter().min().copied());
            assert_eq!(index.max_value(p).copied(), page.iter().max().copied());
            assert_eq!(index.null_count(p), Some(0));
        }
    }
}

#[test]
fn a_page_is_its_runs_behind_a_length() {
    // 100 × false then 100 × true: two RLE runs (header 200 = 100 << 1, then the value).
    let values: Vec<bool> = (0..200).map(|i| i >= 100).collect();
    let (bytes, range) = encode_page(&values);
    assert_eq!(bytes, [6, 0, 0, 0, 0xC8, 0x01, 0, 0xC8, 0x01, 1]);
    assert_eq!(range, Some((false, true)));
    assert_eq!(encode_page(&[true; 40]).1, Some((true, true)));
    let (empty, none) = encode_page(&[]);
    assert_eq!((empty, none), (vec![0, 0, 0, 0], None));
}

#[test]
fn only_plain_version_2_boolean_leaves_are_taken() {
    let (v2, v1) = (
        props(WriterVersion::PARQUET_2_0),
        props(WriterVersion::PARQUET_1_0),
    );
    let descr = |schema: &SchemaRef| {
        parquet::arrow::ArrowSchemaConverter::new()
            .convert(schema)
            .unwrap()
            .column(0)
    };
    let booleans = descr(&schema());
    assert!(
        BoolColumn::for_leaf(booleans.clone(), &DataType::Boolean, &v2)
            .unwrap()
            .is_some()
    );
    // Format version 1 asks for PLAIN booleans, which parquet-rs writes.
    assert!(
        BoolColumn::for_leaf(booleans.clone(), &DataType::Boolean, &v1)
            .unwrap()
            .is_none()
    );
    let plain = WriterProperties::builder()
        .set_writer_version(WriterVersion::PARQUET_2_0)
        .set_encoding(Encoding::PLAIN)
        .build();
    assert!(
        BoolColumn::for_leaf(booleans, &DataType::Boolean, &plain)
            .unwrap()
            .is_none()
    );
    let ints = descr(&Arc::new(Schema::new(vec![Field::new(
        "n",
        DataType::Int32,
        true,
    )])));
    assert!(
        BoolColumn::for_leaf(ints, &DataType::Int32, &v2)
            .unwrap()
            .is_none()
    );
}

#[test]
fn arrays_of_another_type_or_nulls_in_a_required_column_are_errors() {
    let descr = |nullable: bool| {
        let schema = Schema::new(vec![Field::new("b", DataType::Boolean, nullable)]);
        parquet::arrow::ArrowSchemaConverter::new()
            .convert(&schema)
            .unwrap()
            .column(0)
    };
    let v2 = props(WriterVersion::PARQUET_2_0);
    let mut required = BoolColumn::for_leaf(descr(false), &DataType::Boolean, &v2)
        .unwrap()
        .unwrap();
    let ints = arrow_array::Int32Array::from(vec![1, 2]);
    let e = required.push(&ints).unwrap_err();
    assert!(e.contains("is not a boolean type"), "{e}");
    let e = required
        .push(&BooleanArray::from(vec![Some(true), None]))
        .unwrap_err();
    assert!(e.contains("nulls in a non-nullable column"), "{e}");
    // Nothing was buffered by the refused batches.
    required.push(&BooleanArray::from(vec![true])).unwrap();
    assert_eq!(required.buffer.values, [true]);
}
