//! `BYTE_STREAM_SPLIT` column chunks (floats and noisy integer rates), encoded by the
//! writer itself.
//!
//! Utilisation, temperature, power and PCIe rates are six columns per GPU row. Through
//! parquet-rs's Arrow writer each value is gathered into a temporary vector, compared
//! twice for statistics through a per-value NaN check, and scattered into the byte
//! streams one value at a time, with a fresh ZSTD context per page. Here a batch's values
//! are copied once (as their bit patterns), and at the end of the row group each page is
//! scanned once for its min, max and NaN count and split into its byte streams in one
//! pass. Pages, statistics and the page index go through [`crate::chunk`].
//!
//! **Statistics** follow parquet-rs (and the format's IEEE 754 total order): floats are
//! compared by `total_cmp`, so `-0.0 < +0.0`; NaNs are counted and left out of min and
//! max, unless a chunk holds nothing else, when min and max are its least and greatest
//! NaN; integers are compared in their column's sort order (unsigned for `UInt*`).
//!
//! Which columns: those whose writer properties ask for `BYTE_STREAM_SPLIT` without a
//! dictionary, of a 32- or 64-bit float or integer Arrow type; the rest stay with
//! parquet-rs.

use arrow_array::Array;
use arrow_array::cast::AsArray;
use arrow_array::types::{
    Float32Type, Float64Type, Int8Type, Int16Type, Int32Type, Int64Type, UInt8Type, UInt16Type,
    UInt32Type, UInt64Type,
};
use arrow_schema::DataType;
use bytes::Bytes;
use parquet::basic::{Encoding, SortOrder, Type as PhysicalType};
use parquet::column::writer::ColumnCloseResult;
use parquet::file::properties::{EnabledStatistics, WriterProperties};
use parquet::file::statistics::{Statistics, ValueStatistics};
use parquet::schema::types::ColumnDescPtr;

use crate::chunk::{
    BoundaryTracker, ChunkBuilder, ColumnChunkEncoder, ColumnSettings, DataPage, ValueBuffer,
};

/// The physical type of a column, and the order its statistics use.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Kind {
    F32,
    F64,
    I32 { unsigned: bool },
    I64 { unsigned: bool },
}

const SIGN: u64 = 1 << 63;

impl Kind {
    fn width(self) -> usize {
        match self {
            Kind::F32 | Kind::I32 { .. } => 4,
            Kind::F64 | Kind::I64 { .. } => 8,
        }
    }

    /// A key whose unsigned order is the column's sort order: IEEE 754 total order for
    /// floats (the bits of a negative float flipped below the sign, as `total_cmp` does),
    /// two's complement or unsigned order for integers.
    #[inline(always)]
    fn key(self, bits: u64) -> u64 {
        match self {
            Kind::F32 => {
                let b = bits as u32 as i32;
                let t = b ^ ((((b >> 31) as u32) >> 1) as i32);
                (i64::from(t) as u64) ^ SIGN
            }
            Kind::F64 => {
                let b = bits as i64;
                let t = b ^ ((((b >> 63) as u64) >> 1) as i64);
                (t as u64) ^ SIGN
            }
            Kind::I32 { unsigned: true } | Kind::I64 { unsigned: true } => bits,
            Kind::I32 { unsigned: false } => (i64::from(bits as u32 as i32) as u64) ^ SIGN,
            Kind::I64 { unsigned: false } => bits ^ SIGN,
        }
    }

    /// The bits whose [`Self::key`] is `key`.
    fn bits(self, key: u64) -> u64 {
        match self {
            Kind::F32 => {
                let t = ((key ^ SIGN) as i64) as i32;
                u64::from((t ^ ((((t >> 31) as u32) >> 1) as i32)) as u32)
            }
            Kind::F64 => {
                let t = (key ^ SIGN) as i64;
                (t ^ ((((t >> 63) as u64) >> 1) as i64)) as u64
            }
            Kind::I32 { unsigned: true } | Kind::I64 { unsigned: true } => key,
            Kind::I32 { unsigned: false } => u64::from(((key ^ SIGN) as i64) as i32 as u32),
            Kind::I64 { unsigned: false } => key ^ SIGN,
        }
    }

    #[inline(always)]
    fn is_nan(self, bits: u64) -> bool {
        match self {
            Kind::F32 => f32::from_bits(bits as u32).is_nan(),
            Kind::F64 => f64::from_bits(bits).is_nan(),
            Kind::I32 { .. } | Kind::I64 { .. } => false,
        }
    }

    fn is_float(self) -> bool {
        matches!(self, Kind::F32 | Kind::F64)
    }

    fn plain(self, bits: u64) -> Vec<u8> {
        bits.to_le_bytes()[..self.width()].to_vec()
    }
}

/// The min and max keys of a run of values, NaNs kept apart.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
struct Range {
    /// Min and max key of the values that are not NaN.
    numbers: Option<(u64, u64)>,
    /// Min and max key of the NaNs.
    nans: Option<(u64, u64)>,
    nan_count: usize,
}

fn widen(range: Option<(u64, u64)>, lo: u64, hi: u64) -> Option<(u64, u64)> {
    Some(range.map_or((lo, hi), |(a, b)| (a.min(lo), b.max(hi))))
}

impl Range {
    /// One pass over `values`, monomorphised per kind by the caller's closures.
    #[inline(always)]
    fn scan(values: &[u64], key: impl Fn(u64) -> u64, is_nan: impl Fn(u64) -> bool) -> Self {
        let (mut lo, mut hi) = (u64::MAX, 0);
        let (mut nan_lo, mut nan_hi, mut nan_count) = (u64::MAX, 0, 0);
        for &v in values {
            let k = key(v);
            if is_nan(v) {
                nan_count += 1;
                nan_lo = nan_lo.min(k);
                nan_hi = nan_hi.max(k);
            } else {
                lo = lo.min(k);
                hi = hi.max(k);
            }
        }
        Self {
            numbers: (nan_count < values.len()).then_some((lo, hi)),
            nans: (nan_count > 0).then_some((nan_lo, nan_hi)),
            nan_count,
        }
    }

    fn of(kind: Kind, values: &[u64]) -> Self {
        match kind {
            Kind::F32 => Self::scan(values, |v| Kind::F32.key(v), |v| Kind::F32.is_nan(v)),
            Kind::F64 => Self::scan(values, |v| Kind::F64.key(v), |v| Kind::F64.is_nan(v)),
            Kind::I32 { unsigned: true } | Kind::I64 { unsigned: true } => {
                Self::scan(values, |v| v, |_| false)
            }
            Kind::I32 { unsigned: false } => {
                Self::scan(values, |v| Kind::I32 { unsigned: false }.key(v), |_| false)
            }
            Kind::I64 { unsigned: false } => Self::scan(values, |v| v ^ SIGN, |_| false),
        }
    }

    fn merge(&mut self, other: &Range) {
        if let Some((lo, hi)) = other.numbers {
            self.numbers = widen(self.numbers, lo, hi);
        }
        if let Some((lo, hi)) = other.nans {
            self.nans = widen(self.nans, lo, hi);
        }
        self.nan_count += other.nan_count;
    }

    /// Min and max keys as the statistics state them: the numbers', or, when there are
    /// only NaNs, the NaNs'.
    fn bounds(&self) -> Option<(u64, u64)> {
        self.numbers.or(self.nans)
    }
}

/// Writes `values` (each the low `width` bytes of a `u64`) as `BYTE_STREAM_SPLIT`: byte
/// `k` of every value, then byte `k + 1` of every value, and so on.
fn split_streams(values: &[u64], width: usize, out: &mut Vec<u8>) {
    let n = values.len();
    let start = out.len();
    out.resize(start + n * width, 0);
    let streams = &mut out[start..];
    if width == 4 {
        // Zipped slices, so the loop has no bounds checks (a quarter of its instructions).
        let (s0, rest) = streams.split_at_mut(n);
        let (s1, rest) = rest.split_at_mut(n);
        let (s2, s3) = rest.split_at_mut(n);
        let lanes = s0.iter_mut().zip(s1).zip(s2.iter_mut().zip(s3));
        for (((b0, b1), (b2, b3)), &v) in lanes.zip(values) {
            [*b0, *b1, *b2, *b3] = (v as u32).to_le_bytes();
        }
    } else {
        for (k, stream) in streams.chunks_exact_mut(n.max(1)).enumerate().take(width) {
            for (byte, &v) in stream.iter_mut().zip(values) {
                *byte = (v >> (8 * k)) as u8;
            }
        }
    }
}

/// One `BYTE_STREAM_SPLIT` column of the row group being written.
#[derive(Debug)]
pub(crate) struct SplitColumn {
    settings: ColumnSettings,
    kind: Kind,
    /// The non-null values' bit patterns (of the physical type), zero-extended.
    buffer: ValueBuffer<u64>,
}

/// Whether this module encodes an Arrow column of type `data_type`.
fn supported(data_type: &DataType) -> bool {
    use DataType::*;
    matches!(
        data_type,
        Int8 | Int16 | Int32 | Int64 | UInt8 | UInt16 | UInt32 | UInt64 | Float32 | Float64
    )
}

impl SplitColumn {
    /// A column for the leaf `descr` of Arrow type `data_type`, if the properties ask for
    /// `BYTE_STREAM_SPLIT` without a dictionary and the type is one this module writes;
    /// `None` otherwise.
    pub(crate) fn for_leaf(
        descr: ColumnDescPtr,
        data_type: &DataType,
        props: &WriterProperties,
    ) -> Result<Option<Self>, String> {
        let path = descr.path();
        let unsigned = descr.sort_order() == SortOrder::UNSIGNED;
        let kind = match descr.physical_type() {
            PhysicalType::FLOAT => Kind::F32,
            PhysicalType::DOUBLE => Kind::F64,
            PhysicalType::INT32 => Kind::I32 { unsigned },
            PhysicalType::INT64 => Kind::I64 { unsigned },
            _ => return Ok(None),
        };
        if props.encoding(path) != Some(Encoding::BYTE_STREAM_SPLIT)
            || props.dictionary_enabled(path)
            || !supported(data_type)
        {
            return Ok(None);
        }
        let settings = ColumnSettings::new(descr, props)?;
        Ok(Some(Self {
            buffer: ValueBuffer::new(settings.nullable()),
            settings,
            kind,
        }))
    }

    fn encode(&self) -> parquet::errors::Result<(Bytes, ColumnCloseResult)> {
        let kind = self.kind;
        let with_statistics = self.settings.statistics != EnabledStatistics::None;
        let mut chunk = ChunkBuilder::new(&self.settings);
        let mut boundary = BoundaryTracker::new();
        let mut chunk_range = Range::default();
        let mut nulls = 0u64;
        for page_rows in self.buffer.rows.pages(self.settings.page_rows) {
            let page = &self.buffer.values[page_rows.values.clone()];
            let range = if with_statistics {
                Range::of(kind, page)
            } else {
                Range::default()
            };
            let bounds = range.bounds();
            if let Some((lo, hi)) = bounds {
                boundary.page(lo, hi);
            }
            chunk_range.merge(&range);
            let mut values = Vec::new();
            split_streams(page, kind.width(), &mut values);
            nulls += page_rows.nulls() as u64;
            let min_max =
                bounds.map(|(lo, hi)| (kind.plain(kind.bits(lo)), kind.plain(kind.bits(hi))));
            let encoding = Encoding::BYTE_STREAM_SPLIT;
            chunk.data_page(DataPage {
                nan_count: kind.is_float().then_some(range.nan_count as i64),
                ..DataPage::flat(page_rows, values, encoding, min_max)
            })?;
        }
        let bounds = chunk_range.bounds();
        chunk.finish(
            self.statistics(bounds, nulls, chunk_range.nan_count),
            boundary.order(),
            None,
        )
    }

    fn statistics(&self, bounds: Option<(u64, u64)>, nulls: u64, nans: usize) -> Statistics {
        let kind = self.kind;
        let min = bounds.map(|(lo, _)| kind.bits(lo));
        let max = bounds.map(|(_, hi)| kind.bits(hi));
        let signed = self.settings.descr.sort_order().is_signed();
        // parquet-rs states a NaN count for a float chunk that holds any value.
        let nan_count = (kind.is_float() && bounds.is_some()).then_some(nans as u64);
        fn stats<T>(
            min: Option<T>,
            max: Option<T>,
            nulls: u64,
            nan_count: Option<u64>,
            signed: bool,
        ) -> ValueStatistics<T> {
            ValueStatistics::new(min, max, None, Some(nulls), false)
                .with_nan_count(nan_count)
                .with_backwards_compatible_min_max(signed)
        }
        match kind {
            Kind::F32 => Statistics::Float(stats(
                min.map(|b| f32::from_bits(b as u32)),
                max.map(|b| f32::from_bits(b as u32)),
                nulls,
                nan_count,
                signed,
            )),
            Kind::F64 => Statistics::Double(stats(
                min.map(f64::from_bits),
                max.map(f64::from_bits),
                nulls,
                nan_count,
                signed,
            )),
            Kind::I32 { .. } => Statistics::Int32(stats(
                min.map(|b| b as u32 as i32),
                max.map(|b| b as u32 as i32),
                nulls,
                None,
                signed,
            )),
            Kind::I64 { .. } => Statistics::Int64(stats(
                min.map(|b| b as i64),
                max.map(|b| b as i64),
                nulls,
                None,
                signed,
            )),
        }
    }
}

impl ColumnChunkEncoder for SplitColumn {
    fn buffered_bytes(&self) -> usize {
        self.buffer.buffered_bytes()
    }

    fn push(&mut self, array: &dyn Array) -> Result<(), String> {
        self.settings.check_nulls(array.null_count())?;
        let buffer = &mut self.buffer;
        // Values are stored as the physical type's bits, as parquet-rs stores them:
        // narrow integers widened to INT32 with their sign, unsigned ones reinterpreted.
        match (array.data_type(), self.kind) {
            (DataType::Float32, Kind::F32) => {
                let a = array.as_primitive::<Float32Type>();
                buffer.append(a, |v| u64::from(v.to_bits()))
            }
            (DataType::Float64, Kind::F64) => {
                let a = array.as_primitive::<Float64Type>();
                buffer.append(a, f64::to_bits)
            }
            (DataType::Int8, Kind::I32 { .. }) => {
                let a = array.as_primitive::<Int8Type>();
                buffer.append(a, |v| u64::from(i32::from(v) as u32))
            }
            (DataType::Int16, Kind::I32 { .. }) => {
                let a = array.as_primitive::<Int16Type>();
                buffer.append(a, |v| u64::from(i32::from(v) as u32))
            }
            (DataType::Int32, Kind::I32 { .. }) => {
                let a = array.as_primitive::<Int32Type>();
                buffer.append(a, |v| u64::from(v as u32))
            }
            (DataType::UInt8, Kind::I32 { .. }) => {
                let a = array.as_primitive::<UInt8Type>();
                buffer.append(a, u64::from)
            }
            (DataType::UInt16, Kind::I32 { .. }) => {
                let a = array.as_primitive::<UInt16Type>();
                buffer.append(a, u64::from)
            }
            (DataType::UInt32, Kind::I32 { .. }) => {
                let a = array.as_primitive::<UInt32Type>();
                buffer.append(a, u64::from)
            }
            (DataType::Int64, Kind::I64 { .. }) => {
                let a = array.as_primitive::<Int64Type>();
                buffer.append(a, |v| v as u64)
            }
            (DataType::UInt64, Kind::I64 { .. }) => {
                let a = array.as_primitive::<UInt64Type>();
                buffer.append(a, |v| v)
            }
            (other, _) => {
                return Err(format!(
                    "column {}: {other} does not fit its {} physical type",
                    self.settings.descr.path(),
                    self.settings.descr.physical_type()
                ));
            }
        }
        Ok(())
    }

    fn reserve(&mut self, rows: usize) {
        self.buffer.reserve(rows);
    }

    fn finish(&mut self) -> parquet::errors::Result<(Bytes, ColumnCloseResult)> {
        let chunk = self.encode();
        self.buffer.release();
        chunk
    }
}

#[cfg(test)]
mod tests;
