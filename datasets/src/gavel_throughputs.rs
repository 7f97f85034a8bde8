//! Gavel's (OSDI '20) measured throughputs: `simulation_throughputs.json` and
//! `physical_cluster_throughputs.json`, per worker (GPU) type × job type × scale factor,
//! alone and space-shared with another job.

use std::collections::BTreeMap;
use std::path::PathBuf;

use serde::Serialize;

use crate::bundled::GAVEL_SIMULATION_THROUGHPUTS;
use crate::resolve::{
    find_in_trace_dirs, looks_like_path, read_text_file, trace_dirs, unknown_name,
};
use crate::table::malformed;
use crate::{DatasetError, MAX_SKIPPED_DETAILS, ParseReport};

/// Names [`load_gavel_throughputs`] knows: `gavel-simulation` (bundled
/// `simulation_throughputs.json`) and `gavel-physical` (`gavel/physical_cluster_throughputs.json`
/// in the traces directory).
pub const GAVEL_THROUGHPUT_NAMES: &[&str] = &["gavel-simulation", "gavel-physical"];

/// The measurements of one job type at one scale factor on one worker type.
#[derive(Clone, Debug, Default, PartialEq, Serialize)]
struct Entry {
    /// Isolated throughput (the file's `"null"` key), if present and valid.
    isolated: Option<f64>,
    /// Other job type → its scale factor → (throughput of this job, of the other job).
    colocated: BTreeMap<String, BTreeMap<u32, (f64, f64)>>,
}

/// Gavel's throughput table.
///
/// Units: throughputs are **training steps (iterations) per second** of the whole job,
/// as Gavel measured them (a job's steps are the `total_steps` of Gavel's traces). A
/// *scale factor* is the job's number of GPUs (1, 2, 4, 8), all of the worker type.
/// Worker types are `k80`, `p100`, `v100` (the job's GPUs packed on as few servers as
/// possible) and `<type>_unconsolidated` (spread across servers), so
/// `single("v100", j, 4) / single("v100_unconsolidated", j, 4)` is Gavel's packed-vs-
/// spread ratio.
///
/// A throughput of **0** is Gavel's mark for a combination that cannot run (e.g. the
/// K80's ResNet-50 at batch size 128 on 2+ GPUs, out of memory) or a co-location Gavel
/// did not allow (every pair of jobs with a scale factor above 1, and some single-GPU
/// pairs): lookups return `Some(0.0)` for those, `None` for combinations the file does
/// not list.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct GavelThroughputs {
    /// The file the table was read from.
    pub source: String,
    /// Worker type → job type → scale factor → measurements.
    entries: BTreeMap<String, BTreeMap<String, BTreeMap<u32, Entry>>>,
}

impl GavelThroughputs {
    fn entry(&self, gpu_type: &str, job_type: &str, scale: u32) -> Option<&Entry> {
        self.entries.get(gpu_type)?.get(job_type)?.get(&scale)
    }

    /// The isolated throughput (steps/s) of `job_type` (e.g. `"ResNet-50 (batch size
    /// 64)"`) on `scale` GPUs of `gpu_type` (e.g. `"v100"`, `"v100_unconsolidated"`).
    pub fn single(&self, gpu_type: &str, job_type: &str, scale: u32) -> Option<f64> {
        self.entry(gpu_type, job_type, scale)?.isolated
    }

    /// The throughputs (steps/s of `job_a`, steps/s of `job_b`) of two single-GPU jobs
    /// space-sharing one GPU of `gpu_type`. Gavel measured co-location only for scale
    /// factor 1; see [`GavelThroughputs::colocated_scaled`] for the other (all-zero)
    /// entries.
    pub fn colocated(&self, gpu_type: &str, job_a: &str, job_b: &str) -> Option<(f64, f64)> {
        self.colocated_scaled(gpu_type, job_a, 1, job_b, 1)
    }

    /// As [`GavelThroughputs::colocated`], for `job_a` on `scale_a` GPUs sharing them
    /// with `job_b` on `scale_b` GPUs (steps/s of each).
    pub fn colocated_scaled(
        &self,
        gpu_type: &str,
        job_a: &str,
        scale_a: u32,
        job_b: &str,
        scale_b: u32,
    ) -> Option<(f64, f64)> {
        self.entry(gpu_type, job_a, scale_a)?
            .colocated
            .get(job_b)?
            .get(&scale_b)
            .copied()
    }

    /// The worker types, sorted (`k80`, `k80_unconsolidated`, `p100`, …).
    pub fn gpu_types(&self) -> Vec<&str> {
        self.entries.keys().map(String::as_str).collect()
    }

    /// Every job type of any worker type, sorted and without repeats.
    pub fn job_types(&self) -> Vec<&str> {
        let mut types: Vec<&str> = self
            .entries
            .values()
            .flat_map(|jobs| jobs.keys().map(String::as_str))
            .collect();
        types.sort_unstable();
        types.dedup();
        types
    }

    /// The scale factors (GPU counts) listed for `job_type` on `gpu_type`, ascending.
    pub fn scales(&self, gpu_type: &str, job_type: &str) -> Vec<u32> {
        self.entries
            .get(gpu_type)
            .and_then(|jobs| jobs.get(job_type))
            .map(|by_scale| by_scale.keys().copied().collect())
            .unwrap_or_default()
    }

    /// The number of (worker type, job type, scale factor) entries with an isolated
    /// throughput.
    pub fn single_count(&self) -> usize {
        self.entries
            .values()
            .flat_map(|jobs| jobs.values())
            .flat_map(|by_scale| by_scale.values())
            .filter(|e| e.isolated.is_some())
            .count()
    }

    /// The number of co-location pairs kept (ordered: (a, b) and (b, a) are two).
    pub fn colocated_count(&self) -> usize {
        self.entries
            .values()
            .flat_map(|jobs| jobs.values())
            .flat_map(|by_scale| by_scale.values())
            .flat_map(|e| e.colocated.values())
            .map(BTreeMap::len)
            .sum()
    }
}

type Shape = BTreeMap<String, BTreeMap<String, BTreeMap<String, serde_json::Value>>>;

/// Parses a Gavel throughput file: `{worker_type: {"(job_type, scale_factor)": {"null":
/// isolated, "(other_job, sf)": [this, other]}}}` (job keys are Python tuple reprs, e.g.
/// `('ResNet-18 (batch size 16)', 1)`). See [`GavelThroughputs`] for units.
///
/// Each value is a row of the report (its line found from the keys; `field` is the key
/// path `worker/job key/inner key`). Skipped: a job key that is not `('<type>', <n>)`
/// with n ≥ 1 (its whole object), an isolated value that is not a finite non-negative
/// number, a co-location value that is not two of them, an inner key that is neither
/// `null` nor a job key, a job object without `null`. Not JSON, or not that nesting, is
/// a [`DatasetError::Malformed`] with serde's line; no valid value at all is
/// [`DatasetError::NoValidRows`].
pub fn parse_gavel_throughputs(
    name: &str,
    text: &str,
) -> Result<(GavelThroughputs, ParseReport), DatasetError> {
    let shape: Shape = serde_json::from_str(text).map_err(|e| {
        malformed(
            name,
            e.line().max(1),
            "json",
            format!(
                "{e}; expected {{worker_type: {{\"(job_type, scale)\": {{\"null\": steps/s, \
                 \"(other_job, scale)\": [steps/s, steps/s]}}}}}}"
            ),
        )
    })?;
    let mut report = ParseReport::new(name);
    let mut entries: BTreeMap<String, BTreeMap<String, BTreeMap<u32, Entry>>> = BTreeMap::new();
    let mut kept = 0usize;
    for (worker, jobs) in &shape {
        for (job_key, values) in jobs {
            let (job, scale) = match parse_job_key(job_key) {
                Ok(k) => k,
                Err(reason) => {
                    report.rows_read += values.len().max(1);
                    for _ in 0..values.len().max(1) {
                        let field = format!("{worker}/{job_key}");
                        skip_value(
                            &mut report,
                            text,
                            &[worker, job_key],
                            &field,
                            reason.clone(),
                        );
                    }
                    continue;
                }
            };
            let mut entry = Entry::default();
            if !values.contains_key("null") {
                report.rows_read += 1;
                skip_value(
                    &mut report,
                    text,
                    &[worker, job_key],
                    &format!("{worker}/{job_key}/null"),
                    "missing isolated throughput (key `null`)".into(),
                );
            }
            for (inner, value) in values {
                report.rows_read += 1;
                let result = if inner == "null" {
                    throughput(value).map(|t| entry.isolated = Some(t))
                } else {
                    parse_job_key(inner).and_then(|(other, other_scale)| {
                        pair(value).map(|p| {
                            entry
                                .colocated
                                .entry(other)
                                .or_default()
                                .insert(other_scale, p);
                        })
                    })
                };
                match result {
                    Ok(()) => kept += 1,
                    Err(reason) => {
                        let field = format!("{worker}/{job_key}/{inner}");
                        skip_value(&mut report, text, &[worker, job_key, inner], &field, reason);
                    }
                }
            }
            entries
                .entry(worker.clone())
                .or_default()
                .entry(job)
                .or_default()
                .insert(scale, entry);
        }
    }
    if kept == 0 {
        return Err(report.no_valid_rows());
    }
    let table = GavelThroughputs {
        source: name.to_string(),
        entries,
    };
    Ok((table, report))
}

/// Gavel's `simulation_throughputs.json` (bundled): 6 worker types, 26 job types, scale
/// factors 1, 2, 4, 8 (83 job × scale entries per worker type, 77 for
/// `k80_unconsolidated`).
pub fn gavel_throughputs() -> Result<(GavelThroughputs, ParseReport), DatasetError> {
    let file = GAVEL_SIMULATION_THROUGHPUTS;
    parse_gavel_throughputs(file.name, file.text)
}

/// Loads a Gavel throughput table: a name in [`GAVEL_THROUGHPUT_NAMES`] or a path to a
/// `.json` file in the same format. `gavel-physical` (the throughputs Gavel measured on
/// its physical cluster) is read from the traces directory.
pub fn load_gavel_throughputs(arg: &str) -> Result<(GavelThroughputs, ParseReport), DatasetError> {
    let path = match arg {
        "gavel-simulation" => return gavel_throughputs(),
        "gavel-physical" => find_in_trace_dirs(
            arg,
            "gavel/physical_cluster_throughputs.json",
            &trace_dirs(),
        )?,
        _ if looks_like_path(arg) || arg.ends_with(".json") => PathBuf::from(arg),
        _ => {
            return Err(unknown_name(
                "Gavel throughput table",
                arg,
                GAVEL_THROUGHPUT_NAMES,
            ));
        }
    };
    let text = read_text_file(&path)?;
    parse_gavel_throughputs(&path.display().to_string(), &text)
}

/// `('ResNet-18 (batch size 16)', 1)` → (`ResNet-18 (batch size 16)`, 1).
fn parse_job_key(key: &str) -> Result<(String, u32), String> {
    let bad = || format!("{key:?} is not a job key `('<job type>', <scale factor>)`");
    let inner = key
        .trim()
        .strip_prefix('(')
        .and_then(|k| k.strip_suffix(')'))
        .ok_or_else(bad)?;
    let (job, scale) = inner.rsplit_once(',').ok_or_else(bad)?;
    let job = job
        .trim()
        .strip_prefix('\'')
        .and_then(|j| j.strip_suffix('\''))
        .filter(|j| !j.is_empty())
        .ok_or_else(bad)?;
    let scale: u32 = scale
        .trim()
        .parse()
        .map_err(|_| format!("{key:?}: scale factor is not a whole number"))?;
    if scale == 0 {
        return Err(format!("{key:?}: scale factor 0"));
    }
    Ok((job.to_string(), scale))
}

fn throughput(value: &serde_json::Value) -> Result<f64, String> {
    value
        .as_f64()
        .filter(|t| t.is_finite() && *t >= 0.0)
        .ok_or_else(|| format!("throughput {value} is not a finite non-negative number"))
}

fn pair(value: &serde_json::Value) -> Result<(f64, f64), String> {
    match value.as_array().map(Vec::as_slice) {
        Some([a, b]) => Ok((throughput(a)?, throughput(b)?)),
        _ => Err(format!(
            "co-located throughputs {value} are not [steps/s, steps/s]"
        )),
    }
}

/// The 1-based line of the object key path `keys` (`keys[0]` at the top level, `keys[1]`
/// inside its value, …), found by a scan that skips strings; line 1 when it is not found
/// (e.g. a key written with escapes).
fn line_of(text: &str, keys: &[&str]) -> usize {
    let bytes = text.as_bytes();
    let (mut depth, mut matched, mut line, mut i) = (0usize, 0usize, 1usize, 0usize);
    while i < bytes.len() && matched < keys.len() {
        match bytes[i] {
            b'\n' => line += 1,
            b'{' | b'[' => depth += 1,
            b'}' | b']' => depth = depth.saturating_sub(1),
            b'"' => {
                let start = i + 1;
                let mut end = start;
                while end < bytes.len() && bytes[end] != b'"' {
                    end += if bytes[end] == b'\\' { 2 } else { 1 };
                }
                let is_key = bytes
                    .get(end + 1..)
                    .and_then(|rest| rest.iter().find(|b| !b.is_ascii_whitespace()))
                    == Some(&b':');
                if is_key && depth == matched + 1 && text.get(start..end) == Some(keys[matched]) {
                    matched += 1;
                    if matched == keys.len() {
                        return line;
                    }
                }
                i = end;
            }
            _ => {}
        }
        i += 1;
    }
    1
}

/// Skips one value, locating its line only while the report still keeps details (the
/// scan is linear in the file).
fn skip_value(report: &mut ParseReport, text: &str, keys: &[&str], field: &str, reason: String) {
    let line = if report.skipped.len() < MAX_SKIPPED_DETAILS {
        line_of(text, keys)
    } else {
        1
    };
    report.skip(line, field, reason);
}

#[cfg(test)]
mod tests {
    use super::*;

    const SAMPLE: &str = r#"{
  "v100": {
    "('ResNet-18 (batch size 16)', 1)": {
      "null": 10.5,
      "('LM (batch size 5)', 1)": [4.0, 3.0],
      "('A3C', 1)": [1.0, -2.0]
    },
    "('LM (batch size 5)', 1)": {
      "null": -1,
      "('ResNet-18 (batch size 16)', 1)": [3.0, 4.0],
      "('A3C', 1)": [1.0]
    },
    "('LM (batch size 5)', 4)": {
      "null": 30.25,
      "('LM (batch size 5)', 4)": [0.0, 0.0],
      "oops": [1.0, 1.0]
    },
    "not a key": {"null": 1.0},
    "('A3C', 0)": {"null": 1.0},
    "('A3C', 1)": {"('A3C', 1)": [0.5, 0.5]}
  },
  "v100_unconsolidated": {
    "('LM (batch size 5)', 4)": {"null": "fast"}
  }
}"#;

    #[test]
    fn lookups_and_skipped_values_with_lines() {
        let (t, report) = parse_gavel_throughputs("t.json", SAMPLE).unwrap();
        assert_eq!(t.single("v100", "ResNet-18 (batch size 16)", 1), Some(10.5));
        assert_eq!(t.single("v100", "LM (batch size 5)", 4), Some(30.25));
        assert_eq!(t.single("v100", "LM (batch size 5)", 1), None, "negative");
        assert_eq!(
            t.single("v100_unconsolidated", "LM (batch size 5)", 4),
            None
        );
        assert_eq!(t.single("k80", "A3C", 1), None);
        assert_eq!(
            t.colocated("v100", "ResNet-18 (batch size 16)", "LM (batch size 5)"),
            Some((4.0, 3.0))
        );
        assert_eq!(
            t.colocated("v100", "LM (batch size 5)", "ResNet-18 (batch size 16)"),
            Some((3.0, 4.0))
        );
        assert_eq!(
            t.colocated_scaled("v100", "LM (batch size 5)", 4, "LM (batch size 5)", 4),
            Some((0.0, 0.0))
        );
        assert_eq!(
            t.colocated("v100", "ResNet-18 (batch size 16)", "A3C"),
            None
        );
        assert_eq!(t.gpu_types(), vec!["v100", "v100_unconsolidated"]);
        assert_eq!(
            t.job_types(),
            vec!["A3C", "LM (batch size 5)", "ResNet-18 (batch size 16)"]
        );
        assert_eq!(t.scales("v100", "LM (batch size 5)"), vec![1, 4]);
        // 3 + 3 + 3 + 1 + 1 + (1 missing null + 1) + 1 values.
        assert_eq!(report.rows_read, 14);
        let got: Vec<_> = report.skipped_at();
        assert_eq!(
            got,
            vec![
                (19, "v100/('A3C', 0)"),
                (20, "v100/('A3C', 1)/null"),
                (11, "v100/('LM (batch size 5)', 1)/('A3C', 1)"),
                (9, "v100/('LM (batch size 5)', 1)/null"),
                (16, "v100/('LM (batch size 5)', 4)/oops"),
                (6, "v100/('ResNet-18 (batch size 16)', 1)/('A3C', 1)"),
                (18, "v100/not a key"),
                (23, "v100_unconsolidated/('LM (batch size 5)', 4)/null"),
            ]
        );
        assert_eq!(report.rows_skipped, 8);
        assert!(report.skipped[5].reason.contains("-2.0"), "{report}");
    }

    #[test]
    fn bad_files_are_errors() {
        let err = parse_gavel_throughputs("a.json", "{\"v100\": [1, 2]}").unwrap_err();
        assert!(
            matches!(&err, DatasetError::Malformed { file, field, .. } if file == "a.json" && field == "json"),
            "{err}"
        );
        let err =
            parse_gavel_throughputs("b.json", "{\"v100\": {\"('A3C', 1)\": {\"null\": NaN}}}")
                .unwrap_err();
        assert!(matches!(&err, DatasetError::Malformed { .. }), "{err}");
        let err = parse_gavel_throughputs("c.json", "{\"v100\": {\"('A3C', 1)\": {\"null\": -1}}}")
            .unwrap_err();
        assert!(matches!(&err, DatasetError::NoValidRows { .. }), "{err}");
        assert!(matches!(
            parse_gavel_throughputs("d.json", "").unwrap_err(),
            DatasetError::Malformed { .. }
        ));
        assert!(matches!(
            load_gavel_throughputs("gavel-nope").unwrap_err(),
            DatasetError::UnknownName { .. }
        ));
    }
}
