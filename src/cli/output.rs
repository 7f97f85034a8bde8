//! Printing simulation results as a table or JSON, and writing output files whole.

use std::collections::BTreeMap;
use std::io::Write;

use clap::ValueEnum;
use marshal_scheduler::sim::SimResult;
use serde_json::{Map, Value, json};

#[derive(Copy, Clone, Debug, PartialEq, Eq, ValueEnum)]
pub enum Format {
    Table,
    Json,
}

/// Writes `bytes` to `path` whole or not at all (a temporary file beside it, synced and
/// renamed): a trace, report or plot cut off by a full disk or a kill would otherwise be
/// left in place, and a trace cut at a line boundary loads as a shorter one.
pub fn write_whole(path: &std::path::Path, bytes: impl AsRef<[u8]>) -> anyhow::Result<()> {
    marshal_model::artifact::replace_file(path, bytes.as_ref())
        .map_err(|e| anyhow::anyhow!("writing {}: {e}", path.display()))
}

/// Mean of every numeric key over `runs` (the runs of one policy); non-numeric keys are
/// taken from the first run, `seed` becomes null.
pub fn mean_over_seeds(runs: &[SimResult]) -> Value {
    let values: Vec<Value> = runs
        .iter()
        .map(|r| serde_json::to_value(r).expect("serialisable"))
        .collect();
    let mut out = Map::new();
    let Some(Value::Object(first)) = values.first() else {
        return Value::Null;
    };
    for (key, v) in first {
        let column: Vec<&Value> = values.iter().filter_map(|r| r.get(key)).collect();
        let mean = match v {
            Value::Number(_) | Value::Null => {
                let nums: Vec<f64> = column.iter().filter_map(|x| x.as_f64()).collect();
                if nums.is_empty() {
                    Value::Null
                } else {
                    json!(nums.iter().sum::<f64>() / nums.len() as f64)
                }
            }
            Value::Object(curve) => {
                let mut m = Map::new();
                for k in curve.keys() {
                    let nums: Vec<f64> = column.iter().filter_map(|x| x.get(k)?.as_f64()).collect();
                    m.insert(
                        k.clone(),
                        json!(nums.iter().sum::<f64>() / nums.len().max(1) as f64),
                    );
                }
                Value::Object(m)
            }
            other => other.clone(),
        };
        out.insert(key.clone(), mean);
    }
    out.insert("seed".into(), Value::Null);
    out.insert("seeds".into(), json!(runs.len()));
    Value::Object(out)
}

/// One JSON value per policy: the run itself for one seed, `{"mean", "runs"}` for more.
pub fn json_groups(groups: &[Vec<SimResult>]) -> Value {
    let per_policy: Vec<Value> = groups
        .iter()
        .map(|runs| match runs.as_slice() {
            [one] => serde_json::to_value(one).expect("serialisable"),
            many => json!({ "mean": mean_over_seeds(many), "runs": many }),
        })
        .collect();
    match per_policy.as_slice() {
        [one] => one.clone(),
        _ => Value::Array(per_policy),
    }
}

pub fn print(
    groups: &[Vec<SimResult>],
    format: Format,
    out: &mut impl Write,
) -> std::io::Result<()> {
    match format {
        Format::Json => writeln!(
            out,
            "{}",
            serde_json::to_string_pretty(&json_groups(groups)).expect("serialisable")
        ),
        Format::Table => {
            let inflation = groups.iter().flatten().any(|r| r.mode == "inflation");
            if inflation {
                inflation_table(groups, out)
            } else {
                replay_table(groups, out)
            }
        }
    }
}

fn num(v: &Value, key: &str) -> Option<f64> {
    v.get(key)?.as_f64()
}

fn hours(v: Option<f64>) -> String {
    v.map_or("-".into(), |s| format!("{:.2}", s / 3600.0))
}

fn replay_table(groups: &[Vec<SimResult>], out: &mut impl Write) -> std::io::Result<()> {
    let Some(first) = groups.iter().flatten().next() else {
        return Ok(());
    };
    writeln!(
        out,
        "replay of {} on {} ({} GPUs), {} jobs; times in hours, mean over {} seed(s)",
        first.trace,
        first.cluster,
        first.gpus,
        first.jobs,
        groups[0].len()
    )?;
    writeln!(
        out,
        "{:<15} {:>9} {:>9} {:>10} {:>10} {:>10} {:>7} {:>7} {:>8} {:>8} {:>7}",
        "policy",
        "JCT mean",
        "JCT p50",
        "JCT p99",
        "queue",
        "makespan",
        "alloc%",
        "local%",
        "preempt",
        "rejected",
        "wall s"
    )?;
    for runs in groups {
        let m = mean_over_seeds(runs);
        writeln!(
            out,
            "{:<15} {:>9} {:>9} {:>10} {:>10} {:>10} {:>7.1} {:>7} {:>8.0} {:>8.0} {:>7.2}",
            m["policy"].as_str().unwrap_or("?"),
            hours(num(&m, "jct_mean_s")),
            hours(num(&m, "jct_p50_s")),
            hours(num(&m, "jct_p99_s")),
            hours(num(&m, "queue_mean_s")),
            hours(num(&m, "makespan_s")),
            num(&m, "gpu_alloc_pct").unwrap_or(0.0),
            num(&m, "locality_pct").map_or("-".into(), |v| format!("{v:.1}")),
            num(&m, "preemptions").unwrap_or(0.0),
            num(&m, "rejected").unwrap_or(0.0),
            num(&m, "wall_s").unwrap_or(0.0),
        )?;
    }
    Ok(())
}

fn inflation_table(groups: &[Vec<SimResult>], out: &mut impl Write) -> std::io::Result<()> {
    let Some(first) = groups.iter().flatten().next() else {
        return Ok(());
    };
    writeln!(
        out,
        "inflation of {} on {} ({} GPUs), mean over {} seed(s): GPU allocation % by arrived load",
        first.trace,
        first.cluster,
        first.gpus,
        groups[0].len()
    )?;
    let loads = ["50", "70", "80", "90", "100", "110", "120", "130"];
    write!(out, "{:<15}", "policy")?;
    for l in loads {
        write!(out, " {:>6}", format!("{l}%"))?;
    }
    writeln!(out, " {:>14} {:>7}", "unalloc@100%", "wall s")?;
    for runs in groups {
        let m = mean_over_seeds(runs);
        write!(out, "{:<15}", m["policy"].as_str().unwrap_or("?"))?;
        let curve: BTreeMap<String, f64> =
            serde_json::from_value(m["alloc_pct_by_arrived"].clone()).unwrap_or_default();
        for l in loads {
            write!(
                out,
                " {:>6}",
                curve.get(l).map_or("-".into(), |v| format!("{v:.2}"))
            )?;
        }
        let spread = stddev(runs.iter().filter_map(|r| r.unallocated_gpus_at_100));
        writeln!(
            out,
            " {:>8} ±{:>4.0} {:>7.2}",
            num(&m, "unallocated_gpus_at_100").map_or("-".into(), |v| format!("{v:.0}")),
            spread,
            num(&m, "wall_s").unwrap_or(0.0)
        )?;
    }
    Ok(())
}

fn stddev(values: impl Iterator<Item = f64>) -> f64 {
    let v: Vec<f64> = values.collect();
    if v.len() < 2 {
        return 0.0;
    }
    let m = v.iter().sum::<f64>() / v.len() as f64;
    (v.iter().map(|x| (x - m).powi(2)).sum::<f64>() / (v.len() - 1) as f64).sqrt()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn run(policy: &str, seed: u64, jct: f64) -> SimResult {
        SimResult {
            policy: policy.into(),
            seed,
            mode: "replay".into(),
            jct_mean_s: Some(jct),
            ..SimResult::default()
        }
    }

    #[test]
    fn an_output_file_is_replaced_whole_and_leaves_no_temporary_file() {
        let tmp = tempfile::tempdir().unwrap();
        let path = tmp.path().join("trace.csv");
        std::fs::write(&path, "old,longer,content\n").unwrap();
        write_whole(&path, "new\n").unwrap();
        assert_eq!(std::fs::read_to_string(&path).unwrap(), "new\n");
        let names: Vec<_> = std::fs::read_dir(tmp.path())
            .unwrap()
            .map(|e| e.unwrap().file_name())
            .collect();
        assert_eq!(names, ["trace.csv"]);
        let e = write_whole(&tmp.path().join("no/such/dir.csv"), "x")
            .unwrap_err()
            .to_string();
        assert!(e.contains("no/such/dir.csv"), "{e}");
    }

    #[test]
    fn mean_over_seeds_averages_numbers_and_keeps_names() {
        let m = mean_over_seeds(&[run("fifo", 1, 10.0), run("fifo", 2, 20.0)]);
        assert_eq!(m["jct_mean_s"], json!(15.0));
        assert_eq!(m["policy"], json!("fifo"));
        assert_eq!(m["seed"], Value::Null);
        assert_eq!(m["seeds"], json!(2));
    }

    #[test]
    fn json_has_one_value_per_policy() {
        let one = json_groups(&[vec![run("fifo", 1, 1.0)]]);
        assert_eq!(one["policy"], json!("fifo"));
        let two = json_groups(&[
            vec![run("a", 1, 1.0)],
            vec![run("b", 1, 1.0), run("b", 2, 3.0)],
        ]);
        assert_eq!(two[0]["policy"], json!("a"));
        assert_eq!(two[1]["mean"]["jct_mean_s"], json!(2.0));
        assert_eq!(two[1]["runs"].as_array().unwrap().len(), 2);
    }
}
