//! Public GPU-cluster traces as Marshal's domain types: jobs ([`Job`]) and clusters
//! ([`ClusterSpec`]).
//!
//! # What is here
//!
//! - Alibaba openb (v2023, the FGD paper): node lists → [`parse_openb_nodes`], pod lists
//!   (11- and 5-column) → [`parse_openb_pods`].
//! - Microsoft Philly (2017, Pollux's copy): jobs → [`parse_philly`], 7-day windows →
//!   [`philly_window`], machines → [`philly_cluster`].
//! - Named clusters ([`cluster_preset`], [`CLUSTER_PRESETS`]) and name-or-path resolution
//!   for a CLI ([`load_cluster`], [`load_trace`], [`TRACE_NAMES`]).
//!
//! # Design decisions
//!
//! - **Bundled, not fetched.** The files the presets and bundled traces need are compiled
//!   in with `include_str!` (about 4.4 MB; origin and licences in `data/ATTRIBUTION.md`),
//!   so a binary works anywhere and tests never depend on `../shared` existing. The
//!   other openb variants are read from the traces directory when asked for by name, with
//!   an error saying where they were looked for.
//! - **Skip bad rows, fail bad files.** A row with a malformed field (not a number, NaN,
//!   negative, out of range, an unknown GPU model, …) is skipped and counted in a
//!   [`ParseReport`] with its 1-based line, field and reason, so one bad row in 80,000
//!   does not lose a trace, and nothing is dropped silently. A missing or unknown header,
//!   an empty file or a file with no usable row is a [`DatasetError`] naming the file.
//!   Nothing here panics on input.
//! - **Columns by name.** Columns are found by header name, which is also how the two
//!   openb pod schemas and the trace formats of a file path are told apart.
//! - **Mappings are documented where they happen**: on [`parse_openb_pods`] (GPU shares,
//!   qos → priority/preemption, lifetimes as work), [`parse_philly`] (one worker per GPU,
//!   times rebased) and [`philly_cluster`] (Hu et al.'s corrected GPU counts).
//! - **Published facts are tests.** Node, GPU, pod and job counts the papers and
//!   `SOURCE.md` files state are asserted against the bundled files.
//!
//! # Assumptions (no trace publishes these)
//!
//! - Rack layout: 16 nodes per rack and 8 racks per spine, filled in file order, for openb
//!   and Philly.
//! - NVLink: openb's 8-GPU V100/G2/G3 servers are one NVLink island each; other openb
//!   servers and all Philly servers are PCIe only.
//! - Link bandwidths: V100-era figures (NVLink 2, PCIe Gen3, 100 Gb/s fabric, 2:1 spine)
//!   for openb and Philly; AWS g4dn figures for `pollux-64`.
//! - Philly nodes get 32 cores and 256 GiB, which its jobs (0 CPU, 0 memory) never
//!   constrain.

mod bundled;
mod error;
mod links;
mod openb;
mod philly;
mod presets;
mod report;
mod resolve;
mod table;

#[cfg(doc)]
use marshal_scheduler::domain::{ClusterSpec, Job};

pub use error::DatasetError;
pub use openb::{parse_openb_nodes, parse_openb_pods};
pub use philly::{parse_philly, philly_cluster, philly_window};
pub use presets::{CLUSTER_PRESETS, cluster_preset};
pub use report::{MAX_SKIPPED_DETAILS, ParseReport, SkippedRow};
pub use resolve::{TRACE_NAMES, load_cluster, load_trace};
