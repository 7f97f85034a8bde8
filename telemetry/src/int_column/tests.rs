//! Files written through [`IntColumn`] read back with parquet-rs's own reader: values,
//! nulls, unsigned order in statistics and the page index, page and row-group limits.

use std::sync::Arc;

use arrow_array::cast::AsArray;
use arrow_array::types::{TimestampMicrosecondType, UInt16Type, UInt32Type, UInt64Type};
use arrow_array::{
    ArrayRef, RecordBatch, TimestampMicrosecondArray, UInt16Array, UInt32Array, UInt64Array,
};
use arrow_schema::{DataType, Field, Schema, SchemaRef, TimeUnit};
use parquet::basic::{Compression, Encoding, ZstdLevel};
use parquet::file::page_index::column_index::ColumnIndexMetaData;
use parquet::file::properties::{EnabledStatistics, WriterProperties};
use parquet::file::statistics::Statistics;
use parquet::schema::types::ColumnPath;

use crate::test_support::xorshift;
use crate::writer::AtomicParquetFile;

const PAGE_ROWS: usize = 50;
const GROUP_ROWS: usize = 300;
const ROWS: usize = 777;

fn schema() -> SchemaRef {
    Arc::new(Schema::new(vec![
        Field::new(
            "ts",
            DataType::Timestamp(TimeUnit::Microsecond, None),
            false,
        ),
        Field::new("big", DataType::UInt64, true),
        Field::new("mid", DataType::UInt32, true),
        Field::new("small", DataType::UInt16, false),
    ]))
}

fn props() -> WriterProperties {
    let mut b = WriterProperties::builder()
        .set_compression(Compression::ZSTD(ZstdLevel::try_new(1).unwrap()))
        .set_max_row_group_row_count(Some(GROUP_ROWS))
        .set_data_page_row_count_limit(PAGE_ROWS)
        .set_statistics_enabled(EnabledStatistics::Page);
    for c in ["ts", "big", "mid", "small"] {
        b = b
            .set_column_dictionary_enabled(ColumnPath::from(c), false)
            .set_column_encoding(ColumnPath::from(c), Encoding::DELTA_BINARY_PACKED);
    }
    b.build()
}

/// Rows with counters crossing the signed limits, nulls in runs and scattered, and a
/// first page of nothing but nulls.
/// Timestamps, `big`, `mid` and `small` per row.
type Rows = (Vec<i64>, Vec<Option<u64>>, Vec<Option<u32>>, Vec<u16>);

fn rows() -> Rows {
    let mut next = xorshift(0x1234_5678_9ABC_DEF1);
    let mut ts = Vec::new();
    let mut big = Vec::new();
    let mut mid = Vec::new();
    let mut small = Vec::new();
    for i in 0..ROWS {
        ts.push(1_741_910_400_000_000 + i as i64 * 1_000_000 + (next() % 1000) as i64);
        big.push(
            (i >= PAGE_ROWS && !next().is_multiple_of(7))
                .then(|| (i64::MAX as u64 - 300) + i as u64),
        );
        mid.push(
            (i >= PAGE_ROWS && i % 11 != 3)
                .then(|| ((next() % 2) as u32 * (1 << 31)).wrapping_add(i as u32 * 3)),
        );
        small.push((next() % 9) as u16 * 7000);
    }
    (ts, big, mid, small)
}

fn write(dir: &std::path::Path) -> std::path::PathBuf {
    let (ts, big, mid, small) = rows();
    let mut file = AtomicParquetFile::create(dir, "t.parquet", schema(), props()).unwrap();
    // Uneven batches, so pages and row groups cut across them.
    let mut at = 0;
    for len in [1, 130, 299, 347] {
        let cols: Vec<ArrayRef> = vec![
            Arc::new(TimestampMicrosecondArray::from(ts[at..at + len].to_vec())),
            Arc::new(UInt64Array::from(big[at..at + len].to_vec())),
            Arc::new(UInt32Array::from(mid[at..at + len].to_vec())),
            Arc::new(UInt16Array::from(small[at..at + len].to_vec())),
        ];
        file.write(&RecordBatch::try_new(schema(), cols).unwrap())
            .unwrap();
        at += len;
    }
    assert_eq!(at, ROWS);
    file.commit().unwrap()
}

#[test]
fn integers_and_nulls_read_back_with_parquet_rs() {
    let dir = tempfile::tempdir().unwrap();
    let path = write(dir.path());
    let reader = crate::test_support::read_batches(&path);
    let (mut ts, mut big, mut mid, mut small) = (vec![], vec![], vec![], vec![]);
    for batch in reader {
        assert_eq!(batch.schema().fields(), schema().fields());
        ts.extend(
            batch
                .column(0)
                .as_primitive::<TimestampMicrosecondType>()
                .values()
                .iter()
                .copied(),
        );
        big.extend(batch.column(1).as_primitive::<UInt64Type>().iter());
        mid.extend(batch.column(2).as_primitive::<UInt32Type>().iter());
        small.extend(
            batch
                .column(3)
                .as_primitive::<UInt16Type>()
                .values()
                .iter()
                .copied(),
        );
    }
    assert_eq!((ts, big, mid, small), rows());
}

#[test]
fn statistics_and_the_page_index_use_the_unsigned_order() {
    let dir = tempfile::tempdir().unwrap();
    let path = write(dir.path());
    let (_, big, mid, _) = rows();
    let meta = crate::test_support::metadata(&path);
    assert_eq!(meta.num_row_groups(), ROWS.div_ceil(GROUP_ROWS));
    for g in 0..meta.num_row_groups() {
        let rows = g * GROUP_ROWS..((g + 1) * GROUP_ROWS).min(ROWS);
        let rg = meta.row_group(g);
        let page_index = meta.page_index_for_row_group(g);

        let expect_big: Vec<u64> = big[rows.clone()].iter().flatten().copied().collect();
        let chunk = rg.column(1);
        assert!(
            chunk
                .encodings()
                .any(|e| e == Encoding::DELTA_BINARY_PACKED)
        );
        let Some(Statistics::Int64(s)) = chunk.statistics() else {
            panic!("int64 stats")
        };
        assert_eq!(
            s.min_opt().map(|&v| v as u64),
            expect_big.iter().min().copied()
        );
        assert_eq!(
            s.max_opt().map(|&v| v as u64),
            expect_big.iter().max().copied()
        );
        assert_eq!(
            s.null_count_opt(),
            Some((rows.len() - expect_big.len()) as u64)
        );

        let expect_mid: Vec<u32> = mid[rows.clone()].iter().flatten().copied().collect();
        let Some(Statistics::Int32(s)) = rg.column(2).statistics() else {
            panic!("int32 stats")
        };
        assert_eq!(
            s.min_opt().map(|&v| v as u32),
            expect_mid.iter().min().copied()
        );
        assert_eq!(
            s.max_opt().map(|&v| v as u32),
            expect_mid.iter().max().copied()
        );

        let Some(ColumnIndexMetaData::INT32(index)) = page_index.column_index(2) else {
            panic!("int32 column index")
        };
        let pages: Vec<_> = mid[rows.clone()].chunks(PAGE_ROWS).collect();
        assert_eq!(page_index.page_locations(2).unwrap().len(), pages.len());
        for (p, page) in pages.iter().enumerate() {
            let present: Vec<u32> = page.iter().flatten().copied().collect();
            assert_eq!(
                index.is_null_page(p),
                present.is_empty(),
                "group {g} page {p}"
            );
            assert_eq!(
                index.min_value(p).map(|&v| v as u32),
                present.iter().min().copied()
            );
            assert_eq!(
                index.max_value(p).map(|&v| v as u32),
                present.iter().max().copied()
            );
            assert_eq!(
                index.null_count(p),
                Some((page.len() - present.len()) as i64)
            );
        }
    }
}
