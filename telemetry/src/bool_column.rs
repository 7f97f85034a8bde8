//! `RLE` boolean column chunks (MIG mode), encoded by the writer itself.
//!
//! One boolean column per GPU row is cheap to encode, but through parquet-rs's Arrow
//! writer every chunk of it made a ZSTD compression *and* decompression context (its
//! codec holds both), about 3.6 % of the writer thread's time on the per-link sink
//! benchmark, to compress a few bytes of run-length-encoded values that ZSTD cannot
//! shrink (parquet-rs then stores them uncompressed anyway). Here the values are
//! buffered as they come and each page is run-length encoded at the end of the row
//! group, with the page's min and max taken per run; pages go through [`crate::chunk`],
//! whose shared per-thread ZSTD context is used, and whose pages keep their values
//! uncompressed when ZSTD does not make them smaller.
//!
//! The encoding is the one parquet-rs writes for booleans with format version 2: `RLE`,
//! i.e. the RLE / bit-packing hybrid at bit width 1 behind a 4-byte little-endian length.
//!
//! Which columns: non-repeated boolean leaves outside any nested type, in files written
//! as format version 2 with no other value encoding asked for; the rest stay with
//! parquet-rs.

use arrow_array::Array;
use arrow_array::cast::AsArray;
use arrow_schema::DataType;
use bytes::Bytes;
use parquet::basic::{Encoding, Type as PhysicalType};
use parquet::column::writer::ColumnCloseResult;
use parquet::file::properties::{WriterProperties, WriterVersion};
use parquet::file::statistics::{Statistics, ValueStatistics};
use parquet::schema::types::ColumnDescPtr;

use crate::chunk::{
    BoundaryTracker, ChunkBuilder, ColumnChunkEncoder, ColumnSettings, DataPage, ValueBuffer,
};
use crate::rle;

/// One boolean column of the row group being written.
#[derive(Debug)]
pub(crate) struct BoolColumn {
    settings: ColumnSettings,
    buffer: ValueBuffer<bool>,
}

impl BoolColumn {
    /// A column for the leaf `descr` of Arrow type `data_type`, if it is a boolean this
    /// module writes; `None` otherwise.
    pub(crate) fn for_leaf(
        descr: ColumnDescPtr,
        data_type: &DataType,
        props: &WriterProperties,
    ) -> Result<Option<Self>, String> {
        let encoding = props.encoding(descr.path());
        if *data_type != DataType::Boolean
            || descr.physical_type() != PhysicalType::BOOLEAN
            || descr.max_rep_level() > 0
            || descr.max_def_level() > 1
            || props.writer_version() != WriterVersion::PARQUET_2_0
            || !matches!(encoding, None | Some(Encoding::RLE))
        {
            return Ok(None);
        }
        let settings = ColumnSettings::new(descr, props)?;
        Ok(Some(Self {
            buffer: ValueBuffer::new(settings.nullable()),
            settings,
        }))
    }

    fn encode(&self) -> parquet::errors::Result<(Bytes, ColumnCloseResult)> {
        let mut chunk = ChunkBuilder::new(&self.settings);
        let mut boundary = BoundaryTracker::new();
        let (mut seen_false, mut seen_true, mut nulls) = (false, false, 0u64);
        for page_rows in self.buffer.rows.pages(self.settings.page_rows) {
            let page = &self.buffer.values[page_rows.values.clone()];
            let (values, range) = encode_page(page);
            if let Some((lo, hi)) = range {
                boundary.page(lo, hi);
                seen_false |= !lo;
                seen_true |= hi;
            }
            nulls += page_rows.nulls() as u64;
            let min_max = range.map(|(lo, hi)| (vec![u8::from(lo)], vec![u8::from(hi)]));
            chunk.data_page(DataPage::flat(page_rows, values, Encoding::RLE, min_max))?;
        }
        let (min, max) = match (seen_false, seen_true) {
            (false, false) => (None, None),
            _ => (Some(!seen_false), Some(seen_true)),
        };
        let statistics =
            Statistics::Boolean(ValueStatistics::new(min, max, None, Some(nulls), false));
        chunk.finish(statistics, boundary.order(), None)
    }
}

/// A page's present values as `RLE` (length prefix included), and their min and max.
fn encode_page(values: &[bool]) -> (Vec<u8>, Option<(bool, bool)>) {
    let mut out = vec![0; 4];
    let (mut any_false, mut any_true) = (false, false);
    rle::encode(values, 1, &mut out, |v, _| {
        any_false |= !v;
        any_true |= v;
    });
    let len = u32::try_from(out.len() - 4).expect("a page's runs fit in 4 GiB");
    out[..4].copy_from_slice(&len.to_le_bytes());
    let range = (any_false || any_true).then_some((!any_false, any_true));
    (out, range)
}

impl ColumnChunkEncoder for BoolColumn {
    fn buffered_bytes(&self) -> usize {
        self.buffer.buffered_bytes()
    }

    fn push(&mut self, array: &dyn Array) -> Result<(), String> {
        self.settings.check_nulls(array.null_count())?;
        let Some(array) = array.as_boolean_opt() else {
            return Err(format!(
                "column {}: {} is not a boolean type",
                self.settings.descr.path(),
                array.data_type()
            ));
        };
        self.buffer
            .append_slots(array.values().iter(), array.nulls());
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
