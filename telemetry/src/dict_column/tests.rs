//! Files written through [`DictColumn`] read back with parquet-rs's own reader: values,
//! nulls, row-group and page boundaries, statistics and the page index.

use std::fs::File;
use std::sync::Arc;

use arrow_array::Array;
use arrow_array::cast::AsArray;
use arrow_array::types::Int32Type;
use arrow_array::{ArrayRef, DictionaryArray, Int32Array, RecordBatch, StringArray, UInt32Array};
use arrow_schema::{DataType, Field, Schema, SchemaRef};
use parquet::arrow::arrow_reader::{ArrowReaderOptions, ParquetRecordBatchReaderBuilder};
use parquet::basic::{Compression, Encoding, ZstdLevel};
use parquet::file::metadata::PageIndexPolicy;
use parquet::file::page_index::column_index::ColumnIndexMetaData;
use parquet::file::properties::{EnabledStatistics, WriterProperties};
use parquet::file::statistics::Statistics;
use parquet::schema::types::ColumnPath;

use crate::writer::AtomicParquetFile;

const PAGE_ROWS: usize = 7;
const GROUP_ROWS: usize = 20;

fn schema() -> SchemaRef {
    let dict = DataType::Dictionary(Box::new(DataType::Int32), Box::new(DataType::Utf8));
    Arc::new(Schema::new(vec![
        Field::new("seq", DataType::UInt32, false),
        Field::new("s", dict.clone(), false),
        Field::new("n", dict, true),
    ]))
}

fn props(compression: Compression) -> WriterProperties {
    WriterProperties::builder()
        .set_compression(compression)
        .set_max_row_group_row_count(Some(GROUP_ROWS))
        .set_data_page_row_count_limit(PAGE_ROWS)
        .set_column_statistics_enabled(ColumnPath::from("s"), EnabledStatistics::Page)
        .set_column_statistics_enabled(ColumnPath::from("n"), EnabledStatistics::Chunk)
        .build()
}

fn dict(values: &[Option<&str>], keys: Vec<Option<i32>>) -> ArrayRef {
    Arc::new(
        DictionaryArray::<Int32Type>::try_new(
            Int32Array::from(keys),
            Arc::new(StringArray::from(values.to_vec())),
        )
        .unwrap(),
    )
}

/// Three batches with different dictionaries (one with an unused value, one with a
/// null value), runs, alternating values and all-null stretches; and the strings each
/// row should read back as.
#[allow(clippy::type_complexity)]
fn batches() -> (Vec<RecordBatch>, Vec<(Option<String>, Option<String>)>) {
    let mut out = Vec::new();
    let mut expected = Vec::new();
    let mut seq = 0u32;
    let mut push = |s: ArrayRef, n: ArrayRef, out: &mut Vec<RecordBatch>| {
        let rows = s.len() as u32;
        let ids: ArrayRef = Arc::new(UInt32Array::from_iter_values(seq..seq + rows));
        seq += rows;
        out.push(RecordBatch::try_new(schema(), vec![ids, s, n]).unwrap());
    };
    let strings = |a: &ArrayRef| -> Vec<Option<String>> {
        let d = a.as_dictionary::<Int32Type>();
        let v = d.values().as_string::<i32>();
        d.keys()
            .iter()
            .map(|k| k.and_then(|k| v.is_valid(k as usize).then(|| v.value(k as usize).into())))
            .collect()
    };

    // 10 rows: a run of 6 then 4; `n` has a null key and a key to a null value.
    let s = dict(&[Some("gpu-b"), Some("gpu-a"), Some("unused")], {
        let mut k = vec![Some(0); 6];
        k.extend([Some(1); 4]);
        k
    });
    let n = dict(
        &[Some("x"), None],
        vec![
            Some(0),
            None,
            Some(1),
            Some(0),
            Some(0),
            Some(0),
            None,
            Some(0),
            Some(1),
            Some(0),
        ],
    );
    // 15 rows alternating (bit-packed); `n` all null.
    let s2 = dict(
        &[Some("gpu-a"), Some("gpu-c")],
        (0..15).map(|i| Some(i % 2)).collect(),
    );
    let n2 = dict(&[Some("y")], vec![None; 15]);
    // 30 rows of one value (bit width 0 within a row group of its own).
    let s3 = dict(&[Some("gpu-z")], vec![Some(0); 30]);
    let n3 = dict(&[Some("y")], vec![Some(0); 30]);
    for (s, n) in [(s, n), (s2, n2), (s3, n3)] {
        expected.extend(strings(&s).into_iter().zip(strings(&n)));
        push(s, n, &mut out);
    }
    (out, expected)
}

fn write(dir: &std::path::Path, compression: Compression) -> std::path::PathBuf {
    let mut file =
        AtomicParquetFile::create(dir, "t.parquet", schema(), props(compression)).expect("create");
    let (batches, _) = batches();
    for b in &batches {
        file.write(b).expect("write");
    }
    file.commit().expect("commit")
}

#[test]
fn values_nulls_and_row_groups_read_back_with_parquet_rs() {
    for compression in [
        Compression::ZSTD(ZstdLevel::try_new(1).unwrap()),
        Compression::UNCOMPRESSED,
    ] {
        let dir = tempfile::tempdir().unwrap();
        let path = write(dir.path(), compression);
        let (_, expected) = batches();

        let reader = crate::test_support::read_batches(&path);
        let mut got = Vec::new();
        let mut seq = Vec::new();
        for batch in reader {
            assert_eq!(batch.schema().fields(), schema().fields(), "{compression}");
            let col = |i: usize| -> Vec<Option<String>> {
                let d = batch.column(i).as_dictionary::<Int32Type>();
                let v = d.values().as_string::<i32>();
                d.keys()
                    .iter()
                    .map(|k| k.map(|k| v.value(k as usize).to_string()))
                    .collect()
            };
            got.extend(col(1).into_iter().zip(col(2)));
            seq.extend(
                batch
                    .column(0)
                    .as_primitive::<arrow_array::types::UInt32Type>()
                    .values()
                    .iter()
                    .copied(),
            );
        }
        assert_eq!(got, expected, "{compression}");
        assert_eq!(seq, (0..expected.len() as u32).collect::<Vec<_>>());
    }
}

#[test]
fn statistics_and_the_page_index_describe_each_row_group_and_page() {
    let dir = tempfile::tempdir().unwrap();
    let path = write(
        dir.path(),
        Compression::ZSTD(ZstdLevel::try_new(1).unwrap()),
    );
    let (_, expected) = batches();
    let options = ArrowReaderOptions::new().with_page_index_policy(PageIndexPolicy::Required);
    let builder =
        ParquetRecordBatchReaderBuilder::try_new_with_options(File::open(&path).unwrap(), options)
            .unwrap();
    let meta = builder.metadata();
    let groups: Vec<_> = expected.chunks(GROUP_ROWS).collect();
    assert_eq!(meta.num_row_groups(), groups.len());
    for (g, rows) in groups.iter().enumerate() {
        let rg = meta.row_group(g);
        let page_index = meta.page_index_for_row_group(g);
        for (leaf, pick) in [(1, 0usize), (2, 1)] {
            let values: Vec<Option<&str>> = rows
                .iter()
                .map(|r| if pick == 0 { &r.0 } else { &r.1 }.as_deref())
                .collect();
            let chunk = rg.column(leaf);
            assert!(chunk.dictionary_page_offset().is_some());
            assert!(chunk.encodings().any(|e| e == Encoding::RLE_DICTIONARY));
            assert_eq!(chunk.num_values(), rows.len() as i64);
            let Some(Statistics::ByteArray(stats)) = chunk.statistics() else {
                panic!("byte array statistics in row group {g}, leaf {leaf}");
            };
            let present: Vec<&str> = values.iter().flatten().copied().collect();
            let nulls = values.len() - present.len();
            assert_eq!(
                stats.null_count_opt(),
                Some(nulls as u64),
                "group {g} leaf {leaf}"
            );
            assert_eq!(
                stats.min_opt().map(|v| v.as_utf8().unwrap()),
                present.iter().min().copied(),
                "group {g} leaf {leaf}"
            );
            assert_eq!(
                stats.max_opt().map(|v| v.as_utf8().unwrap()),
                present.iter().max().copied()
            );

            let pages = page_index.page_locations(leaf).expect("offset index");
            assert_eq!(pages.len(), rows.len().div_ceil(PAGE_ROWS));
            for (p, page) in pages.iter().enumerate() {
                assert_eq!(page.first_row_index, (p * PAGE_ROWS) as i64);
            }
            match (page_index.column_index(leaf), leaf) {
                (Some(ColumnIndexMetaData::BYTE_ARRAY(index)), 1) => {
                    for (p, page) in values.chunks(PAGE_ROWS).enumerate() {
                        let present: Vec<&str> = page.iter().flatten().copied().collect();
                        assert_eq!(
                            index.min_value(p).map(|v| std::str::from_utf8(v).unwrap()),
                            present.iter().min().copied(),
                            "group {g} page {p}"
                        );
                        assert_eq!(
                            index.max_value(p).map(|v| std::str::from_utf8(v).unwrap()),
                            present.iter().max().copied()
                        );
                        assert_eq!(index.null_count(p), Some(0));
                    }
                }
                (None, 2) => {}
                (other, _) => panic!("leaf {leaf}: unexpected column index {other:?}"),
            }
        }
    }
}

#[test]
fn a_wrong_array_type_is_an_error_not_a_panic() {
    let dir = tempfile::tempdir().unwrap();
    let mut file = AtomicParquetFile::create(
        dir.path(),
        "t.parquet",
        schema(),
        props(Compression::UNCOMPRESSED),
    )
    .unwrap();
    let wrong = RecordBatch::try_new(
        Arc::new(Schema::new(vec![
            Field::new("seq", DataType::UInt32, false),
            Field::new("s", DataType::Utf8, false),
            Field::new("n", DataType::Utf8, true),
        ])),
        vec![
            Arc::new(UInt32Array::from(vec![1])),
            Arc::new(StringArray::from(vec!["a"])),
            Arc::new(StringArray::from(vec![Some("b")])),
        ],
    )
    .unwrap();
    let err = file
        .write(&wrong)
        .expect_err("Utf8 where a dictionary is expected");
    assert!(err.to_string().contains("differs"), "{err}");
    file.abort();
}
