//! The cheap intake for GPU samples: a batch of rows whose strings are interned ids.
//!
//! [`GpuSample`] carries six `Arc<str>` fields; a sampler clones six pointers per row and
//! the sink's writer thread drops them again (atomic reference counts bouncing between
//! two cores), which was about a tenth of the writer's time. A [`GpuBatch`] carries the
//! same values with every string replaced by a [`StrId`] into a table shared by all the
//! batches of one [`GpuBatchBuilder`]: a row is plain data (`Copy`), the table travels as
//! one `Arc`, and the writer thread touches no reference count per row.
//!
//! ```
//! use marshal_telemetry::{GpuBatchBuilder, GpuRow, Health};
//! let mut b = GpuBatchBuilder::new();
//! let (cluster, node) = (b.intern("prod"), b.intern("node-001"));
//! let (uuid, kind) = (b.intern("GPU-0000"), b.intern("NVIDIA H100 80GB HBM3"));
//! b.push(GpuRow {
//!     power_mw: Some(412_500),
//!     sm_util_pct: Some(97.0),
//!     ..GpuRow::new(1_741_910_400_000_000, cluster, node, 0, uuid, kind)
//! });
//! let batch = b.take(); // hand it to `TelemetrySink::send`; `b` keeps its string table
//! assert_eq!(batch.len(), 1);
//! assert_eq!(batch.row(0).to_sample(&batch).power_mw, Some(412_500));
//! # let _ = Health::Ok;
//! ```
//!
//! Validation is the same as for [`GpuSample`] rows (the sink runs both through one
//! function): a broken identity or timestamp rejects the row, a broken measurement is
//! nulled, both counted. A [`StrId`] the batch's table does not hold (one from another
//! builder) reads as the empty string, so its row is rejected as `empty`.

use std::collections::HashMap;
use std::sync::Arc;

use crate::columns::GpuRef;
use crate::schema::{GpuSample, Health, MemPhase};

/// An interned string of a [`GpuBatchBuilder`] (an index into its table). `StrId::EMPTY`
/// (the default) is the empty string.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default, PartialOrd, Ord)]
pub struct StrId(u32);

impl StrId {
    /// The empty string (id 0 of every table).
    pub const EMPTY: StrId = StrId(0);
}

/// The strings of a builder, append-only: ids handed out stay valid in later batches.
#[derive(Debug, Clone, PartialEq)]
struct StrTable {
    strings: Vec<Arc<str>>,
}

/// A range of a batch's per-link value array.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Links {
    start: u32,
    len: u32,
}

/// One GPU sample with interned strings: the fields of [`GpuSample`] (same meaning and
/// units), strings as [`StrId`]s, per-link NVLink counters passed to
/// [`GpuBatchBuilder::push_with_links`].
#[derive(Debug, Clone, Copy, PartialEq, Default)]
#[allow(missing_docs)]
pub struct GpuRow {
    pub timestamp_us: i64,
    pub cluster: StrId,
    pub node: StrId,
    pub gpu_index: u16,
    pub gpu_uuid: StrId,
    pub gpu_type: StrId,
    pub sm_util_pct: Option<f32>,
    pub mem_util_pct: Option<f32>,
    pub mem_used_bytes: Option<u64>,
    pub mem_total_bytes: Option<u64>,
    pub nvlink_tx_kib: Option<u64>,
    pub nvlink_rx_kib: Option<u64>,
    pub pcie_tx_kib_per_s: Option<u32>,
    pub pcie_rx_kib_per_s: Option<u32>,
    pub temperature_c: Option<f32>,
    pub power_mw: Option<u32>,
    pub sm_clock_mhz: Option<u32>,
    pub mem_clock_mhz: Option<u32>,
    pub throttle_reasons: Option<u64>,
    pub ecc_corrected: Option<u64>,
    pub ecc_uncorrected: Option<u64>,
    pub xid: Option<u32>,
    pub health: Health,
    pub job_id: Option<StrId>,
    pub worker: Option<StrId>,
    pub mem_phase: Option<MemPhase>,
    pub mig_mode: Option<bool>,
}

impl GpuRow {
    /// A row with its identity set and every measurement null.
    pub fn new(
        timestamp_us: i64,
        cluster: StrId,
        node: StrId,
        gpu_index: u16,
        gpu_uuid: StrId,
        gpu_type: StrId,
    ) -> Self {
        Self {
            timestamp_us,
            cluster,
            node,
            gpu_index,
            gpu_uuid,
            gpu_type,
            ..Default::default()
        }
    }

    /// The row as a [`GpuSample`], its strings resolved in `batch`'s table (per-link
    /// counters are not carried by the row; see [`GpuBatch::sample`]).
    pub fn to_sample(&self, batch: &GpuBatch) -> GpuSample {
        let s = |id: StrId| batch.str(id).clone();
        GpuSample {
            timestamp_us: self.timestamp_us,
            cluster: s(self.cluster),
            node: s(self.node),
            gpu_index: self.gpu_index,
            gpu_uuid: s(self.gpu_uuid),
            gpu_type: s(self.gpu_type),
            sm_util_pct: self.sm_util_pct,
            mem_util_pct: self.mem_util_pct,
            mem_used_bytes: self.mem_used_bytes,
            mem_total_bytes: self.mem_total_bytes,
            nvlink_tx_kib: self.nvlink_tx_kib,
            nvlink_rx_kib: self.nvlink_rx_kib,
            nvlink_tx_per_link_kib: None,
            nvlink_rx_per_link_kib: None,
            pcie_tx_kib_per_s: self.pcie_tx_kib_per_s,
            pcie_rx_kib_per_s: self.pcie_rx_kib_per_s,
            temperature_c: self.temperature_c,
            power_mw: self.power_mw,
            sm_clock_mhz: self.sm_clock_mhz,
            mem_clock_mhz: self.mem_clock_mhz,
            throttle_reasons: self.throttle_reasons,
            ecc_corrected: self.ecc_corrected,
            ecc_uncorrected: self.ecc_uncorrected,
            xid: self.xid,
            health: self.health,
            job_id: self.job_id.map(s),
            worker: self.worker.map(s),
            mem_phase: self.mem_phase,
            mig_mode: self.mig_mode,
        }
    }
}

/// GPU samples of many GPUs with interned strings, made by a [`GpuBatchBuilder`] and sent
/// with [`crate::TelemetrySink::send`] like a `Vec<GpuSample>`.
#[derive(Debug, Clone, PartialEq)]
pub struct GpuBatch {
    table: Arc<StrTable>,
    rows: Vec<GpuRow>,
    /// Per-link counters: (tx, rx) ranges of `link_values` per row; empty when no row
    /// has any.
    links: Vec<(Option<Links>, Option<Links>)>,
    link_values: Vec<u64>,
}

impl GpuBatch {
    /// A batch being collected (its table is attached by [`GpuBatchBuilder::take`]).
    fn collecting(rows: usize, links: usize, values: usize) -> Self {
        GpuBatch {
            table: Arc::new(StrTable {
                strings: vec![Arc::from("")],
            }),
            rows: Vec::with_capacity(rows),
            links: Vec::with_capacity(links),
            link_values: Vec::with_capacity(values),
        }
    }

    /// Rows in the batch.
    pub fn len(&self) -> usize {
        self.rows.len()
    }

    /// `true` when there are no rows.
    pub fn is_empty(&self) -> bool {
        self.rows.is_empty()
    }

    /// Row `i` (panics when out of range).
    pub fn row(&self, i: usize) -> &GpuRow {
        &self.rows[i]
    }

    /// The rows.
    pub fn rows(&self) -> &[GpuRow] {
        &self.rows
    }

    /// The string an id stands for (the empty string for an id this table lacks).
    pub fn str(&self, id: StrId) -> &Arc<str> {
        let t = &self.table.strings;
        t.get(id.0 as usize).unwrap_or(&t[0])
    }

    fn link_slice(&self, l: Option<Links>) -> Option<&[u64]> {
        l.map(|l| &self.link_values[l.start as usize..(l.start + l.len) as usize])
    }

    /// Row `i` as a [`GpuSample`], per-link counters included.
    pub fn sample(&self, i: usize) -> GpuSample {
        let mut s = self.rows[i].to_sample(self);
        if let Some((tx, rx)) = self.links.get(i) {
            s.nvlink_tx_per_link_kib = self.link_slice(*tx).map(<[u64]>::to_vec);
            s.nvlink_rx_per_link_kib = self.link_slice(*rx).map(<[u64]>::to_vec);
        }
        s
    }

    /// Row `i` borrowed for validation and appending.
    #[inline]
    pub(crate) fn get(&self, i: usize) -> GpuRef<'_> {
        let r = &self.rows[i];
        let (tx, rx) = self.links.get(i).copied().unwrap_or((None, None));
        GpuRef {
            timestamp_us: r.timestamp_us,
            cluster: self.str(r.cluster),
            node: self.str(r.node),
            gpu_index: r.gpu_index,
            gpu_uuid: self.str(r.gpu_uuid),
            gpu_type: self.str(r.gpu_type),
            sm_util_pct: r.sm_util_pct,
            mem_util_pct: r.mem_util_pct,
            mem_used_bytes: r.mem_used_bytes,
            mem_total_bytes: r.mem_total_bytes,
            nvlink_tx_kib: r.nvlink_tx_kib,
            nvlink_rx_kib: r.nvlink_rx_kib,
            nvlink_tx_per_link_kib: self.link_slice(tx),
            nvlink_rx_per_link_kib: self.link_slice(rx),
            pcie_tx_kib_per_s: r.pcie_tx_kib_per_s,
            pcie_rx_kib_per_s: r.pcie_rx_kib_per_s,
            temperature_c: r.temperature_c,
            power_mw: r.power_mw,
            sm_clock_mhz: r.sm_clock_mhz,
            mem_clock_mhz: r.mem_clock_mhz,
            throttle_reasons: r.throttle_reasons,
            ecc_corrected: r.ecc_corrected,
            ecc_uncorrected: r.ecc_uncorrected,
            xid: r.xid,
            health: r.health,
            job_id: r.job_id.map(|j| self.str(j)),
            worker: r.worker.map(|w| self.str(w)),
            mem_phase: r.mem_phase,
            mig_mode: r.mig_mode,
        }
    }
}

/// Builds [`GpuBatch`]es: interns strings once (keep one builder per sampler, so ids
/// stay valid from batch to batch) and collects rows until [`GpuBatchBuilder::take`].
#[derive(Debug, Clone)]
pub struct GpuBatchBuilder {
    table: Arc<StrTable>,
    index: HashMap<Arc<str>, StrId>,
    batch: GpuBatch,
}

impl Default for GpuBatchBuilder {
    fn default() -> Self {
        Self::new()
    }
}

impl GpuBatchBuilder {
    /// An empty builder (its table holds only the empty string).
    pub fn new() -> Self {
        let empty: Arc<str> = Arc::from("");
        let table = Arc::new(StrTable {
            strings: vec![empty.clone()],
        });
        Self {
            index: HashMap::from([(empty, StrId::EMPTY)]),
            batch: GpuBatch::collecting(0, 0, 0),
            table,
        }
    }

    /// The id of `s`, adding it to the table if new. (Look ids up once per GPU and keep
    /// them: this hashes the string.)
    pub fn intern(&mut self, s: &str) -> StrId {
        if let Some(id) = self.index.get(s) {
            return *id;
        }
        let id = StrId(self.table.strings.len() as u32);
        let s: Arc<str> = Arc::from(s);
        // Copies the table only while the sink still holds a batch that shares it.
        Arc::make_mut(&mut self.table).strings.push(s.clone());
        self.index.insert(s, id);
        id
    }

    /// Rows collected since the last [`Self::take`].
    pub fn len(&self) -> usize {
        self.batch.rows.len()
    }

    /// `true` when no row was collected since the last [`Self::take`].
    pub fn is_empty(&self) -> bool {
        self.batch.rows.is_empty()
    }

    /// Adds a row without per-link counters.
    #[inline]
    pub fn push(&mut self, row: GpuRow) {
        self.batch.rows.push(row);
        if !self.batch.links.is_empty() {
            self.batch.links.push((None, None));
        }
    }

    /// Adds a row with per-link NVLink counters (KiB; `None` when not collected).
    pub fn push_with_links(&mut self, row: GpuRow, tx: Option<&[u64]>, rx: Option<&[u64]>) {
        let b = &mut self.batch;
        if b.links.len() < b.rows.len() {
            b.links.resize(b.rows.len(), (None, None));
        }
        let mut add = |v: Option<&[u64]>| {
            v.map(|v| {
                let start = b.link_values.len() as u32;
                b.link_values.extend_from_slice(v);
                Links {
                    start,
                    len: v.len() as u32,
                }
            })
        };
        let l = (add(tx), add(rx));
        b.links.push(l);
        b.rows.push(row);
    }

    /// Adds a [`GpuSample`], interning its strings (six hash lookups: for converting
    /// existing rows; a sampler keeps its ids and pushes [`GpuRow`]s).
    pub fn push_sample(&mut self, s: &GpuSample) {
        let row = GpuRow {
            timestamp_us: s.timestamp_us,
            cluster: self.intern(&s.cluster),
            node: self.intern(&s.node),
            gpu_index: s.gpu_index,
            gpu_uuid: self.intern(&s.gpu_uuid),
            gpu_type: self.intern(&s.gpu_type),
            sm_util_pct: s.sm_util_pct,
            mem_util_pct: s.mem_util_pct,
            mem_used_bytes: s.mem_used_bytes,
            mem_total_bytes: s.mem_total_bytes,
            nvlink_tx_kib: s.nvlink_tx_kib,
            nvlink_rx_kib: s.nvlink_rx_kib,
            pcie_tx_kib_per_s: s.pcie_tx_kib_per_s,
            pcie_rx_kib_per_s: s.pcie_rx_kib_per_s,
            temperature_c: s.temperature_c,
            power_mw: s.power_mw,
            sm_clock_mhz: s.sm_clock_mhz,
            mem_clock_mhz: s.mem_clock_mhz,
            throttle_reasons: s.throttle_reasons,
            ecc_corrected: s.ecc_corrected,
            ecc_uncorrected: s.ecc_uncorrected,
            xid: s.xid,
            health: s.health,
            job_id: s.job_id.as_deref().map(|j| self.intern(j)),
            worker: s.worker.as_deref().map(|w| self.intern(w)),
            mem_phase: s.mem_phase,
            mig_mode: s.mig_mode,
        };
        let (tx, rx) = (
            s.nvlink_tx_per_link_kib.as_deref(),
            s.nvlink_rx_per_link_kib.as_deref(),
        );
        if tx.is_some() || rx.is_some() {
            self.push_with_links(row, tx, rx);
        } else {
            self.push(row);
        }
    }

    /// The rows collected so far, as a batch; the builder keeps its string table and
    /// starts a new batch of the same capacity.
    pub fn take(&mut self) -> GpuBatch {
        let cap = self.batch.rows.len();
        let links_cap = self.batch.links.len();
        let values_cap = self.batch.link_values.len();
        let mut out = std::mem::replace(
            &mut self.batch,
            GpuBatch::collecting(cap, links_cap, values_cap),
        );
        // The table is attached only now, so `intern` never copies it for a batch that
        // is still being collected.
        out.table = self.table.clone();
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn interned_ids_survive_take_and_new_strings() {
        let mut b = GpuBatchBuilder::new();
        let c = b.intern("c");
        let n = b.intern("n");
        assert_eq!(b.intern("c"), c);
        b.push(GpuRow::new(1, c, n, 0, c, n));
        let first = b.take();
        let j = b.intern("job");
        b.push_with_links(
            GpuRow {
                job_id: Some(j),
                ..GpuRow::new(2, c, n, 1, c, n)
            },
            Some(&[1, 2]),
            None,
        );
        b.push(GpuRow::new(3, c, n, 2, c, n));
        let second = b.take();
        assert_eq!(&**first.str(n), "n");
        assert_eq!(&**first.str(j), "", "an id the table lacks reads as empty");
        assert_eq!(second.sample(0).job_id.as_deref(), Some("job"));
        assert_eq!(second.sample(0).nvlink_tx_per_link_kib, Some(vec![1, 2]));
        assert_eq!(second.sample(0).nvlink_rx_per_link_kib, None);
        assert_eq!(second.sample(1).nvlink_tx_per_link_kib, None);
        assert!(b.is_empty());
    }
}
