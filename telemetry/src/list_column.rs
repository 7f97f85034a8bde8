//! List-of-integer column chunks (the NVLink per-link counters), encoded by the writer
//! itself.
//!
//! A GPU with NVLink reports a dozen per-link counters per direction each sample. Through
//! parquet-rs's Arrow writer a list column costs about 190 instructions per item: levels
//! are computed item by item through its generic nested-level builder, then written and
//! counted one mini-batch at a time, and the items go through its per-value delta
//! encoder; on the sink benchmark the two per-link columns cost twice as much as the
//! other 29 columns together. Here a batch's list lengths and items are copied once; at
//! the end of the row group each page's repetition and definition levels are generated
//! from the lengths and run-length encoded ([`crate::rle`]), and its items are
//! delta-encoded with the integer columns' encoder and statistics
//! ([`crate::int_column`]).
//!
//! Levels, as the format defines them for a list of required items: an entry per item,
//! repetition level 0 for a list's first item and 1 for the rest; definition level
//! `max` for an item, `max - 1` for an empty list (one entry) and `max - 2` for a null
//! list (one entry; only when the list is nullable). Entries without an item count as
//! nulls in page headers and statistics, as parquet-rs counts them.
//!
//! Which columns: a `List` (32-bit offsets) of non-null integers whose leaf the writer
//! properties ask to delta-encode without a dictionary; other nested columns stay with
//! parquet-rs.

use arrow_array::Array;
use arrow_array::cast::AsArray;
use arrow_schema::DataType;
use bytes::Bytes;
use parquet::basic::Encoding;
use parquet::column::writer::ColumnCloseResult;
use parquet::file::properties::WriterProperties;
use parquet::schema::types::ColumnDescPtr;

use crate::chunk::{ChunkBuilder, ColumnChunkEncoder, ColumnSettings, DataPage};
use crate::int_column::{IntOrder, IntPages, delta_encoded, supported, widen_into};
use crate::rle;

/// The length recorded for a null list.
const NULL_LIST: u32 = u32::MAX;

/// One list column of the row group being written.
#[derive(Debug)]
pub(crate) struct ListColumn {
    settings: ColumnSettings,
    order: IntOrder,
    /// The definition level of an item (2 for a nullable list, 1 for a required one).
    max_def: u8,
    /// Per row: its list's length, or [`NULL_LIST`].
    lengths: Vec<u32>,
    /// Every list's items, in row order, as the integer columns store them.
    items: Vec<i64>,
    /// A batch's items, those of null lists included, before those are dropped.
    scratch: Vec<i64>,
}

impl ListColumn {
    /// A column for the leaf `descr` of Arrow type `data_type`, if it is a list this module
    /// writes and the properties ask for plain delta encoding; `None` otherwise.
    pub(crate) fn for_leaf(
        descr: ColumnDescPtr,
        data_type: &DataType,
        props: &WriterProperties,
    ) -> Result<Option<Self>, String> {
        let DataType::List(item) = data_type else {
            return Ok(None);
        };
        let Some(order) = IntOrder::of(&descr) else {
            return Ok(None);
        };
        let max_def = match descr.max_def_level() {
            1 => 1,
            2 => 2,
            _ => return Ok(None),
        };
        if item.is_nullable()
            || !supported(item.data_type())
            || descr.max_rep_level() != 1
            || !delta_encoded(&descr, props)
        {
            return Ok(None);
        }
        Ok(Some(Self {
            settings: ColumnSettings::new(descr, props)?,
            order,
            max_def,
            lengths: Vec::new(),
            items: Vec::new(),
            scratch: Vec::new(),
        }))
    }

    fn encode(&self) -> parquet::errors::Result<(Bytes, ColumnCloseResult)> {
        let mut chunk = ChunkBuilder::new(&self.settings);
        let mut pages = IntPages::new(self.order);
        let page_rows = self.settings.page_rows;
        // A chunk has at least one data page, even an empty one.
        let page_lengths: Vec<&[u32]> = if self.lengths.is_empty() {
            vec![&[]]
        } else {
            self.lengths.chunks(page_rows).collect()
        };
        let mut item = 0;
        let mut levels = Levels::default();
        for lengths in page_lengths {
            levels.page(lengths, self.max_def);
            let items = &self.items[item..item + levels.entries - levels.nulls];
            item += items.len();
            let (values, min_max) = pages.page(items, levels.nulls);
            chunk.data_page(DataPage {
                rep_levels: std::mem::take(&mut levels.rep),
                levels: std::mem::take(&mut levels.def),
                entries: levels.entries,
                values,
                encoding: Encoding::DELTA_BINARY_PACKED,
                rows: lengths.len(),
                nulls: levels.nulls,
                min_max,
                unencoded_bytes: None,
                nan_count: None,
            })?;
        }
        let (statistics, boundary) = pages.finish();
        chunk.finish(statistics, boundary, None)
    }
}

/// One page's repetition and definition levels, RLE-encoded, and their counts.
#[derive(Debug, Default)]
struct Levels {
    rep: Vec<u8>,
    def: Vec<u8>,
    /// Level entries (items, null lists and empty lists).
    entries: usize,
    /// Entries without an item.
    nulls: usize,
    /// One byte per entry, for a page whose lists differ.
    scratch: Vec<u8>,
}

impl Levels {
    /// The levels of a page of lists with these lengths.
    fn page(&mut self, lengths: &[u32], max_def: u8) {
        self.rep = Vec::new();
        self.def = Vec::new();
        let def_width = rle::bit_width(u32::from(max_def));
        let uniform = lengths
            .first()
            .filter(|&&l| lengths.iter().all(|&m| m == l));
        match uniform {
            None if lengths.is_empty() => (self.entries, self.nulls) = (0, 0),
            // Pages of null (or empty) lists: one run each, as Hopper's per-link counters
            // are, without a byte per row.
            Some(&len) if len == NULL_LIST || len == 0 => {
                let level = if len == 0 { max_def - 1 } else { max_def - 2 };
                (self.entries, self.nulls) = (lengths.len(), lengths.len());
                rle::write_rle(0, lengths.len(), 1, &mut self.rep);
                rle::write_rle(u32::from(level), lengths.len(), def_width, &mut self.def);
            }
            Some(&len) => {
                let entries = lengths.len() * len as usize;
                (self.entries, self.nulls) = (entries, 0);
                rle::write_uniform_repetition(len as usize, lengths.len(), &mut self.rep);
                rle::write_rle(u32::from(max_def), entries, def_width, &mut self.def);
            }
            None => {
                let levels = &mut self.scratch;
                levels.clear();
                let mut nulls = 0;
                for &len in lengths {
                    match len {
                        NULL_LIST | 0 => {
                            levels.push(0);
                            nulls += 1;
                        }
                        len => {
                            levels.push(0);
                            levels.resize(levels.len() + len as usize - 1, 1);
                        }
                    }
                }
                (self.entries, self.nulls) = (levels.len(), nulls);
                rle::encode(levels, 1, &mut self.rep, |_, _| {});
                if nulls == 0 {
                    rle::write_rle(u32::from(max_def), levels.len(), def_width, &mut self.def);
                } else {
                    levels.clear();
                    for &len in lengths {
                        match len {
                            NULL_LIST => levels.push(max_def - 2),
                            0 => levels.push(max_def - 1),
                            len => levels.resize(levels.len() + len as usize, max_def),
                        }
                    }
                    rle::encode(levels, def_width, &mut self.def, |_, _| {});
                }
            }
        }
    }
}

impl ColumnChunkEncoder for ListColumn {
    fn buffered_bytes(&self) -> usize {
        self.lengths.len() * 4 + self.items.len() * 8
    }

    fn push(&mut self, array: &dyn Array) -> Result<(), String> {
        let path = self.settings.descr.path();
        let list = array
            .as_list_opt::<i32>()
            .ok_or_else(|| format!("column {path}: expected a List, got {}", array.data_type()))?;
        if self.max_def < 2 && list.null_count() > 0 {
            return Err(format!(
                "column {path}: {} null lists in a non-nullable column",
                list.null_count()
            ));
        }
        let offsets = list.value_offsets();
        let (first, last) = (offsets[0] as usize, offsets[list.len()] as usize);
        let items = list.values().slice(first, last - first);
        let column = |e: String| format!("column {path}: {e}");
        if list.null_count() == list.len() {
            self.lengths
                .resize(self.lengths.len() + list.len(), NULL_LIST);
            return Ok(());
        }
        if self.items.capacity() == 0 {
            // `reserve` knows the row group's rows, not its lists' lengths: size the items
            // for the rest of the row group at this batch's items per row.
            let rows_left = (self.lengths.capacity() - self.lengths.len()).max(list.len());
            self.items
                .reserve(rows_left * items.len().div_ceil(list.len().max(1)));
        }
        match list.nulls().filter(|n| n.null_count() > 0) {
            None => {
                widen_into(&items, &mut self.items).map_err(column)?;
                (self.lengths).extend(offsets.windows(2).map(|w| (w[1] - w[0]) as u32));
            }
            Some(nulls) => {
                self.scratch.clear();
                widen_into(&items, &mut self.scratch).map_err(column)?;
                for (w, valid) in offsets.windows(2).zip(nulls.iter()) {
                    let (start, end) = (w[0] as usize - first, w[1] as usize - first);
                    if valid {
                        self.items.extend_from_slice(&self.scratch[start..end]);
                        self.lengths.push((end - start) as u32);
                    } else {
                        self.lengths.push(NULL_LIST);
                    }
                }
            }
        }
        Ok(())
    }

    fn reserve(&mut self, rows: usize) {
        self.lengths.reserve(rows);
    }

    fn finish(&mut self) -> parquet::errors::Result<(Bytes, ColumnCloseResult)> {
        let chunk = self.encode();
        // Freed, not kept (see `ValueBuffer::release`).
        self.lengths = Vec::new();
        self.items = Vec::new();
        self.scratch = Vec::new();
        chunk
    }
}

#[cfg(test)]
mod tests;
