//! [`SplitColumn`] against parquet-rs's own writer as the oracle: the same batches
//! written both ways must read back the same, with the same statistics (NaN, ±0 and
//! unsigned rules included) and the same page index.

use std::fs::File;
use std::sync::Arc;

use arrow_array::cast::AsArray;
use arrow_array::types::{
    ArrowPrimitiveType, Float32Type, Float64Type, Int16Type, Int32Type, Int64Type, UInt32Type,
    UInt64Type,
};
use arrow_array::{
    Array, ArrayRef, Float32Array, Float64Array, Int16Array, Int32Array, Int64Array, RecordBatch,
    UInt32Array, UInt64Array,
};
use arrow_schema::{DataType, Field, Schema, SchemaRef};
use parquet::arrow::{ArrowSchemaConverter, ArrowWriter};
use parquet::basic::{Compression, Encoding, ZstdLevel};
use parquet::file::properties::{EnabledStatistics, WriterProperties};
use parquet::schema::types::ColumnPath;

use super::{Kind, SplitColumn, split_streams};
use crate::chunk::ColumnChunkEncoder;
use crate::test_support::{assert_chunks_match, metadata, xorshift};
use crate::writer::AtomicParquetFile;

const PAGE_ROWS: usize = 50;
const GROUP_ROWS: usize = 300;
const ROWS: usize = 777;
const COLUMNS: [&str; 8] = [
    "util",
    "nan_heavy",
    "step",
    "rate",
    "delta",
    "bias",
    "big",
    "small",
];

/// Batch lengths that cut across pages and row groups.
const UNEVEN: [usize; 4] = [1, 130, 299, 347];

fn whole_pages() -> Vec<usize> {
    let mut lens = vec![PAGE_ROWS; ROWS / PAGE_ROWS];
    lens.push(ROWS % PAGE_ROWS);
    lens
}

fn schema() -> SchemaRef {
    Arc::new(Schema::new(vec![
        Field::new("util", DataType::Float32, true),
        Field::new("nan_heavy", DataType::Float32, true),
        Field::new("step", DataType::Float64, false),
        Field::new("rate", DataType::UInt32, true),
        Field::new("delta", DataType::Int32, true),
        Field::new("bias", DataType::Int64, true),
        Field::new("big", DataType::UInt64, true),
        Field::new("small", DataType::Int16, true),
    ]))
}

fn props() -> WriterProperties {
    let mut b = WriterProperties::builder()
        .set_compression(Compression::ZSTD(ZstdLevel::try_new(1).unwrap()))
        .set_max_row_group_row_count(Some(GROUP_ROWS))
        .set_data_page_row_count_limit(PAGE_ROWS)
        .set_write_batch_size(PAGE_ROWS)
        .set_statistics_enabled(EnabledStatistics::Page);
    for c in COLUMNS {
        b = b
            .set_column_dictionary_enabled(ColumnPath::from(c), false)
            .set_column_encoding(ColumnPath::from(c), Encoding::BYTE_STREAM_SPLIT);
    }
    // One column with only chunk statistics, one with none.
    b.set_column_statistics_enabled(ColumnPath::from("rate"), EnabledStatistics::Chunk)
        .set_column_statistics_enabled(ColumnPath::from("small"), EnabledStatistics::None)
        .build()
}

/// Floats with both NaN signs and payloads, signed zeros and infinities; integers across
/// the signed limits; nulls scattered and in whole pages; `nan_heavy` is nothing but
/// NaN and nulls in the second row group and NaN-only in one page of the first.
fn batches(lens: &[usize]) -> Vec<RecordBatch> {
    let mut next = xorshift(0x05EE_D0FF_10A7);
    let specials32 = [
        f32::NAN,
        f32::from_bits(0xffc0_0001),
        -0.0,
        0.0,
        f32::INFINITY,
        f32::NEG_INFINITY,
        f32::MIN_POSITIVE,
    ];
    let specials64 = [f64::NAN, -0.0, 0.0, f64::NEG_INFINITY, 1e300];
    let mut util = Vec::new();
    let mut nan_heavy = Vec::new();
    let mut step = Vec::new();
    let mut rate = Vec::new();
    let mut delta = Vec::new();
    let mut bias = Vec::new();
    let mut big = Vec::new();
    let mut small = Vec::new();
    for i in 0..ROWS {
        let r = next();
        util.push(match r % 13 {
            0 => None,
            1 | 2 => Some(specials32[(r >> 8) as usize % specials32.len()]),
            _ => Some((r >> 16) as u16 as f32 / 655.36),
        });
        let nan_page = (100..150).contains(&i) || (GROUP_ROWS..2 * GROUP_ROWS).contains(&i);
        nan_heavy.push(if r.is_multiple_of(5) {
            None
        } else if nan_page {
            Some(f32::from_bits(
                0x7fc0_0000 | (r >> 40) as u32 & 0xff | (r as u32 & 1) << 31,
            ))
        } else {
            Some(-((r >> 20) as u8 as f32))
        });
        step.push(match r % 17 {
            0 | 1 => specials64[(r >> 8) as usize % specials64.len()],
            _ => (r >> 11) as f64 / (1u64 << 40) as f64,
        });
        rate.push((!(200..250).contains(&i)).then_some((r >> 3) as u32));
        delta.push((!r.is_multiple_of(7)).then_some((r >> 32) as i32));
        bias.push((!r.is_multiple_of(9)).then_some(r as i64));
        big.push((!r.is_multiple_of(11)).then_some(u64::MAX - (r >> 50)));
        small.push((!r.is_multiple_of(3)).then_some((r >> 48) as i16));
    }
    let mut out = Vec::new();
    let mut at = 0;
    for &len in lens {
        let cols: Vec<ArrayRef> = vec![
            Arc::new(Float32Array::from(util[at..at + len].to_vec())),
            Arc::new(Float32Array::from(nan_heavy[at..at + len].to_vec())),
            Arc::new(Float64Array::from(step[at..at + len].to_vec())),
            Arc::new(UInt32Array::from(rate[at..at + len].to_vec())),
            Arc::new(Int32Array::from(delta[at..at + len].to_vec())),
            Arc::new(Int64Array::from(bias[at..at + len].to_vec())),
            Arc::new(UInt64Array::from(big[at..at + len].to_vec())),
            Arc::new(Int16Array::from(small[at..at + len].to_vec())),
        ];
        out.push(RecordBatch::try_new(schema(), cols).unwrap());
        at += len;
    }
    assert_eq!(at, ROWS);
    out
}

/// (ours, parquet-rs's) file paths.
fn write_both(dir: &std::path::Path) -> (std::path::PathBuf, std::path::PathBuf) {
    let mut ours = AtomicParquetFile::create(dir, "ours.parquet", schema(), props()).unwrap();
    let reference_path = dir.join("reference.parquet");
    let mut reference = ArrowWriter::try_new(
        File::create(&reference_path).unwrap(),
        schema(),
        Some(props()),
    )
    .unwrap();
    for batch in batches(&UNEVEN) {
        ours.write(&batch).unwrap();
    }
    // parquet-rs cuts a page only between its write batches: fed whole pages, it cuts
    // them where the row limit says, as ours does whatever the batches.
    for batch in batches(&whole_pages()) {
        reference.write(&batch).unwrap();
    }
    reference.close().unwrap();
    (ours.commit().unwrap(), reference_path)
}

/// Each row's value as its bits (`None` for null).
fn bits(array: &dyn Array) -> Vec<Option<u64>> {
    fn of<T: ArrowPrimitiveType>(
        array: &dyn Array,
        f: impl Fn(T::Native) -> u64,
    ) -> Vec<Option<u64>> {
        array
            .as_primitive::<T>()
            .iter()
            .map(|v| v.map(&f))
            .collect()
    }
    match array.data_type() {
        DataType::Float32 => of::<Float32Type>(array, |v| u64::from(v.to_bits())),
        DataType::Float64 => of::<Float64Type>(array, f64::to_bits),
        DataType::UInt32 => of::<UInt32Type>(array, u64::from),
        DataType::Int32 => of::<Int32Type>(array, |v| v as u64),
        DataType::Int64 => of::<Int64Type>(array, |v| v as u64),
        DataType::UInt64 => of::<UInt64Type>(array, |v| v),
        DataType::Int16 => of::<Int16Type>(array, |v| v as u64),
        other => panic!("{other}"),
    }
}

fn read(path: &std::path::Path) -> Vec<RecordBatch> {
    crate::test_support::read_batches(path)
}

#[test]
fn values_read_back_bit_for_bit() {
    let dir = tempfile::tempdir().unwrap();
    let (ours, _) = write_both(dir.path());
    let (expected, got) = (batches(&UNEVEN), read(&ours));
    assert_eq!(got.iter().map(RecordBatch::num_rows).sum::<usize>(), ROWS);
    for (c, name) in COLUMNS.iter().enumerate() {
        // Compared as bit patterns, so NaN payloads and -0.0 count.
        let column = |batches: &[RecordBatch]| -> Vec<Option<u64>> {
            batches
                .iter()
                .flat_map(|b| bits(b.column(c).as_ref()))
                .collect()
        };
        assert_eq!(column(&got), column(&expected), "column {name}");
    }
}

#[test]
fn statistics_and_page_index_match_parquet_rs() {
    let dir = tempfile::tempdir().unwrap();
    let (ours, reference) = write_both(dir.path());
    let (ours, reference) = (metadata(&ours), metadata(&reference));
    assert_eq!(ours.num_row_groups(), ROWS.div_ceil(GROUP_ROWS));
    assert_chunks_match(&ours, &reference, &COLUMNS, Encoding::BYTE_STREAM_SPLIT);
    // The NaN-only row group states NaN bounds, as parquet-rs does.
    let Some(parquet::file::statistics::Statistics::Float(s)) =
        ours.row_group(1).column(1).statistics()
    else {
        panic!("float statistics")
    };
    assert!(s.min_opt().unwrap().is_nan() && s.max_opt().unwrap().is_nan());
}

#[test]
fn byte_streams_hold_each_significance_together() {
    let mut out = vec![0xAA];
    split_streams(&[0x0403_0201, 0x0807_0605], 4, &mut out);
    assert_eq!(out, [0xAA, 1, 5, 2, 6, 3, 7, 4, 8]);
    let mut out = Vec::new();
    split_streams(&[0x0807_0605_0403_0201, 0x1817_1615_1413_1211], 8, &mut out);
    assert_eq!(
        out,
        [
            1, 0x11, 2, 0x12, 3, 0x13, 4, 0x14, 5, 0x15, 6, 0x16, 7, 0x17, 8, 0x18
        ]
    );
}

#[test]
fn keys_order_like_total_cmp_and_invert() {
    let mut next = xorshift(0xFACE_F00D);
    for _ in 0..10_000 {
        let (a, b) = (next(), next());
        let (a32, b32) = (f32::from_bits(a as u32), f32::from_bits(b as u32));
        let k = Kind::F32;
        assert_eq!(
            k.key(a & 0xffff_ffff).cmp(&k.key(b & 0xffff_ffff)),
            a32.total_cmp(&b32)
        );
        assert_eq!(k.bits(k.key(a & 0xffff_ffff)), a & 0xffff_ffff);
        let k = Kind::F64;
        assert_eq!(
            k.key(a).cmp(&k.key(b)),
            f64::from_bits(a).total_cmp(&f64::from_bits(b))
        );
        assert_eq!(k.bits(k.key(a)), a);
        let k = Kind::I32 { unsigned: false };
        let (a32, b32) = (a & 0xffff_ffff, b & 0xffff_ffff);
        assert_eq!(
            k.key(a32).cmp(&k.key(b32)),
            (a32 as u32 as i32).cmp(&(b32 as u32 as i32))
        );
        assert_eq!(k.bits(k.key(a32)), a32);
        let k = Kind::I64 { unsigned: false };
        assert_eq!(k.key(a).cmp(&k.key(b)), (a as i64).cmp(&(b as i64)));
        assert_eq!(k.bits(k.key(a)), a);
    }
}

fn column(data_type: DataType, nullable: bool) -> SplitColumn {
    let schema = Schema::new(vec![Field::new("c", data_type.clone(), nullable)]);
    let descr = ArrowSchemaConverter::new().convert(&schema).unwrap();
    SplitColumn::for_leaf(descr.column(0), &data_type, &props_for("c"))
        .unwrap()
        .expect("a split column")
}

fn props_for(name: &str) -> WriterProperties {
    WriterProperties::builder()
        .set_column_dictionary_enabled(ColumnPath::from(name), false)
        .set_column_encoding(ColumnPath::from(name), Encoding::BYTE_STREAM_SPLIT)
        .build()
}

#[test]
fn a_wrong_type_or_a_null_where_none_may_be_is_an_error() {
    let mut floats = column(DataType::Float32, false);
    let err = floats
        .push(&Int32Array::from(vec![1, 2]))
        .expect_err("Int32 into a FLOAT column");
    assert!(err.contains("Int32"), "{err}");
    let err = floats
        .push(&Float32Array::from(vec![Some(1.0), None]))
        .expect_err("a null in a required column");
    assert!(err.contains("non-nullable"), "{err}");
    let mut ints = column(DataType::UInt32, true);
    assert!(ints.push(&Float64Array::from(vec![1.0])).is_err());
    ints.push(&UInt32Array::from(vec![Some(7), None])).unwrap();
    assert_eq!(ints.finish().unwrap().1.rows_written, 2);
}

#[test]
fn other_encodings_and_types_are_left_to_parquet_rs() {
    let schema = Schema::new(vec![Field::new("c", DataType::Float32, true)]);
    let descr = ArrowSchemaConverter::new().convert(&schema).unwrap();
    let plain = WriterProperties::builder()
        .set_column_encoding(ColumnPath::from("c"), Encoding::PLAIN)
        .set_column_dictionary_enabled(ColumnPath::from("c"), false)
        .build();
    assert!(
        SplitColumn::for_leaf(descr.column(0), &DataType::Float32, &plain)
            .unwrap()
            .is_none()
    );
    let dictionary = WriterProperties::builder()
        .set_column_encoding(ColumnPath::from("c"), Encoding::BYTE_STREAM_SPLIT)
        .build();
    assert!(
        SplitColumn::for_leaf(descr.column(0), &DataType::Float32, &dictionary)
            .unwrap()
            .is_none()
    );
    assert!(
        SplitColumn::for_leaf(descr.column(0), &DataType::Float16, &props_for("c"))
            .unwrap()
            .is_none()
    );
}
