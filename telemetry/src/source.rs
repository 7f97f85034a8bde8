//! The [`Source`] trait: where GPU samples come from.
//!
//! An agent's sampling loop asks a source for the samples of one tick and hands them to a
//! sink; it knows nothing about NVML, files or replay:
//!
//! ```no_run
//! # use marshal_telemetry::{Source, TelemetrySink};
//! fn tick(source: &mut dyn Source, sink: &TelemetrySink, now_us: i64) -> marshal_telemetry::Result<()> {
//!     let rows = source.sample(now_us)?;
//!     sink.send(rows)
//! }
//! ```

use crate::error::Result;
use crate::schema::GpuSample;

/// A producer of per-GPU samples.
pub trait Source {
    /// The samples for time `now_us` (µs since the epoch). A live source samples the
    /// hardware and stamps the rows with `now_us`; a replay source returns the recorded
    /// rows up to and including `now_us` that it has not returned yet.
    fn sample(&mut self, now_us: i64) -> Result<Vec<GpuSample>>;
}
