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

use arrow_array::cast::AsArray;
use arrow_array::types::{
    ArrowPrimitiveType, Int8Type, Int16Type, Int32Type, Int64Type, TimestampMicrosecondType,
    TimestampMillisecondType, TimestampNanosecondType, TimestampSecondType, UInt8Type, UInt16Type,
    UInt32Type, UInt64Type,
};
use arrow_array::{Array, PrimitiveArray};
use arrow_schema::{DataType, TimeUnit};
use bytes::Bytes;
use parquet::basic::{Encoding, SortOrder, Type as PhysicalType};
use parquet::column::writer::ColumnCloseResult;
use parquet::file::properties::WriterProperties;
use parquet::file::statistics::{Statistics, ValueStatistics};
use parquet::schema::types::ColumnDescPtr;

use crate::chunk::{
    BoundaryTracker, ChunkBuilder, ColumnChunkEncoder, ColumnSettings, DataPage, ValueBuffer,
};
use crate::delta::{self, Width};

/// One integer column of the row group being written.
#[derive(Debug)]
pub(crate) struct IntColumn {
    settings: ColumnSettings,
    width: Width,
    unsigned: bool,
    /// The non-null values, as the physical type's bits sign-extended to `i64`.
    buffer: ValueBuffer<i64>,
}

/// Whether this module encodes an Arrow column of type `data_type`.
fn supported(data_type: &DataType) -> bool {
    use DataType::*;
    matches!(
        data_type,
        Int8 | Int16 | Int32 | Int64 | UInt8 | UInt16 | UInt32 | UInt64 | Timestamp(_, _)
    )
}

impl IntColumn {
    /// A column for the leaf `descr` of Arrow type `data_type`, if the properties ask for
    /// plain delta encoding and the type is one this module writes; `None` otherwise.
    pub(crate) fn for_leaf(
        descr: ColumnDescPtr,
        data_type: &DataType,
        props: &WriterProperties,
    ) -> Result<Option<Self>, String> {
        let path = descr.path();
        let width = match descr.physical_type() {
            PhysicalType::INT32 => Width::W32,
            PhysicalType::INT64 => Width::W64,
            _ => return Ok(None),
        };
        if props.encoding(path) != Some(Encoding::DELTA_BINARY_PACKED)
            || props.dictionary_enabled(path)
            || !supported(data_type)
        {
            return Ok(None);
        }
        let unsigned = descr.sort_order() == SortOrder::UNSIGNED;
        let settings = ColumnSettings::new(descr, props)?;
        Ok(Some(Self {
            buffer: ValueBuffer::new(settings.nullable()),
            settings,
            width,
            unsigned,
        }))
    }

    fn extend<T: ArrowPrimitiveType>(
        &mut self,
        array: &PrimitiveArray<T>,
        widen: impl Fn(T::Native) -> i64,
    ) {
        self.buffer.append(array, widen);
    }

    /// The page's minimum and maximum in the column's sort order (compared as keys whose
    /// unsigned order is that order; one pass per page, monomorphised per order).
    fn min_max(&self, page: &[i64]) -> Option<(i64, i64)> {
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
    fn key(&self, v: i64) -> u64 {
        match (self.width, self.unsigned) {
            (Width::W32, true) => u64::from(v as u32),
            (Width::W64, true) => v as u64,
            (_, false) => (v as u64) ^ (1 << 63),
        }
    }

    fn plain(&self, v: i64) -> Vec<u8> {
        match self.width {
            Width::W32 => (v as i32).to_le_bytes().to_vec(),
            Width::W64 => v.to_le_bytes().to_vec(),
        }
    }

    fn encode(&self) -> parquet::errors::Result<(Bytes, ColumnCloseResult)> {
        let mut chunk = ChunkBuilder::new(&self.settings);
        let mut boundary = BoundaryTracker::new();
        let mut chunk_range: Option<(i64, i64)> = None;
        let mut nulls = 0u64;
        for page_rows in self.buffer.rows.pages(self.settings.page_rows) {
            let page = &self.buffer.values[page_rows.values.clone()];
            let range = self.min_max(page);
            if let Some((lo, hi)) = range {
                boundary.page(self.key(lo), self.key(hi));
                chunk_range = Some(match chunk_range {
                    None => (lo, hi),
                    Some((a, b)) => (
                        if self.key(lo) < self.key(a) { lo } else { a },
                        if self.key(hi) > self.key(b) { hi } else { b },
                    ),
                });
            }
            let mut values = Vec::new();
            delta::encode(page, self.width, &mut values);
            nulls += page_rows.nulls() as u64;
            chunk.data_page(DataPage {
                nulls: page_rows.nulls(),
                levels: page_rows.levels,
                values,
                encoding: Encoding::DELTA_BINARY_PACKED,
                rows: page_rows.rows,
                min_max: range.map(|(lo, hi)| (self.plain(lo), self.plain(hi))),
                unencoded_bytes: None,
                nan_count: None,
            })?;
        }

        let signed = !self.unsigned;
        let (min, max) = (chunk_range.map(|r| r.0), chunk_range.map(|r| r.1));
        let statistics = match self.width {
            Width::W32 => Statistics::Int32(
                ValueStatistics::new(
                    min.map(|v| v as i32),
                    max.map(|v| v as i32),
                    None,
                    Some(nulls),
                    false,
                )
                .with_backwards_compatible_min_max(signed),
            ),
            Width::W64 => Statistics::Int64(
                ValueStatistics::new(min, max, None, Some(nulls), false)
                    .with_backwards_compatible_min_max(signed),
            ),
        };
        chunk.finish(statistics, boundary.order(), None)
    }
}

impl ColumnChunkEncoder for IntColumn {
    fn buffered_bytes(&self) -> usize {
        self.buffer.buffered_bytes()
    }

    fn push(&mut self, array: &dyn Array) -> Result<(), String> {
        self.settings.check_nulls(array.null_count())?;
        match array.data_type() {
            DataType::Int8 => self.extend(array.as_primitive::<Int8Type>(), i64::from),
            DataType::Int16 => self.extend(array.as_primitive::<Int16Type>(), i64::from),
            DataType::Int32 => self.extend(array.as_primitive::<Int32Type>(), i64::from),
            DataType::Int64 => self.extend(array.as_primitive::<Int64Type>(), |v| v),
            // Unsigned values are stored as the physical type's bits (as parquet-rs does).
            DataType::UInt8 => self.extend(array.as_primitive::<UInt8Type>(), i64::from),
            DataType::UInt16 => self.extend(array.as_primitive::<UInt16Type>(), i64::from),
            DataType::UInt32 => {
                self.extend(array.as_primitive::<UInt32Type>(), |v| i64::from(v as i32))
            }
            DataType::UInt64 => self.extend(array.as_primitive::<UInt64Type>(), |v| v as i64),
            DataType::Timestamp(unit, _) => match unit {
                TimeUnit::Second => self.extend(array.as_primitive::<TimestampSecondType>(), |v| v),
                TimeUnit::Millisecond => {
                    self.extend(array.as_primitive::<TimestampMillisecondType>(), |v| v)
                }
                TimeUnit::Microsecond => {
                    self.extend(array.as_primitive::<TimestampMicrosecondType>(), |v| v)
                }
                TimeUnit::Nanosecond => {
                    self.extend(array.as_primitive::<TimestampNanosecondType>(), |v| v)
                }
            },
            other => {
                return Err(format!(
                    "column {}: {other} is not an integer type",
                    self.settings.descr.path()
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
