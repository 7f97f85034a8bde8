//! Column chunks assembled from pages the writer encodes itself ([`crate::dict_column`],
//! [`crate::int_column`], [`crate::split_column`], [`crate::list_column`]), with
//! parquet-rs's page writer (page headers) and metadata builders (chunk metadata, column
//! index, offset index), so that the result is spliced into a row group exactly like a
//! chunk parquet-rs wrote.
//!
//! The encoders own the values and their order; this module owns the bookkeeping every
//! chunk needs: compression, page offsets and sizes, the offset index, the column index
//! when page statistics are on, the encodings and page encoding statistics, and the
//! chunk's metadata.

use std::cell::RefCell;

use arrow_array::types::ArrowPrimitiveType;
use arrow_array::{Array, PrimitiveArray};
use arrow_buffer::NullBuffer;
use bytes::Bytes;
use parquet::basic::{BoundaryOrder, Compression, Encoding, EncodingMask, PageType, ZstdLevel};
use parquet::column::page::{CompressedPage, Page, PageWriter};
use parquet::column::writer::ColumnCloseResult;
use parquet::errors::{ParquetError, Result};
use parquet::file::metadata::{
    ColumnChunkMetaData, ColumnIndexBuilder, OffsetIndexBuilder, PageEncodingStats,
};
use parquet::file::properties::{EnabledStatistics, WriterProperties};
use parquet::file::statistics::Statistics;
use parquet::file::writer::{SerializedPageWriter, TrackedWrite};
use parquet::schema::types::ColumnDescPtr;

use crate::schema::META_ZSTD_LEVEL;

/// A column the writer encodes itself: it buffers a row group's values and writes them
/// as one chunk, which the row group splices in where parquet-rs's writer would have put
/// its own.
pub(crate) trait ColumnChunkEncoder: std::fmt::Debug {
    /// Appends an array of the column's Arrow type (another type is an error).
    fn push(&mut self, array: &dyn Array) -> std::result::Result<(), String>;

    /// Makes room for `rows` more rows (the sink knows a row group's size up front).
    fn reserve(&mut self, rows: usize);

    /// Bytes buffered.
    fn buffered_bytes(&self) -> usize;

    /// Encodes the buffered rows as one column chunk (its bytes start at offset 0) and
    /// resets the column for the next row group.
    fn finish(&mut self) -> Result<(Bytes, ColumnCloseResult)>;
}

/// How a chunk's pages are compressed.
#[derive(Debug, Clone, Copy)]
enum Codec {
    None,
    Zstd(i32),
}

/// The writer properties one self-encoded column follows.
#[derive(Debug)]
pub(crate) struct ColumnSettings {
    pub(crate) descr: ColumnDescPtr,
    codec: Codec,
    pub(crate) statistics: EnabledStatistics,
    pub(crate) page_rows: usize,
    offset_index: bool,
}

impl ColumnSettings {
    /// The settings `props` gives the leaf `descr`; an error for a codec other than ZSTD
    /// or none (the only ones telemetry uses).
    pub(crate) fn new(
        descr: ColumnDescPtr,
        props: &WriterProperties,
    ) -> std::result::Result<Self, String> {
        let path = descr.path();
        let codec = match props.compression(path) {
            Compression::UNCOMPRESSED => Codec::None,
            // One of ZSTD's fast levels, which parquet-rs's `ZstdLevel` (and so `props`)
            // cannot hold, comes from the level the file records; any other from `props`.
            Compression::ZSTD(level) => Codec::Zstd(match recorded_zstd_level(props) {
                Some(fast) if fast < 1 => fast,
                _ => level.compression_level(),
            }),
            other => {
                return Err(format!(
                    "column {path}: self-encoded columns are written with ZSTD or \
                     uncompressed, not {other}"
                ));
            }
        };
        if let Codec::Zstd(level) = codec
            && !zstd::compression_level_range().contains(&level)
        {
            return Err(format!("column {path}: ZSTD level {level} is out of range"));
        }
        Ok(Self {
            codec,
            statistics: props.statistics_enabled(path),
            page_rows: props.data_page_row_count_limit().max(1),
            offset_index: !props.offset_index_disabled(),
            descr,
        })
    }

    pub(crate) fn nullable(&self) -> bool {
        self.descr.max_def_level() > 0
    }

    /// An error if a batch brings `nulls` nulls to a column that cannot hold them.
    pub(crate) fn check_nulls(&self, nulls: usize) -> std::result::Result<(), String> {
        if nulls > 0 && !self.nullable() {
            return Err(format!(
                "column {}: {nulls} nulls in a non-nullable column",
                self.descr.path()
            ));
        }
        Ok(())
    }

    fn compression(&self) -> Result<Compression> {
        Ok(match self.codec {
            Codec::None => Compression::UNCOMPRESSED,
            // The chunk metadata names the codec only; a fast level is recorded as 1.
            Codec::Zstd(level) => Compression::ZSTD(ZstdLevel::try_new(level.max(1))?),
        })
    }
}

/// The level `writer_properties` recorded under [`META_ZSTD_LEVEL`], if any.
fn recorded_zstd_level(props: &WriterProperties) -> Option<i32> {
    props
        .key_value_metadata()?
        .iter()
        .find(|kv| kv.key == META_ZSTD_LEVEL)?
        .value
        .as_deref()?
        .parse()
        .ok()
}

impl Codec {
    fn compress(self, data: Vec<u8>) -> Result<Bytes> {
        match self {
            Codec::None => Ok(Bytes::from(data)),
            Codec::Zstd(level) => zstd_compress(level, &data).map(Bytes::from),
        }
    }
}

thread_local! {
    /// ZSTD contexts by level, kept for the thread's lifetime and shared by every column
    /// and file the thread writes. A context's tables are about a megabyte that a new
    /// context allocates and zeroes again: with a context per column per file, page
    /// faults on that fresh memory took a quarter to a third of the sink writer's time on its
    /// benchmark. A frame does not depend on what the context compressed before, so the
    /// bytes written are the same.
    static ZSTD_CONTEXTS: RefCell<Vec<(i32, zstd::bulk::Compressor<'static>)>> =
        const { RefCell::new(Vec::new()) };
}

/// `data` as one ZSTD frame at `level`, with this thread's context for that level.
fn zstd_compress(level: i32, data: &[u8]) -> Result<Vec<u8>> {
    ZSTD_CONTEXTS
        .with_borrow_mut(|contexts| {
            let at = match contexts.iter().position(|(l, _)| *l == level) {
                Some(at) => at,
                None => {
                    contexts.push((level, zstd::bulk::Compressor::new(level)?));
                    contexts.len() - 1
                }
            };
            contexts[at].1.compress(data)
        })
        .map_err(|e| ParquetError::External(Box::new(e)))
}

/// One data page, encoded but not yet compressed.
#[derive(Debug)]
pub(crate) struct DataPage {
    /// RLE repetition levels (empty for a column outside any list); stored uncompressed.
    pub(crate) rep_levels: Vec<u8>,
    /// RLE definition levels (empty for a required column); stored uncompressed.
    pub(crate) levels: Vec<u8>,
    /// Level entries: one per row outside lists, one per item (or null or empty list)
    /// in a list column.
    pub(crate) entries: usize,
    /// The encoded values.
    pub(crate) values: Vec<u8>,
    pub(crate) encoding: Encoding,
    pub(crate) rows: usize,
    /// Entries without a value (null, or an empty or null list).
    pub(crate) nulls: usize,
    /// Plain-encoded min and max of the page's values (`None` if all are null), for the
    /// column index.
    pub(crate) min_max: Option<(Vec<u8>, Vec<u8>)>,
    /// Bytes of the values before encoding (byte arrays only), for the offset index.
    pub(crate) unencoded_bytes: Option<i64>,
    /// NaN values in the page (floating-point columns only), for the column index.
    pub(crate) nan_count: Option<i64>,
}

impl DataPage {
    /// A page of a column outside any list: an entry per row, levels from `rows`.
    pub(crate) fn flat(
        rows: PageRows,
        values: Vec<u8>,
        encoding: Encoding,
        min_max: Option<(Vec<u8>, Vec<u8>)>,
    ) -> Self {
        Self {
            rep_levels: Vec::new(),
            entries: rows.rows,
            nulls: rows.nulls(),
            levels: rows.levels,
            values,
            encoding,
            rows: rows.rows,
            min_max,
            unencoded_bytes: None,
            nan_count: None,
        }
    }
}

/// A column chunk being assembled from pages.
pub(crate) struct ChunkBuilder<'a> {
    settings: &'a ColumnSettings,
    sink: TrackedWrite<Vec<u8>>,
    column_index: ColumnIndexBuilder,
    offset_index: OffsetIndexBuilder,
    encodings: Vec<Encoding>,
    page_stats: Vec<PageEncodingStats>,
    compressed: u64,
    uncompressed: u64,
    dictionary_offset: Option<i64>,
    first_data_offset: Option<i64>,
    rows: u64,
    entries: u64,
}

impl std::fmt::Debug for ChunkBuilder<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ChunkBuilder")
            .field("column", &self.settings.descr.path())
            .field("rows", &self.rows)
            .field("bytes", &self.sink.bytes_written())
            .finish()
    }
}

impl<'a> ChunkBuilder<'a> {
    pub(crate) fn new(settings: &'a ColumnSettings) -> Self {
        let mut column_index = ColumnIndexBuilder::new(settings.descr.physical_type());
        if settings.statistics != EnabledStatistics::Page {
            column_index.to_invalid();
        }
        Self {
            settings,
            sink: TrackedWrite::new(Vec::new()),
            column_index,
            offset_index: OffsetIndexBuilder::new(),
            encodings: vec![Encoding::RLE],
            page_stats: Vec::new(),
            compressed: 0,
            uncompressed: 0,
            dictionary_offset: None,
            first_data_offset: None,
            rows: 0,
            entries: 0,
        }
    }

    fn write(&mut self, page: Page, uncompressed: usize) -> Result<u64> {
        let (page_type, encoding) = match &page {
            Page::DictionaryPage { encoding, .. } => (PageType::DICTIONARY_PAGE, *encoding),
            Page::DataPageV2 { encoding, .. } => (PageType::DATA_PAGE_V2, *encoding),
            Page::DataPage { encoding, .. } => (PageType::DATA_PAGE, *encoding),
        };
        let spec = SerializedPageWriter::new(&mut self.sink)
            .write_page(CompressedPage::new(page, uncompressed))?;
        self.compressed += spec.compressed_size as u64;
        self.uncompressed += spec.uncompressed_size as u64;
        if !self.encodings.contains(&encoding) {
            self.encodings.push(encoding);
        }
        match self.page_stats.last_mut() {
            Some(s) if s.page_type == page_type && s.encoding == encoding => s.count += 1,
            _ => self.page_stats.push(PageEncodingStats {
                page_type,
                encoding,
                count: 1,
            }),
        }
        self.offset_index_entry(spec.offset, spec.compressed_size, page_type);
        Ok(spec.offset)
    }

    fn offset_index_entry(&mut self, offset: u64, size: usize, page_type: PageType) {
        if page_type != PageType::DICTIONARY_PAGE {
            self.offset_index
                .append_offset_and_size(offset as i64, size as i32);
        }
    }

    /// Writes the dictionary page (plain-encoded values); must come before any data page.
    pub(crate) fn dictionary_page(&mut self, plain: Vec<u8>, values: usize) -> Result<()> {
        let len = plain.len();
        let page = Page::DictionaryPage {
            buf: self.settings.codec.compress(plain)?,
            num_values: values as u32,
            encoding: Encoding::PLAIN,
            is_sorted: false,
        };
        self.dictionary_offset = Some(self.write(page, len)? as i64);
        Ok(())
    }

    /// Writes a `DATA_PAGE_V2` (levels uncompressed, values compressed).
    pub(crate) fn data_page(&mut self, page: DataPage) -> Result<()> {
        let (rep_len, def_len) = (page.rep_levels.len(), page.levels.len());
        let uncompressed = rep_len + def_len + page.values.len();
        let mut buf = page.rep_levels;
        buf.extend_from_slice(&page.levels);
        // As parquet-rs does: values that ZSTD does not make smaller (a short run-length
        // encoding, an empty page of nulls) are stored as they are, flagged uncompressed.
        let is_compressed = match self.settings.codec {
            Codec::None => {
                buf.extend_from_slice(&page.values);
                false
            }
            Codec::Zstd(level) => {
                let packed = zstd_compress(level, &page.values)?;
                let smaller = packed.len() < page.values.len();
                buf.extend_from_slice(if smaller { &packed } else { &page.values });
                smaller
            }
        };
        let written = Page::DataPageV2 {
            buf: Bytes::from(buf),
            num_values: page.entries as u32,
            encoding: page.encoding,
            num_nulls: page.nulls as u32,
            num_rows: page.rows as u32,
            def_levels_byte_len: def_len as u32,
            rep_levels_byte_len: rep_len as u32,
            is_compressed,
            statistics: None,
        };
        let offset = self.write(written, uncompressed)?;
        self.first_data_offset.get_or_insert(offset as i64);
        self.rows += page.rows as u64;
        self.entries += page.entries as u64;
        self.offset_index.append_row_count(page.rows as i64);
        if self.settings.statistics != EnabledStatistics::None {
            self.offset_index
                .append_unencoded_byte_array_data_bytes(page.unencoded_bytes);
        }
        match page.min_max {
            None => {
                self.column_index
                    .append(true, vec![], vec![], page.nulls as i64, page.nan_count)
            }
            Some((min, max)) => {
                self.column_index
                    .append(false, min, max, page.nulls as i64, page.nan_count)
            }
        }
        Ok(())
    }

    /// The chunk's bytes (starting at offset 0) and what the row group needs to splice
    /// them in. `statistics` go into the chunk metadata when statistics are enabled;
    /// `boundary_order` is the order of the pages' min/max in the column's sort order.
    pub(crate) fn finish(
        mut self,
        statistics: Statistics,
        boundary_order: BoundaryOrder,
        unencoded_bytes: Option<i64>,
    ) -> Result<(Bytes, ColumnCloseResult)> {
        self.column_index.set_boundary_order(boundary_order);
        let column_index = if self.column_index.valid() {
            Some(self.column_index.build()?)
        } else {
            None
        };
        let data_offset = self
            .first_data_offset
            .or(self.dictionary_offset)
            .unwrap_or(0);
        let mut metadata = ColumnChunkMetaData::builder(self.settings.descr.clone())
            .set_compression(self.settings.compression()?)
            .set_encodings_mask(EncodingMask::new_from_encodings(self.encodings.iter()))
            .set_page_encoding_stats(self.page_stats)
            .set_total_compressed_size(self.compressed as i64)
            .set_total_uncompressed_size(self.uncompressed as i64)
            .set_num_values(self.entries as i64)
            .set_data_page_offset(data_offset)
            .set_dictionary_page_offset(self.dictionary_offset);
        if self.settings.statistics != EnabledStatistics::None {
            metadata = metadata
                .set_statistics(statistics)
                .set_unencoded_byte_array_data_bytes(unencoded_bytes);
        }
        let metadata = metadata.build()?;
        let bytes = Bytes::from(self.sink.into_inner()?);
        let close = ColumnCloseResult {
            bytes_written: bytes.len() as u64,
            rows_written: self.rows,
            metadata,
            bloom_filter: None,
            column_index,
            offset_index: self
                .settings
                .offset_index
                .then(|| self.offset_index.build()),
        };
        Ok((bytes, close))
    }
}

/// Tracks whether successive pages' (min, max) keys ascend or descend.
#[derive(Debug, Clone, Copy)]
pub(crate) struct BoundaryTracker<K> {
    last: Option<(K, K)>,
    ascending: bool,
    descending: bool,
}

impl<K: Ord + Copy> BoundaryTracker<K> {
    pub(crate) fn new() -> Self {
        Self {
            last: None,
            ascending: true,
            descending: true,
        }
    }

    /// Records a page with values (all-null pages do not count).
    pub(crate) fn page(&mut self, min: K, max: K) {
        if let Some((lo, hi)) = self.last {
            self.ascending &= lo <= min && hi <= max;
            self.descending &= lo >= min && hi >= max;
        }
        self.last = Some((min, max));
    }

    pub(crate) fn order(&self) -> BoundaryOrder {
        match (self.ascending, self.descending) {
            (true, _) => BoundaryOrder::ASCENDING,
            (false, true) => BoundaryOrder::DESCENDING,
            (false, false) => BoundaryOrder::UNORDERED,
        }
    }
}

/// A fixed-width column's buffered row group: its present values and its rows.
#[derive(Debug)]
pub(crate) struct ValueBuffer<V> {
    pub(crate) values: Vec<V>,
    pub(crate) rows: RowLevels,
}

impl<V> ValueBuffer<V> {
    pub(crate) fn new(nullable: bool) -> Self {
        Self {
            values: Vec::new(),
            rows: RowLevels::new(nullable),
        }
    }

    /// Appends a primitive array's rows, and its present values mapped by `convert`.
    pub(crate) fn append<T: ArrowPrimitiveType>(
        &mut self,
        array: &PrimitiveArray<T>,
        convert: impl Fn(T::Native) -> V,
    ) {
        self.append_slots(array.values().iter().map(|&v| convert(v)), array.nulls());
    }

    /// Appends a batch's rows: `slots` holds a value per row (a null's slot too), and
    /// only those of the rows `nulls` marks valid are kept.
    pub(crate) fn append_slots(
        &mut self,
        slots: impl ExactSizeIterator<Item = V>,
        nulls: Option<&NullBuffer>,
    ) {
        match nulls.filter(|n| n.null_count() > 0) {
            None => {
                self.rows.present(slots.len());
                self.values.extend(slots);
            }
            Some(nulls) => {
                for (v, valid) in slots.zip(nulls.iter()) {
                    if valid {
                        self.values.push(v);
                    }
                    self.rows.push(valid);
                }
            }
        }
    }

    pub(crate) fn reserve(&mut self, rows: usize) {
        self.values.reserve(rows);
    }

    pub(crate) fn buffered_bytes(&self) -> usize {
        self.values.len() * std::mem::size_of::<V>() + self.rows.buffered_bytes()
    }

    /// Empties the buffer after a row group. Its memory is freed, not kept: an open file
    /// per partition would otherwise hold a row group's worth of buffers between row
    /// groups.
    pub(crate) fn release(&mut self) {
        *self = Self::new(self.rows.nullable);
    }
}

/// A column's rows: how many, and for a nullable column which are present (definition
/// level 1) or null (0). Levels are stored, one byte per row, only from the row group's
/// first null on: telemetry is mostly present, and a page without nulls is one RLE run.
#[derive(Debug, Default)]
pub(crate) struct RowLevels {
    nullable: bool,
    /// Whether a null has come; until then `levels` stays empty.
    has_nulls: bool,
    /// One level per row once a null has come.
    levels: Vec<u8>,
    count: usize,
}

/// One page's share of a column's rows.
#[derive(Debug)]
pub(crate) struct PageRows {
    pub(crate) rows: usize,
    /// The page's definition levels, RLE-encoded (empty for a required column).
    pub(crate) levels: Vec<u8>,
    /// The page's present values, as a range of the column's value buffer.
    pub(crate) values: std::ops::Range<usize>,
}

impl PageRows {
    pub(crate) fn nulls(&self) -> usize {
        self.rows - self.values.len()
    }
}

impl RowLevels {
    pub(crate) fn new(nullable: bool) -> Self {
        Self {
            nullable,
            ..Self::default()
        }
    }

    /// Appends `n` rows with a value each.
    pub(crate) fn present(&mut self, n: usize) {
        if self.has_nulls {
            self.levels.resize(self.levels.len() + n, 1);
        }
        self.count += n;
    }

    /// Appends one row, null or not (only a nullable column has nulls).
    pub(crate) fn push(&mut self, present: bool) {
        debug_assert!(self.nullable || present);
        if !present && !self.has_nulls {
            self.has_nulls = true;
            self.levels.resize(self.count, 1);
        }
        if self.has_nulls {
            self.levels.push(u8::from(present));
        }
        self.count += 1;
    }

    pub(crate) fn buffered_bytes(&self) -> usize {
        self.levels.len()
    }

    /// Cuts the rows into pages of at most `page_rows` (one empty page when there are no
    /// rows, so that a chunk always has a data page).
    pub(crate) fn pages(&self, page_rows: usize) -> Vec<PageRows> {
        let mut pages = Vec::new();
        let (mut row, mut value) = (0, 0);
        loop {
            let rows = page_rows.min(self.count - row);
            let mut levels = Vec::new();
            let present = if !self.nullable {
                rows
            } else if !self.has_nulls {
                if rows > 0 {
                    crate::rle::write_rle(1, rows, 1, &mut levels);
                }
                rows
            } else {
                let mut present = 0;
                crate::rle::encode(&self.levels[row..row + rows], 1, &mut levels, |l, len| {
                    if l == 1 {
                        present += len;
                    }
                });
                present
            };
            pages.push(PageRows {
                rows,
                levels,
                values: value..value + present,
            });
            value += present;
            row += rows;
            if row >= self.count {
                return pages;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn page(seed: u64) -> Vec<u8> {
        (0..50_000u64)
            .map(|i| ((i * seed) ^ (i >> 3)).to_le_bytes()[0] % 17)
            .collect()
    }

    #[test]
    fn a_shared_context_compresses_every_page_as_a_fresh_one_would() {
        let pages = [page(7), page(3), page(7)];
        // Interleaved levels, so each level's context has compressed other pages and
        // other levels have run on this thread in between.
        for &level in &[1, -5, 3, 1, -5] {
            for p in &pages {
                let fresh = zstd::bulk::Compressor::new(level)
                    .unwrap()
                    .compress(p)
                    .unwrap();
                let shared = zstd_compress(level, p).unwrap();
                assert_eq!(shared, fresh, "level {level}");
                assert_eq!(zstd::bulk::decompress(&shared, p.len()).unwrap(), *p);
            }
        }
        let levels: Vec<i32> = ZSTD_CONTEXTS.with_borrow(|c| c.iter().map(|(l, _)| *l).collect());
        assert_eq!(levels, [1, -5, 3], "one context per level");
    }

    #[test]
    fn pages_compress_at_the_level_the_column_asks_for() {
        let p = page(5);
        let fast = Codec::Zstd(-7).compress(p.clone()).unwrap();
        let slow = Codec::Zstd(19).compress(p.clone()).unwrap();
        assert!(fast.len() > slow.len(), "{} vs {}", fast.len(), slow.len());
        assert_eq!(Codec::None.compress(p.clone()).unwrap(), p);
    }
}
