//! Dictionary-encoded string column chunks, written from the Arrow dictionary's keys.
//!
//! Every string column in the telemetry schemas is `Dictionary(Int32, Utf8)` in Arrow:
//! the sink interns strings as rows arrive, so each value is already a small integer.
//! parquet-rs's `ArrowWriter` does not use that: its dictionary encoder hashes every
//! value again, and its `PLAIN` encoder copies every string and hands it to ZSTD —
//! together about a third of the writer's instructions per row for 8 string columns.
//! Here the chunk's dictionary is merged from the batches' dictionaries (one hash per
//! *distinct* value per batch), each row costs one table lookup, and the pages are
//! written with parquet-rs's own page writer and metadata builders:
//!
//! * one `PLAIN` dictionary page per chunk, then `DATA_PAGE_V2` pages of at most
//!   `data_page_row_count_limit` rows, values `RLE_DICTIONARY` (bit width byte + RLE /
//!   bit-packing hybrid, [`crate::rle`]), definition levels RLE when the column is
//!   nullable; values compressed as the writer properties say (ZSTD or none);
//! * statistics as the properties say: chunk min/max and null count, and for
//!   `EnabledStatistics::Page` the column index (per-page min/max, null pages, boundary
//!   order) — computed per *run* from each dictionary value's rank in byte order, not
//!   by comparing strings per row; always the offset index.
//!
//! This is the layout parquet-rs itself writes for a dictionary-encoded column, so
//! every reader that reads Parquet dictionaries reads it (tested against parquet-rs's
//! reader here and pyarrow in the interop test); readers also get the dictionary back
//! without hashing. Not written: bloom filters (none configured for telemetry), level
//! histograms (optional size statistics), truncated statistics (values are kept whole,
//! which the format allows).

use arrow_array::cast::AsArray;
use arrow_array::types::Int32Type;
use arrow_array::{Array, StringArray};
use bytes::Bytes;
use parquet::basic::Encoding;
use parquet::column::writer::ColumnCloseResult;
use parquet::data_type::ByteArray;
use parquet::file::properties::WriterProperties;
use parquet::file::statistics::{Statistics, ValueStatistics};
use parquet::schema::types::ColumnDescPtr;
use rustc_hash::FxHashMap;

use crate::chunk::{
    BoundaryTracker, ChunkBuilder, ColumnChunkEncoder, ColumnSettings, DataPage, RowLevels,
};
use crate::rle;

/// One dictionary string column of the row group being written.
#[derive(Debug)]
pub(crate) struct DictColumn {
    settings: ColumnSettings,
    /// The chunk's dictionary, in first-seen order, and its index.
    values: Vec<Box<[u8]>>,
    lookup: FxHashMap<Box<[u8]>, u32>,
    /// Dictionary ids of the non-null rows.
    ids: Vec<u32>,
    rows: RowLevels,
    /// Reused per batch: batch dictionary key → chunk id.
    remap: Vec<u32>,
}

impl DictColumn {
    /// A column for the leaf `descr`, with the settings `props` gives it.
    pub(crate) fn new(descr: ColumnDescPtr, props: &WriterProperties) -> Result<Self, String> {
        let settings = ColumnSettings::new(descr, props)?;
        Ok(Self {
            rows: RowLevels::new(settings.nullable()),
            settings,
            values: Vec::new(),
            lookup: FxHashMap::default(),
            ids: Vec::new(),
            remap: Vec::new(),
        })
    }

    fn intern(&mut self, value: &[u8]) -> u32 {
        if let Some(&id) = self.lookup.get(value) {
            return id;
        }
        let id = self.values.len() as u32;
        self.values.push(value.into());
        self.lookup.insert(value.into(), id);
        id
    }

    fn encode(&self) -> parquet::errors::Result<(Bytes, ColumnCloseResult)> {
        let mut chunk = ChunkBuilder::new(&self.settings);

        // Rank of each id in byte order: min/max become integer comparisons per run.
        let mut order: Vec<u32> = (0..self.values.len() as u32).collect();
        order.sort_unstable_by(|&a, &b| self.values[a as usize].cmp(&self.values[b as usize]));
        let mut rank = vec![0u32; order.len()];
        for (r, &id) in order.iter().enumerate() {
            rank[id as usize] = r as u32;
        }
        let value_of_rank = |r: u32| self.values[order[r as usize] as usize].to_vec();

        let mut dictionary = Vec::with_capacity(self.buffered_bytes());
        for v in &self.values {
            dictionary.extend_from_slice(&(v.len() as u32).to_le_bytes());
            dictionary.extend_from_slice(v);
        }
        chunk.dictionary_page(dictionary, self.values.len())?;

        let bit_width = rle::bit_width(self.values.len().saturating_sub(1) as u32);
        let mut boundary = BoundaryTracker::new();
        let mut chunk_range: Option<(u32, u32)> = None;
        let mut unencoded_bytes = 0i64;
        let mut nulls = 0u64;
        for page in self.rows.pages(self.settings.page_rows) {
            let mut values = vec![bit_width];
            let mut range: Option<(u32, u32)> = None;
            let mut page_bytes = 0i64;
            let ids = &self.ids[page.values.clone()];
            rle::encode(ids, bit_width, &mut values, |id, len| {
                let r = rank[id as usize];
                range = Some(range.map_or((r, r), |(lo, hi)| (lo.min(r), hi.max(r))));
                page_bytes += (self.values[id as usize].len() * len) as i64;
            });
            if let Some((lo, hi)) = range {
                boundary.page(lo, hi);
                chunk_range = Some(chunk_range.map_or((lo, hi), |(a, b)| (a.min(lo), b.max(hi))));
            }
            nulls += page.nulls() as u64;
            unencoded_bytes += page_bytes;
            let min_max = range.map(|(lo, hi)| (value_of_rank(lo), value_of_rank(hi)));
            let encoding = Encoding::RLE_DICTIONARY;
            chunk.data_page(DataPage {
                unencoded_bytes: Some(page_bytes),
                ..DataPage::flat(page, values, encoding, min_max)
            })?;
        }

        let bound = |r: u32| ByteArray::from(value_of_rank(r));
        let statistics = Statistics::ByteArray(ValueStatistics::new(
            chunk_range.map(|(lo, _)| bound(lo)),
            chunk_range.map(|(_, hi)| bound(hi)),
            None,
            Some(nulls),
            false,
        ));
        chunk.finish(statistics, boundary.order(), Some(unencoded_bytes))
    }
}

impl ColumnChunkEncoder for DictColumn {
    fn buffered_bytes(&self) -> usize {
        self.ids.len() * 4
            + self.rows.buffered_bytes()
            + self.values.iter().map(|v| v.len() + 4).sum::<usize>()
    }

    fn push(&mut self, array: &dyn Array) -> Result<(), String> {
        let path = self.settings.descr.path();
        let dict = array.as_dictionary_opt::<Int32Type>().ok_or_else(|| {
            format!(
                "column {path}: expected Dictionary(Int32, Utf8), got {}",
                array.data_type()
            )
        })?;
        let strings: &StringArray = dict.values().as_string_opt::<i32>().ok_or_else(|| {
            format!(
                "column {path}: dictionary values are {}, not Utf8",
                dict.values().data_type()
            )
        })?;
        self.settings.check_nulls(dict.logical_null_count())?;
        self.remap.clear();
        for i in 0..strings.len() {
            // A null dictionary value is a null row; its id is never read.
            let id = if strings.is_null(i) {
                0
            } else {
                self.intern(strings.value(i).as_bytes())
            };
            self.remap.push(id);
        }

        let keys = dict.keys();
        if keys.null_count() == 0 && strings.null_count() == 0 {
            self.ids.reserve(keys.len());
            self.ids
                .extend(keys.values().iter().map(|&k| self.remap[k as usize]));
            self.rows.present(keys.len());
        } else {
            for (row, &k) in keys.values().iter().enumerate() {
                let present = keys.is_valid(row) && strings.is_valid(k as usize);
                if present {
                    self.ids.push(self.remap[k as usize]);
                }
                self.rows.push(present);
            }
        }
        Ok(())
    }

    fn reserve(&mut self, rows: usize) {
        self.ids.reserve(rows);
    }

    fn finish(&mut self) -> parquet::errors::Result<(Bytes, ColumnCloseResult)> {
        let chunk = self.encode();
        // Freed, not kept: an open file per partition would otherwise hold a row
        // group's worth of buffers between row groups.
        self.values = Default::default();
        self.lookup = Default::default();
        self.ids = Default::default();
        self.rows = RowLevels::new(self.settings.nullable());
        chunk
    }
}

#[cfg(test)]
mod tests;
