//! Helpers shared by the encoders' tests.

use std::fs::File;
use std::path::Path;
use std::sync::Arc;

use parquet::arrow::arrow_reader::{ArrowReaderOptions, ParquetRecordBatchReaderBuilder};
use parquet::basic::Encoding;
use parquet::file::metadata::{PageIndexPolicy, ParquetMetaData};
use parquet::file::page_index::column_index::ColumnIndexMetaData;
use parquet::file::page_index::offset_index::PageLocation;

/// A seeded xorshift64 stream: deterministic test data without a dependency.
pub(crate) fn xorshift(seed: u64) -> impl FnMut() -> u64 {
    let mut state = seed;
    move || {
        state ^= state << 13;
        state ^= state >> 7;
        state ^= state << 17;
        state
    }
}

/// Reads one ULEB128 value at `*at`, advancing it (the reference decoders' reader).
pub(crate) fn read_uleb128(data: &[u8], at: &mut usize) -> u64 {
    let (mut v, mut shift) = (0u64, 0);
    loop {
        let b = data[*at];
        *at += 1;
        v |= u64::from(b & 0x7f) << shift;
        shift += 7;
        if b & 0x80 == 0 {
            return v;
        }
    }
}

/// A file's metadata with its page index.
/// Every record batch of a Parquet file, read back with parquet-rs.
pub(crate) fn read_batches(path: &Path) -> Vec<arrow_array::RecordBatch> {
    ParquetRecordBatchReaderBuilder::try_new(File::open(path).unwrap())
        .unwrap()
        .build()
        .unwrap()
        .map(Result::unwrap)
        .collect()
}

pub(crate) fn metadata(path: &Path) -> Arc<ParquetMetaData> {
    let options = ArrowReaderOptions::new().with_page_index_policy(PageIndexPolicy::Required);
    ParquetRecordBatchReaderBuilder::try_new_with_options(File::open(path).unwrap(), options)
        .unwrap()
        .metadata()
        .clone()
}

/// A column index page by page (nulls, NaNs, min and max as bits) and its boundary
/// order; not the level histograms, which our chunks leave out (they are optional).
pub(crate) fn describe(index: Option<&ColumnIndexMetaData>) -> Vec<String> {
    use ColumnIndexMetaData::*;
    let Some(index) = index else {
        return vec![];
    };
    let bounds = |p: usize| match index {
        FLOAT(i) => format!(
            "{:?} {:?}",
            i.min_value(p).map(|v| v.to_bits()),
            i.max_value(p).map(|v| v.to_bits())
        ),
        DOUBLE(i) => format!(
            "{:?} {:?}",
            i.min_value(p).map(|v| v.to_bits()),
            i.max_value(p).map(|v| v.to_bits())
        ),
        INT32(i) => format!("{:?} {:?}", i.min_value(p), i.max_value(p)),
        INT64(i) => format!("{:?} {:?}", i.min_value(p), i.max_value(p)),
        other => panic!("{other:?}"),
    };
    (0..index.num_pages() as usize)
        .map(|p| {
            format!(
                "{} {:?} {:?} {}",
                index.is_null_page(p),
                index.null_count(p),
                index.nan_count(p),
                bounds(p)
            )
        })
        .chain([format!("{:?}", index.get_boundary_order())])
        .collect()
}

/// Asserts that our chunks of `columns` (the file's first leaves, in order) and
/// parquet-rs's agree: encoding, value counts, statistics (NaN counts and bounds'
/// bytes included), the column index and the pages' first rows. Level histograms are
/// not compared: our chunks leave them out (they are optional).
pub(crate) fn assert_chunks_match(
    ours: &ParquetMetaData,
    reference: &ParquetMetaData,
    columns: &[&str],
    encoding: Encoding,
) {
    assert_eq!(ours.num_row_groups(), reference.num_row_groups());
    for g in 0..ours.num_row_groups() {
        let (a, b) = (ours.row_group(g), reference.row_group(g));
        for (c, name) in columns.iter().enumerate() {
            let (ca, cb) = (a.column(c), b.column(c));
            let at = format!("row group {g}, column {name}");
            assert!(ca.encodings().any(|e| e == encoding), "{at}");
            assert_eq!(ca.num_values(), cb.num_values(), "{at}");
            match (ca.statistics(), cb.statistics()) {
                (Some(sa), Some(sb)) => {
                    assert_eq!(sa.min_bytes_opt(), sb.min_bytes_opt(), "{at}: min");
                    assert_eq!(sa.max_bytes_opt(), sb.max_bytes_opt(), "{at}: max");
                    assert_eq!(sa.null_count_opt(), sb.null_count_opt(), "{at}: nulls");
                    assert_eq!(sa.nan_count_opt(), sb.nan_count_opt(), "{at}: NaNs");
                    assert_eq!(
                        sa.is_min_max_backwards_compatible(),
                        sb.is_min_max_backwards_compatible(),
                        "{at}"
                    );
                }
                (sa, sb) => assert_eq!(sa.is_some(), sb.is_some(), "{at}: statistics"),
            }
            let (ia, ib) = (
                ours.page_index_for_row_group(g),
                reference.page_index_for_row_group(g),
            );
            assert_eq!(
                describe(ia.column_index(c)),
                describe(ib.column_index(c)),
                "{at}: column index"
            );
            let rows = |locations: &[PageLocation]| {
                locations
                    .iter()
                    .map(|l| l.first_row_index)
                    .collect::<Vec<_>>()
            };
            assert_eq!(
                rows(ia.page_locations(c).unwrap()),
                rows(ib.page_locations(c).unwrap()),
                "{at}: pages"
            );
        }
    }
}
