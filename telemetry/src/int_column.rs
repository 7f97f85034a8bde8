//! `DELTA_BINARY_PACKED` integer column chunks, encoded by the writer itself.
//!
//! Timestamps, counters, memory, clocks and bitmasks are a dozen columns per GPU row;
//! through parquet-rs's Arrow writer each value costs a gather into a temporary vector,
//! a min/max update and a delta bit-packing step that packs one value at a time — a
//! quarter of the writer's instructions on the sink benchmark. Here a batch's values are
//! copied once (widened to `i64`), and at the end of the row group each page is
//! delta-encoded in one pass ([`crate::delta`]) with its min/max taken in the column's
//! sort order (unsigned for `UInt*` columns, as their logical type says). Pages,
//! statistics and the page index go through [`crate::chunk`].
//!
//! Which columns: those whose writer properties ask for `DELTA_BINARY_PACKED` without a
//! dictionary, of an integer or timestamp Arrow type; the rest stay with parquet-rs.

use arrow_array::Array;
use arrow_array::cast::AsArray;
use arrow_array::types::{
    ArrowPrimitiveType, Int8Type, Int16Type, Int32Type, Int64Type, TimestampMicrosecondType,
    TimestampMillisecondType, TimestampNanosecondType, TimestampSecondType, UInt8Type, UInt16Type,
    UInt32Type, UInt64Type,
};
use arrow_schema::{DataType, TimeUnit};
use bytes::Bytes;
use parquet::basic::{BoundaryOrder, Encoding, SortOrder, Type as PhysicalType};
use parquet::column::writer::ColumnCloseResult;
use parquet::file::properties::WriterProperties;
use parquet::file::statistics::{Statistics, ValueStatistics};
use parquet::schema::types::{ColumnDescPtr, ColumnDescriptor};

use crate::chunk::{
    BoundaryTracker, ChunkBuilder, ColumnChunkEncoder, ColumnSettings, DataPage, ValueBuffer,
};
use crate::delta::{self, Width};

/// One integer column of the row group being written.
#[derive(Debug)]
pub(crate) struct IntColumn {
    settings: ColumnSettings,
    order: IntOrder,
    /// The non-null values, as the physical type's bits sign-extended to `i64`.
    buffer: ValueBuffer<i64>,
    /// A batch's values, nulls' slots included, before the nulls are dropped.
    scratch: Vec<i64>,
}

/// Whether this module encodes Arrow values of type `data_type`.
pub(crate) fn supported(data_type: &DataType) -> bool {
    use DataType::*;
    matches!(
        data_type,
        Int8 | Int16 | Int32 | Int64 | UInt8 | UInt16 | UInt32 | UInt64 | Timestamp(_, _)
    )
}

/// Whether the properties ask for plain delta encoding (no dictionary) of `descr`.
pub(crate) fn delta_encoded(descr: &ColumnDescriptor, props: &WriterProperties) -> bool {
    props.encoding(descr.path()) == Some(Encoding::DELTA_BINARY_PACKED)
        && !props.dictionary_enabled(descr.path())
}

/// Appends every slot of an integer array (a null's slot too) to `out` as the physical
/// type's bits sign-extended to `i64`, as parquet-rs stores them: unsigned values are
/// reinterpreted, narrow ones widened.
pub(crate) fn widen_into(array: &dyn Array, out: &mut Vec<i64>) -> Result<(), String> {
    fn extend<T: ArrowPrimitiveType>(
        array: &dyn Array,
        out: &mut Vec<i64>,
        widen: impl Fn(T::Native) -> i64,
    ) {
        out.extend(array.as_primitive::<T>().values().iter().map(|&v| widen(v)));
    }
    match array.data_type() {
        DataType::Int8 => extend::<Int8Type>(array, out, i64::from),
        DataType::Int16 => extend::<Int16Type>(array, out, i64::from),
        DataType::Int32 => extend::<Int32Type>(array, out, i64::from),
        DataType::Int64 => extend::<Int64Type>(array, out, |v| v),
        DataType::UInt8 => extend::<UInt8Type>(array, out, i64::from),
        DataType::UInt16 => extend::<UInt16Type>(array, out, i64::from),
        DataType::UInt32 => extend::<UInt32Type>(array, out, |v| i64::from(v as i32)),
        DataType::UInt64 => extend::<UInt64Type>(array, out, |v| v as i64),
        DataType::Timestamp(unit, _) => match unit {
            TimeUnit::Second => extend::<TimestampSecondType>(array, out, |v| v),
            TimeUnit::Millisecond => extend::<TimestampMillisecondType>(array, out, |v| v),
            TimeUnit::Microsecond => extend::<TimestampMicrosecondType>(array, out, |v| v),
            TimeUnit::Nanosecond => extend::<TimestampNanosecondType>(array, out, |v| v),
        },
        other => return Err(format!("{other} is not an integer type")),
    }
    Ok(())
}

impl IntColumn {
    /// A column for the leaf `descr` of Arrow type `data_type`, if the properties ask for
    /// plain delta encoding and the type is one this module writes; `None` otherwise.
    pub(crate) fn for_leaf(
        descr: ColumnDescPtr,
        data_type: &DataType,
        props: &WriterProperties,
    ) -> Result<Option<Self>, String> {
        let Some(order) = IntOrder::of(&descr) else {
            return Ok(None);
        };
        if !delta_encoded(&descr, props) || !supported(data_type) || descr.max_rep_level() > 0 {
            return Ok(None);
        }
        let settings = ColumnSettings::new(descr, props)?;
        Ok(Some(Self {
            buffer: ValueBuffer::new(settings.nullable()),
            settings,
            order,
            scratch: Vec::new(),
        }))
    }

    fn encode(&self) -> parquet::errors::Result<(Bytes, ColumnCloseResult)> {
        let mut chunk = ChunkBuilder::new(&self.settings);
        let mut pages = IntPages::new(self.order);
        for page_rows in self.buffer.rows.pages(self.settings.page_rows) {
            let page = &self.buffer.values[page_rows.values.clone()];
            let (values, min_max) = pages.page(page, page_rows.nulls());
            let encoding = Encoding::DELTA_BINARY_PACKED;
            chunk.data_page(DataPage::flat(page_rows, values, encoding, min_max))?;
        }
        let (statistics, boundary) = pages.finish();
        chunk.finish(statistics, boundary, None)
    }
}

/// How a column's integers are stored and ordered: what its statistics need.
#[derive(Debug, Clone, Copy)]
pub(crate) struct IntOrder {
    width: Width,
    unsigned: bool,
}

impl IntOrder {
    /// The order of an `INT32` or `INT64` leaf (unsigned for `UInt*` logical types).
    pub(crate) fn of(descr: &ColumnDescriptor) -> Option<Self> {
        let width = match descr.physical_type() {
            PhysicalType::INT32 => Width::W32,
            PhysicalType::INT64 => Width::W64,
            _ => return None,
        };
        let unsigned = descr.sort_order() == SortOrder::UNSIGNED;
        Some(Self { width, unsigned })
    }

    /// The page's minimum and maximum in the column's sort order (compared as keys whose
    /// unsigned order is that order; one pass per page, monomorphised per order).
    fn min_max(self, page: &[i64]) -> Option<(i64, i64)> {
        const SIGN: u64 = 1 << 63;
        fn by_key(
            page: &[i64],
            key: impl Fn(i64) -> u64,
            value: impl Fn(u64) -> i64,
        ) -> Option<(i64, i64)> {
            let first = key(*page.first()?);
            let (lo, hi) = page.iter().fold((first, first), |(lo, hi), &v| {
                let k = key(v);
                (lo.min(k), hi.max(k))
            });
            Some((value(lo), value(hi)))
        }
        match (self.width, self.unsigned) {
            (Width::W32, true) => by_key(
                page,
                |v| u64::from(v as u32),
                |k| i64::from(k as u32 as i32),
            ),
            (Width::W64, true) => by_key(page, |v| v as u64, |k| k as i64),
            // Sign-extended, so one flip serves both widths.
            (_, false) => by_key(page, |v| (v as u64) ^ SIGN, |k| (k ^ SIGN) as i64),
        }
    }

    /// A key whose unsigned order is the column's sort order.
    fn key(self, v: i64) -> u64 {
        match (self.width, self.unsigned) {
            (Width::W32, true) => u64::from(v as u32),
            (Width::W64, true) => v as u64,
            (_, false) => (v as u64) ^ (1 << 63),
        }
    }

    fn plain(self, v: i64) -> Vec<u8> {
        match self.width {
            Width::W32 => (v as i32).to_le_bytes().to_vec(),
            Width::W64 => v.to_le_bytes().to_vec(),
        }
    }
}

/// A page's min and max, plain-encoded (the column index's form).
pub(crate) type PlainBounds = (Vec<u8>, Vec<u8>);

/// Delta-encodes a chunk's pages of integers, and gathers the chunk's statistics and
/// the order of its pages' bounds on the way.
#[derive(Debug)]
pub(crate) struct IntPages {
    order: IntOrder,
    boundary: BoundaryTracker<u64>,
    range: Option<(i64, i64)>,
    nulls: u64,
}

impl IntPages {
    pub(crate) fn new(order: IntOrder) -> Self {
        Self {
            order,
            boundary: BoundaryTracker::new(),
            range: None,
            nulls: 0,
        }
    }

    /// One page's present values (and how many nulls it has): the encoded values, and
    /// their plain-encoded min and max for the column index (`None` if there are none).
    pub(crate) fn page(&mut self, values: &[i64], nulls: usize) -> (Vec<u8>, Option<PlainBounds>) {
        let order = self.order;
        let range = order.min_max(values);
        if let Some((lo, hi)) = range {
            self.boundary.page(order.key(lo), order.key(hi));
            self.range = Some(match self.range {
                None => (lo, hi),
                Some((a, b)) => (
                    if order.key(lo) < order.key(a) { lo } else { a },
                    if order.key(hi) > order.key(b) { hi } else { b },
                ),
            });
        }
        self.nulls += nulls as u64;
        let mut encoded = Vec::new();
        delta::encode(values, order.width, &mut encoded);
        (
            encoded,
            range.map(|(lo, hi)| (order.plain(lo), order.plain(hi))),
        )
    }

    /// The chunk's statistics and its pages' boundary order.
    pub(crate) fn finish(self) -> (Statistics, BoundaryOrder) {
        let signed = !self.order.unsigned;
        let (min, max) = (self.range.map(|r| r.0), self.range.map(|r| r.1));
        let nulls = Some(self.nulls);
        let statistics = match self.order.width {
            Width::W32 => Statistics::Int32(
                ValueStatistics::new(
                    min.map(|v| v as i32),
                    max.map(|v| v as i32),
                    None,
                    nulls,
                    false,
                )
                .with_backwards_compatible_min_max(signed),
            ),
            Width::W64 => Statistics::Int64(
                ValueStatistics::new(min, max, None, nulls, false)
                    .with_backwards_compatible_min_max(signed),
            ),
        };
        (statistics, self.boundary.order())
    }
}

impl ColumnChunkEncoder for IntColumn {
    fn buffered_bytes(&self) -> usize {
        self.buffer.buffered_bytes()
    }

    fn push(&mut self, array: &dyn Array) -> Result<(), String> {
        self.settings.check_nulls(array.null_count())?;
        let path = self.settings.descr.path();
        let column = |e: String| format!("column {path}: {e}");
        match array.nulls().filter(|n| n.null_count() > 0) {
            None => {
                widen_into(array, &mut self.buffer.values).map_err(column)?;
                self.buffer.rows.present(array.len());
            }
            Some(nulls) => {
                self.scratch.clear();
                widen_into(array, &mut self.scratch).map_err(column)?;
                for (&v, valid) in self.scratch.iter().zip(nulls.iter()) {
                    if valid {
                        self.buffer.values.push(v);
                    }
                    self.buffer.rows.push(valid);
                }
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
        self.scratch = Vec::new();
        chunk
    }
}

#[cfg(test)]
mod tests;
