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
use parquet::basic::{BoundaryOrder, Compression, Encoding, EncodingMask, PageType};
use parquet::column::page::{CompressedPage, Page, PageWriter};
use parquet::column::writer::ColumnCloseResult;
use parquet::data_type::ByteArray;
use parquet::file::metadata::{
    ColumnChunkMetaData, ColumnIndexBuilder, OffsetIndexBuilder, PageEncodingStats,
};
use parquet::file::properties::{EnabledStatistics, WriterProperties};
use parquet::file::statistics::{Statistics, ValueStatistics};
use parquet::file::writer::{SerializedPageWriter, TrackedWrite};
use parquet::schema::types::ColumnDescPtr;
use rustc_hash::FxHashMap;

use crate::rle;

/// How the chunk's values are compressed.
#[derive(Debug, Clone, Copy)]
enum Codec {
    None,
    Zstd(i32),
}

/// One dictionary string column of the row group being written.
#[derive(Debug)]
pub(crate) struct DictColumn {
    descr: ColumnDescPtr,
    codec: Codec,
    statistics: EnabledStatistics,
    page_rows: usize,
    offset_index: bool,
    /// The chunk's dictionary, in first-seen order, and its index.
    values: Vec<Box<[u8]>>,
    lookup: FxHashMap<Box<[u8]>, u32>,
    /// Dictionary ids of the non-null rows.
    ids: Vec<u32>,
    /// Definition level per row (1 = present), kept only for a nullable column.
    levels: Vec<u8>,
    rows: usize,
    /// Reused per batch: batch dictionary key → chunk id.
    remap: Vec<u32>,
}

impl DictColumn {
    /// A column for the leaf `descr`, with the settings `props` gives it.
    pub(crate) fn new(descr: ColumnDescPtr, props: &WriterProperties) -> Result<Self, String> {
        let path = descr.path();
        let codec = match props.compression(path) {
            Compression::UNCOMPRESSED => Codec::None,
            Compression::ZSTD(level) => Codec::Zstd(level.compression_level()),
            other => {
                return Err(format!(
                    "column {path}: dictionary string columns are written with ZSTD or \
                     uncompressed, not {other}"
                ));
            }
        };
        Ok(Self {
            codec,
            statistics: props.statistics_enabled(path),
            page_rows: props.data_page_row_count_limit().max(1),
            offset_index: !props.offset_index_disabled(),
            descr,
            values: Vec::new(),
            lookup: FxHashMap::default(),
            ids: Vec::new(),
            levels: Vec::new(),
            rows: 0,
            remap: Vec::new(),
        })
    }

    fn nullable(&self) -> bool {
        self.descr.max_def_level() > 0
    }

    /// Bytes buffered, an upper bound of what the chunk will take before compression.
    pub(crate) fn buffered_bytes(&self) -> usize {
        self.ids.len() * 4
            + self.levels.len()
            + self.values.iter().map(|v| v.len() + 4).sum::<usize>()
    }

    /// Appends a `Dictionary(Int32, Utf8)` array.
    pub(crate) fn push(&mut self, array: &dyn Array) -> Result<(), String> {
        let dict = array.as_dictionary_opt::<Int32Type>().ok_or_else(|| {
            format!(
                "column {}: expected Dictionary(Int32, Utf8), got {}",
                self.descr.path(),
                array.data_type()
            )
        })?;
        let strings: &StringArray = dict.values().as_string_opt::<i32>().ok_or_else(|| {
            format!(
                "column {}: dictionary values are {}, not Utf8",
                self.descr.path(),
                dict.values().data_type()
            )
        })?;
        if !self.nullable() && dict.logical_null_count() > 0 {
            return Err(format!(
                "column {}: {} nulls in a non-nullable column",
                self.descr.path(),
                dict.logical_null_count()
            ));
        }
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
        let null_values = strings.null_count() > 0;
        if keys.null_count() == 0 && !null_values {
            self.ids.reserve(keys.len());
            self.ids
                .extend(keys.values().iter().map(|&k| self.remap[k as usize]));
            if self.nullable() {
                self.levels.resize(self.levels.len() + keys.len(), 1);
            }
        } else {
            for (row, &k) in keys.values().iter().enumerate() {
                let present = keys.is_valid(row) && strings.is_valid(k as usize);
                if present {
                    self.ids.push(self.remap[k as usize]);
                }
                self.levels.push(u8::from(present));
            }
        }
        self.rows += keys.len();
        Ok(())
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

    /// Encodes the buffered rows as one column chunk (its bytes start at offset 0) and
    /// resets the column for the next row group.
    pub(crate) fn finish(&mut self) -> parquet::errors::Result<(Bytes, ColumnCloseResult)> {
        let chunk = self.encode();
        self.values.clear();
        self.lookup.clear();
        self.ids.clear();
        self.levels.clear();
        self.rows = 0;
        chunk
    }

    fn encode(&self) -> parquet::errors::Result<(Bytes, ColumnCloseResult)> {
        let mut sink = TrackedWrite::new(Vec::new());
        let mut pages = SerializedPageWriter::new(&mut sink);
        let mut compressed = 0u64;
        let mut uncompressed = 0u64;

        // Rank of each id in byte order: min/max become integer comparisons per run.
        let mut order: Vec<u32> = (0..self.values.len() as u32).collect();
        order.sort_unstable_by(|&a, &b| self.values[a as usize].cmp(&self.values[b as usize]));
        let mut rank = vec![0u32; order.len()];
        for (r, &id) in order.iter().enumerate() {
            rank[id as usize] = r as u32;
        }

        let mut dictionary = Vec::with_capacity(self.buffered_bytes());
        for v in &self.values {
            dictionary.extend_from_slice(&(v.len() as u32).to_le_bytes());
            dictionary.extend_from_slice(v);
        }
        let dict_len = dictionary.len();
        let dict_page = Page::DictionaryPage {
            buf: self.compress(dictionary)?,
            num_values: self.values.len() as u32,
            encoding: Encoding::PLAIN,
            is_sorted: false,
        };
        let spec = pages.write_page(CompressedPage::new(dict_page, dict_len))?;
        let dictionary_offset = spec.offset as i64;
        compressed += spec.compressed_size as u64;
        uncompressed += spec.uncompressed_size as u64;

        let bit_width = rle::bit_width(self.values.len().saturating_sub(1) as u32);
        let mut column_index = ColumnIndexBuilder::new(self.descr.physical_type());
        if self.statistics != EnabledStatistics::Page {
            column_index.to_invalid();
        }
        let mut offset_index = OffsetIndexBuilder::new();
        let mut chunk_range: Option<(u32, u32)> = None;
        let mut last_page_range: Option<(u32, u32)> = None;
        let (mut ascending, mut descending) = (true, true);
        let mut first_data_offset = None;
        let mut data_pages = 0;
        let mut unencoded_bytes = 0i64;
        let mut nulls_total = 0u64;

        let mut row = 0;
        let mut id_at = 0;
        loop {
            let page_rows = self.page_rows.min(self.rows - row);
            let mut buf = Vec::new();
            let mut present = page_rows;
            if self.nullable() {
                let levels = &self.levels[row..row + page_rows];
                present = 0;
                rle::encode(levels, 1, &mut buf, |level, len| {
                    if level == 1 {
                        present += len;
                    }
                });
            }
            let levels_len = buf.len();
            let nulls = page_rows - present;
            nulls_total += nulls as u64;

            let mut values = Vec::with_capacity(16);
            values.push(bit_width);
            let mut range: Option<(u32, u32)> = None;
            let mut page_bytes = 0i64;
            rle::encode(
                &self.ids[id_at..id_at + present],
                bit_width,
                &mut values,
                |id, len| {
                    let r = rank[id as usize];
                    range = Some(range.map_or((r, r), |(lo, hi)| (lo.min(r), hi.max(r))));
                    page_bytes += (self.values[id as usize].len() * len) as i64;
                },
            );
            id_at += present;
            unencoded_bytes += page_bytes;
            let values_len = values.len();
            buf.extend_from_slice(&self.compress(values)?);

            let page = Page::DataPageV2 {
                buf: Bytes::from(buf),
                num_values: page_rows as u32,
                encoding: Encoding::RLE_DICTIONARY,
                num_nulls: nulls as u32,
                num_rows: page_rows as u32,
                def_levels_byte_len: levels_len as u32,
                rep_levels_byte_len: 0,
                is_compressed: !matches!(self.codec, Codec::None),
                statistics: None,
            };
            let spec = pages.write_page(CompressedPage::new(page, levels_len + values_len))?;
            first_data_offset.get_or_insert(spec.offset as i64);
            compressed += spec.compressed_size as u64;
            uncompressed += spec.uncompressed_size as u64;
            data_pages += 1;
            offset_index.append_offset_and_size(spec.offset as i64, spec.compressed_size as i32);
            offset_index.append_row_count(page_rows as i64);
            if self.statistics != EnabledStatistics::None {
                offset_index.append_unencoded_byte_array_data_bytes(Some(page_bytes));
            }

            match range {
                None => column_index.append(true, vec![], vec![], nulls as i64, None),
                Some((lo, hi)) => {
                    if let Some((last_lo, last_hi)) = last_page_range {
                        ascending &= last_lo <= lo && last_hi <= hi;
                        descending &= last_lo >= lo && last_hi >= hi;
                    }
                    last_page_range = Some((lo, hi));
                    chunk_range =
                        Some(chunk_range.map_or((lo, hi), |(a, b)| (a.min(lo), b.max(hi))));
                    column_index.append(
                        false,
                        self.value_of_rank(&order, lo).to_vec(),
                        self.value_of_rank(&order, hi).to_vec(),
                        nulls as i64,
                        None,
                    );
                }
            }
            row += page_rows;
            if row >= self.rows {
                break;
            }
        }
        pages.close()?;

        column_index.set_boundary_order(match (ascending, descending) {
            (true, _) => BoundaryOrder::ASCENDING,
            (false, true) => BoundaryOrder::DESCENDING,
            (false, false) => BoundaryOrder::UNORDERED,
        });
        let column_index = if column_index.valid() {
            Some(column_index.build()?)
        } else {
            None
        };

        let mut metadata = ColumnChunkMetaData::builder(self.descr.clone())
            .set_compression(match self.codec {
                Codec::None => Compression::UNCOMPRESSED,
                Codec::Zstd(level) => Compression::ZSTD(parquet::basic::ZstdLevel::try_new(level)?),
            })
            .set_encodings_mask(EncodingMask::new_from_encodings(
                [Encoding::PLAIN, Encoding::RLE, Encoding::RLE_DICTIONARY].iter(),
            ))
            .set_page_encoding_stats(vec![
                PageEncodingStats {
                    page_type: PageType::DICTIONARY_PAGE,
                    encoding: Encoding::PLAIN,
                    count: 1,
                },
                PageEncodingStats {
                    page_type: PageType::DATA_PAGE_V2,
                    encoding: Encoding::RLE_DICTIONARY,
                    count: data_pages,
                },
            ])
            .set_total_compressed_size(compressed as i64)
            .set_total_uncompressed_size(uncompressed as i64)
            .set_num_values(self.rows as i64)
            .set_data_page_offset(first_data_offset.unwrap_or(dictionary_offset))
            .set_dictionary_page_offset(Some(dictionary_offset));
        if self.statistics != EnabledStatistics::None {
            let bound = |r: u32| ByteArray::from(self.value_of_rank(&order, r).to_vec());
            metadata = metadata
                .set_statistics(Statistics::ByteArray(ValueStatistics::new(
                    chunk_range.map(|(lo, _)| bound(lo)),
                    chunk_range.map(|(_, hi)| bound(hi)),
                    None,
                    Some(nulls_total),
                    false,
                )))
                .set_unencoded_byte_array_data_bytes(Some(unencoded_bytes));
        }
        let metadata = metadata.build()?;

        let bytes = Bytes::from(sink.into_inner()?);
        Ok((
            bytes.clone(),
            ColumnCloseResult {
                bytes_written: bytes.len() as u64,
                rows_written: self.rows as u64,
                metadata,
                bloom_filter: None,
                column_index,
                offset_index: self.offset_index.then(|| offset_index.build()),
            },
        ))
    }

    fn value_of_rank<'a>(&'a self, order: &[u32], rank: u32) -> &'a [u8] {
        &self.values[order[rank as usize] as usize]
    }

    fn compress(&self, data: Vec<u8>) -> parquet::errors::Result<Bytes> {
        match self.codec {
            Codec::None => Ok(Bytes::from(data)),
            Codec::Zstd(level) => zstd::bulk::compress(&data, level)
                .map(Bytes::from)
                .map_err(|e| parquet::errors::ParquetError::External(Box::new(e))),
        }
    }
}

#[cfg(test)]
mod tests;
