//! Alibaba's GenAI serving trace (cluster-trace-v2026-GenAI): per-pod GPU duty cycle,
//! GPU memory used and memory utilisation, sampled about once a minute for ~22.8 h.
//! No licence file: read from the traces directory, never bundled.

use std::collections::BTreeMap;

use serde::Serialize;

use crate::gzip::{gunzip, tar_member};
use crate::resolve::{find_in_trace_dirs, trace_dirs};
use crate::table::{Bad, Table, malformed, utf8_text};
use crate::{DatasetError, ParseReport};

const EXPECTED: &str = "value,timestamp_anon,container_ip (any order)";
const DIR: &str = "alibaba-genai-v2026";

/// Which series a file holds.
#[derive(Copy, Clone, Debug, PartialEq, Eq, Serialize)]
pub enum GenAiMetric {
    /// `pod_gpu_duty_cycle_anon`: percent of time the GPU was busy (0–100).
    GpuDutyCycle,
    /// `pod_gpu_memory_used_bytes_anon`: GPU memory used, bytes.
    GpuMemoryUsedBytes,
    /// `pod_memory_util_anon`: the pod's (host) memory utilisation as the file gives it
    /// (a fraction; not range-checked beyond ≥ 0).
    MemoryUtil,
}

impl GenAiMetric {
    /// The published file's stem (`<stem>.tar.gz` holding `<stem>.csv`).
    pub fn file_stem(self) -> &'static str {
        match self {
            GenAiMetric::GpuDutyCycle => "pod_gpu_duty_cycle_anon",
            GenAiMetric::GpuMemoryUsedBytes => "pod_gpu_memory_used_bytes_anon",
            GenAiMetric::MemoryUtil => "pod_memory_util_anon",
        }
    }

    fn max(self) -> Option<f64> {
        match self {
            GenAiMetric::GpuDutyCycle => Some(100.0),
            _ => None,
        }
    }
}

/// One pod's samples: (time s, value), in time order. Times are the trace's anonymised
/// epoch seconds (1662858720 … 1662940800); values in the unit of the series' metric.
#[derive(Clone, Debug, Default, PartialEq, Serialize)]
pub struct PodSeries {
    pub points: Vec<(f64, f64)>,
}

/// Summary statistics of one pod's series, in the metric's unit.
#[derive(Copy, Clone, Debug, PartialEq, Serialize)]
pub struct PodSummary {
    pub samples: usize,
    /// First and last sample time, seconds.
    pub start_s: f64,
    pub end_s: f64,
    pub mean: f64,
    /// Nearest-rank percentiles.
    pub p50: f64,
    pub p95: f64,
    /// The peak (for memory series, the pod's peak memory).
    pub max: f64,
}

impl PodSeries {
    /// Statistics over the samples (`None` for an empty series). Computed on each call:
    /// sorts a copy of the values.
    pub fn summary(&self) -> Option<PodSummary> {
        let (first, last) = (self.points.first()?, self.points.last()?);
        let mut values: Vec<f64> = self.points.iter().map(|p| p.1).collect();
        values.sort_by(f64::total_cmp);
        let n = values.len();
        let rank = |q: f64| values[((q * n as f64).ceil() as usize).clamp(1, n) - 1];
        Some(PodSummary {
            samples: n,
            start_s: first.0,
            end_s: last.0,
            mean: values.iter().sum::<f64>() / n as f64,
            p50: rank(0.5),
            p95: rank(0.95),
            max: values[n - 1],
        })
    }
}

/// A metric's series for every pod (`container_ip`, an MD5 hash joinable across the
/// three files).
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct GenAiSeries {
    pub metric: GenAiMetric,
    pub pods: BTreeMap<String, PodSeries>,
}

impl GenAiSeries {
    /// One pod's series.
    pub fn pod(&self, pod: &str) -> Option<&PodSeries> {
        self.pods.get(pod)
    }

    /// Total samples over all pods.
    pub fn samples(&self) -> usize {
        self.pods.values().map(|s| s.points.len()).sum()
    }
}

/// Parses one GenAI series CSV (`value,timestamp_anon,container_ip`, columns in any
/// order: the memory file puts the timestamp first). See [`GenAiMetric`] for units.
///
/// Skipped rows: an empty pod, a time or value that is not a finite non-negative number,
/// a duty cycle above 100, a time before the pod's previous sample.
pub fn parse_genai_series(
    name: &str,
    metric: GenAiMetric,
    text: &str,
) -> Result<(GenAiSeries, ParseReport), DatasetError> {
    let table = Table::open(name, text, EXPECTED)?;
    let value = table.column("value", EXPECTED)?;
    let time = table.column("timestamp_anon", EXPECTED)?;
    let pod = table.column("container_ip", EXPECTED)?;
    let mut report = ParseReport::new(name);
    let mut pods: BTreeMap<String, PodSeries> = BTreeMap::new();
    table.for_each_row(&mut report, |row| {
        let v = row.seconds(value)?;
        if let Some(max) = metric.max()
            && v > max
        {
            return Err(Bad::new("value", format!("{v} is above {max}")));
        }
        let t = row.seconds(time)?;
        let id = row.text(pod)?;
        let series = match pods.get_mut(id) {
            Some(s) => s,
            None => pods.entry(id.to_string()).or_default(),
        };
        if let Some(&(prev, _)) = series.points.last()
            && t < prev
        {
            return Err(Bad::new(
                "timestamp_anon",
                format!("{t} is before this pod's previous sample at {prev}"),
            ));
        }
        series.points.push((t, v));
        Ok(())
    });
    if pods.is_empty() {
        return Err(report.no_valid_rows());
    }
    Ok((GenAiSeries { metric, pods }, report))
}

/// Reads `<stem>.csv` out of the published `<stem>.tar.gz` and parses it; `name` is the
/// archive's name, for messages.
pub fn parse_genai_archive(
    name: &str,
    metric: GenAiMetric,
    archive: &[u8],
) -> Result<(GenAiSeries, ParseReport), DatasetError> {
    let member = format!("{}.csv", metric.file_stem());
    let bad = |reason: String| malformed(name, 1, "archive", reason);
    let tar = gunzip(archive).map_err(bad)?;
    let csv = tar_member(&tar, &member).map_err(bad)?;
    drop(tar);
    let file = format!("{name}:{member}");
    let text = utf8_text(&file, &csv)?;
    parse_genai_series(&file, metric, text)
}

/// Loads a GenAI series from `alibaba-genai-v2026/<stem>.tar.gz` in the traces directory
/// (143 pods / 157,417 samples of duty cycle, 144 / 161,413 of GPU memory). Takes about
/// a second in a debug build: load once and share.
pub fn load_genai_series(metric: GenAiMetric) -> Result<(GenAiSeries, ParseReport), DatasetError> {
    let rel = format!("{DIR}/{}.tar.gz", metric.file_stem());
    let path = find_in_trace_dirs(metric.file_stem(), &rel, &trace_dirs())?;
    let bytes = std::fs::read(&path).map_err(|source| DatasetError::Io {
        path: path.clone(),
        source,
    })?;
    parse_genai_archive(&path.display().to_string(), metric, &bytes)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn series_group_by_pod_and_skip_bad_samples() {
        let text = "value,timestamp_anon,container_ip
0.0,100.0,a
50.0,100.0,b
40.0,157.0,a
100.0,214.0,a
101.0,271.0,a
nan,271.0,b
-1,271.0,b
10,50.0,b
10,300.0,
";
        let (series, report) =
            parse_genai_series("d.csv", GenAiMetric::GpuDutyCycle, text).unwrap();
        assert_eq!(series.pods.len(), 2);
        assert_eq!(series.samples(), 4);
        let s = series.pod("a").unwrap().summary().unwrap();
        assert_eq!((s.samples, s.start_s, s.end_s), (3, 100.0, 214.0));
        assert!((s.mean - 140.0 / 3.0).abs() < 1e-9);
        assert_eq!((s.p50, s.p95, s.max), (40.0, 100.0, 100.0));
        let got: Vec<_> = report.skipped_at();
        assert_eq!(
            got,
            vec![
                (6, "value"),
                (7, "value"),
                (8, "value"),
                (9, "timestamp_anon"),
                (10, "container_ip")
            ]
        );
        // Memory: timestamp first, no upper bound.
        let text = "timestamp_anon,value,container_ip\n1.0,33879490560.0,x\n";
        let (series, _) =
            parse_genai_series("m.csv", GenAiMetric::GpuMemoryUsedBytes, text).unwrap();
        assert_eq!(
            series.pod("x").unwrap().summary().unwrap().max,
            33_879_490_560.0
        );
        let err = parse_genai_archive("x.tar.gz", GenAiMetric::GpuDutyCycle, b"nope").unwrap_err();
        assert!(
            matches!(&err, DatasetError::Malformed { field, .. } if field == "archive"),
            "{err}"
        );
        assert!(PodSeries::default().summary().is_none());
    }
}
