//! Chronus (SoCC '21) deadline traces derived from Philly: `trace_job_Philly_{MIX1,MIX2,
//! SLO}.csv` (jobs with SLO classes and deadlines) and `model_info.json` (each model's
//! scaling efficiency by GPU and node count).

use std::collections::BTreeMap;

use marshal_scheduler::domain::{Job, JobId};
use serde::Serialize;

use crate::bundled::CHRONUS_MODEL_INFO;
use crate::jobs::{at_least_one_gpu, read_unique_rows, rebase_and_number};
use crate::table::{Bad, Col, Row, Table, malformed, parse_uint};
use crate::{DatasetError, ParseReport};

const HEADER: &str = "job_id,user,num_gpu,submit_time,iterations,model_name,duration,\
                      interval,expect_time_list,expect_value_list,best_effort,job_type";
const MINUTE_S: f64 = 60.0;

struct Cols {
    job_id: Col,
    user: Col,
    num_gpu: Col,
    submit: Col,
    iterations: Col,
    model: Col,
    duration: Col,
    interval: Col,
    expect_time: Col,
    expect_value: Col,
    best_effort: Col,
    job_type: Col,
}

/// Parses a Chronus trace (`job_id,user,num_gpu,submit_time,iterations,model_name,
/// duration,interval,expect_time_list,expect_value_list,best_effort,job_type`).
///
/// `submit_time` and `duration` are **minutes** and become seconds. As for Philly, jobs
/// are sorted by submission (stable), numbered in that order and rebased to the earliest
/// submission; each is [`Job::whole_gpus`] of `num_gpu` GPUs with `total_work` = the
/// duration. Tenant = `user` (the Philly VC, `vc_<id>`); name = `<model_name>-<job_id>`
/// (the model is the text before the first `-`; Chronus synthesised it). Priority from
/// the SLO class: `strict` 2, `soft` 1, `best` (best effort) 0; every job stays
/// preemptible, as in Chronus. `iterations`, `interval` and the deadline lists
/// (`expect_time_list`, `expect_value_list`: `-`-separated minutes and utilities) have
/// no [`Job`] field and are validated but not kept.
///
/// Skipped rows: an empty or non-numeric field, 0 GPUs (184–205 rows per file: Philly
/// jobs that held no GPU, which a GPU job cannot express), a repeated `job_id`,
/// deadline lists of different lengths, `best_effort` not 0/1 or not matching
/// `job_type`, an unknown `job_type`.
pub fn parse_chronus(name: &str, text: &str) -> Result<(Vec<Job>, ParseReport), DatasetError> {
    let table = Table::open(name, text, HEADER)?;
    let cols = Cols {
        job_id: table.column("job_id", HEADER)?,
        user: table.column("user", HEADER)?,
        num_gpu: table.column("num_gpu", HEADER)?,
        submit: table.column("submit_time", HEADER)?,
        iterations: table.column("iterations", HEADER)?,
        model: table.column("model_name", HEADER)?,
        duration: table.column("duration", HEADER)?,
        interval: table.column("interval", HEADER)?,
        expect_time: table.column("expect_time_list", HEADER)?,
        expect_value: table.column("expect_value_list", HEADER)?,
        best_effort: table.column("best_effort", HEADER)?,
        job_type: table.column("job_type", HEADER)?,
    };
    let (jobs, report) = read_unique_rows(name, table, cols.job_id, |row| parse_row(row, &cols));
    let jobs = rebase_and_number(jobs, &report)?;
    Ok((jobs, report))
}

fn parse_row(row: &Row<'_>, c: &Cols) -> Result<Job, Bad> {
    let job_id = row.text(c.job_id)?;
    let user = row.text(c.user)?;
    let gpus = at_least_one_gpu(row.uint(c.num_gpu)?, "num_gpu")?;
    let submit = row.time_s(c.submit)? * MINUTE_S;
    let _: u64 = row.uint(c.iterations)?;
    let model = row.text(c.model)?;
    let duration = row.time_s(c.duration)? * MINUTE_S;
    let _: u64 = row.uint(c.interval)?;
    let times = number_list(row.text(c.expect_time)?, "expect_time_list")?;
    let values = number_list(row.text(c.expect_value)?, "expect_value_list")?;
    if times != values {
        return Err(Bad::new(
            "expect_value_list",
            format!("{values} values for {times} deadlines"),
        ));
    }
    let best_effort: u8 = row.uint(c.best_effort)?;
    let job_type = row.text(c.job_type)?;
    let priority = match (job_type, best_effort) {
        ("strict", 0) => 2,
        ("soft", 0) => 1,
        ("best", 1) => 0,
        ("strict" | "soft" | "best", _) => {
            return Err(Bad::new(
                "best_effort",
                format!("best_effort {best_effort} does not match job_type {job_type:?}"),
            ));
        }
        _ => {
            return Err(Bad::new(
                "job_type",
                format!("unknown job type {job_type:?} (expected strict, soft or best)"),
            ));
        }
    };
    let mut job = Job::whole_gpus(JobId(0), gpus, submit, duration);
    job.name = format!("{model}-{job_id}");
    job.tenant = user.to_string();
    job.priority = priority;
    Ok(job)
}

/// Counts the entries of a `-`-separated list of non-negative integers.
fn number_list(list: &str, field: &'static str) -> Result<usize, Bad> {
    let mut n = 0;
    for item in list.split('-') {
        parse_uint::<u64>(item.trim())
            .map_err(|reason| Bad::new(field, format!("{list:?}: {reason}")))?;
        n += 1;
    }
    Ok(n)
}

/// One entry of Chronus' `model_info.json`: the speed of `model` on `gpus` GPUs spread
/// over `nodes` nodes, relative to the same GPUs on one node (1.0 = no loss; the
/// one-node entries are 1.0 by definition).
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct ScalingEfficiency {
    pub model: String,
    pub gpus: u32,
    pub nodes: u32,
    pub efficiency: f64,
}

/// Parses Chronus' `model_info.json` (`{model: {gpus: {nodes: efficiency}}}`) into
/// entries sorted by model, GPUs and nodes.
///
/// An entry whose counts are not positive integers, whose nodes exceed its GPUs, or
/// whose efficiency is not a finite positive number is skipped and counted (line 1: the
/// file is one line; the field names the entry as `model/gpus/nodes`). Invalid JSON or
/// a different shape is a [`DatasetError::Malformed`] with serde's line.
pub fn parse_chronus_model_info(
    name: &str,
    text: &str,
) -> Result<(Vec<ScalingEfficiency>, ParseReport), DatasetError> {
    type Shape = BTreeMap<String, BTreeMap<String, BTreeMap<String, serde_json::Value>>>;
    let shape: Shape = serde_json::from_str(text).map_err(|e| {
        malformed(
            name,
            e.line().max(1),
            "json",
            format!("{e}; expected {{model: {{gpus: {{nodes: efficiency}}}}}}"),
        )
    })?;
    let mut report = ParseReport::new(name);
    let mut entries = Vec::new();
    for (model, by_gpus) in &shape {
        for (gpus, by_nodes) in by_gpus {
            for (nodes, value) in by_nodes {
                report.rows_read += 1;
                match scaling_entry(model, gpus, nodes, value) {
                    Ok(entry) => entries.push(entry),
                    Err(reason) => {
                        report.skip(1, &format!("{model}/{gpus}/{nodes}"), reason);
                    }
                }
            }
        }
    }
    if entries.is_empty() {
        return Err(report.no_valid_rows());
    }
    entries.sort_by(|a, b| (&a.model, a.gpus, a.nodes).cmp(&(&b.model, b.gpus, b.nodes)));
    Ok((entries, report))
}

/// Chronus' `model_info.json` (bundled): alexnet, inception_v3, mobilenet_v2, resnet101
/// and vgg16 on 2, 4, 6 and 8 GPUs.
pub fn chronus_model_info() -> Result<(Vec<ScalingEfficiency>, ParseReport), DatasetError> {
    parse_chronus_model_info(CHRONUS_MODEL_INFO.name, CHRONUS_MODEL_INFO.text)
}

fn scaling_entry(
    model: &str,
    gpus: &str,
    nodes: &str,
    value: &serde_json::Value,
) -> Result<ScalingEfficiency, String> {
    let gpus: u32 = parse_uint(gpus).map_err(|r| format!("GPU count: {r}"))?;
    let nodes: u32 = parse_uint(nodes).map_err(|r| format!("node count: {r}"))?;
    if gpus == 0 || nodes == 0 || nodes > gpus {
        return Err(format!("{gpus} GPUs on {nodes} nodes"));
    }
    let efficiency = value
        .as_f64()
        .filter(|e| e.is_finite() && *e > 0.0)
        .ok_or_else(|| format!("efficiency {value} is not a positive number"))?;
    Ok(ScalingEfficiency {
        model: model.to_string(),
        gpus,
        nodes,
        efficiency,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    const TRACE: &str = "job_id,user,num_gpu,submit_time,iterations,model_name,duration,interval,expect_time_list,expect_value_list,best_effort,job_type
0,vc_6214e9,1,8555,5049,vgg16,747,14,1105,10,0,strict
1,vc_ed69ec,4,832,296,mobilenet_v2,98,8,128-158,10-8,0,soft
2,vc_ee9e8c,1,14341,3621,alexnet,30,17,14341,10,1,best
";

    #[test]
    fn minutes_become_seconds_and_slo_classes_priorities() {
        let (jobs, report) = parse_chronus("mix.csv", TRACE).unwrap();
        assert_eq!((report.rows_read, report.rows_skipped), (3, 0));
        let got: Vec<_> = jobs
            .iter()
            .map(|j| {
                (
                    j.id.0,
                    j.name.as_str(),
                    j.tenant.as_str(),
                    j.submit_time,
                    j.total_work,
                    j.workers,
                    j.priority,
                )
            })
            .collect();
        assert_eq!(
            got,
            vec![
                (0, "mobilenet_v2-1", "vc_ed69ec", 0.0, 98.0 * 60.0, 4, 1),
                (
                    1,
                    "vgg16-0",
                    "vc_6214e9",
                    (8555.0 - 832.0) * 60.0,
                    747.0 * 60.0,
                    1,
                    2
                ),
                (
                    2,
                    "alexnet-2",
                    "vc_ee9e8c",
                    (14341.0 - 832.0) * 60.0,
                    1800.0,
                    1,
                    0
                ),
            ]
        );
        assert!(jobs.iter().all(|j| j.preemptible && j.validate().is_ok()));
    }

    #[test]
    fn bad_chronus_rows_are_skipped_with_line_and_field() {
        let text = format!(
            "{TRACE}3,vc_a,0,1,1,vgg16,1,1,2,10,0,strict
4,vc_a,1,NaN,1,vgg16,1,1,2,10,0,strict
5,vc_a,1,1,1,vgg16,-1,1,2,10,0,strict
6,vc_a,1,1,1,vgg16,1,1,2-x,10-8,0,soft
7,vc_a,1,1,1,vgg16,1,1,2-3,10,0,soft
8,vc_a,1,1,1,vgg16,1,1,2,10,1,strict
9,vc_a,1,1,1,vgg16,1,1,2,10,0,urgent
0,vc_a,1,1,1,vgg16,1,1,2,10,0,strict
11,,1,1,1,vgg16,1,1,2,10,0,strict
"
        );
        let (jobs, report) = parse_chronus("c.csv", &text).unwrap();
        assert_eq!(jobs.len(), 3);
        assert_eq!((report.rows_read, report.rows_skipped), (12, 9));
        let got: Vec<_> = report.skipped_at();
        assert_eq!(
            got,
            vec![
                (5, "num_gpu"),
                (6, "submit_time"),
                (7, "duration"),
                (8, "expect_time_list"),
                (9, "expect_value_list"),
                (10, "best_effort"),
                (11, "job_type"),
                (12, "job_id"),
                (13, "user"),
            ]
        );
        assert!(report.skipped[0].reason.contains("at least one GPU"));
        assert!(
            report.skipped[4]
                .reason
                .contains("1 values for 2 deadlines")
        );
        assert!(report.skipped[7].reason.contains("duplicate"));
    }

    #[test]
    fn chronus_header_and_empty_files_are_errors() {
        let err = parse_chronus("h.csv", "job_id,user,num_gpu\n").unwrap_err();
        assert!(
            matches!(&err, DatasetError::Malformed { file, field, .. }
                if file == "h.csv" && field == "submit_time"),
            "{err}"
        );
        let err = parse_chronus("n.csv", &format!("{HEADER}\n")).unwrap_err();
        assert!(matches!(err, DatasetError::NoValidRows { .. }), "{err}");
    }

    #[test]
    fn model_info_is_flattened_and_validated() {
        let text = r#"{"alexnet": {"2": {"1": 1.0, "2": 0.745}, "4": {"4": 0.33, "8": 0.1}},
            "vgg16": {"x": {"1": 1.0}, "2": {"1": -1, "2": "fast"}}}"#;
        let (entries, report) = parse_chronus_model_info("model_info.json", text).unwrap();
        let got: Vec<_> = entries
            .iter()
            .map(|e| (e.model.as_str(), e.gpus, e.nodes, e.efficiency))
            .collect();
        assert_eq!(
            got,
            vec![
                ("alexnet", 2, 1, 1.0),
                ("alexnet", 2, 2, 0.745),
                ("alexnet", 4, 4, 0.33)
            ]
        );
        assert_eq!((report.rows_read, report.rows_skipped), (7, 4));
        let fields: Vec<_> = report.skipped.iter().map(|s| s.field.as_str()).collect();
        assert_eq!(
            fields,
            vec!["alexnet/4/8", "vgg16/2/1", "vgg16/2/2", "vgg16/x/1"]
        );
        assert!(report.skipped[0].reason.contains("4 GPUs on 8 nodes"));

        let err = parse_chronus_model_info("m.json", "{\"a\": [1, 2]}").unwrap_err();
        assert!(
            matches!(&err, DatasetError::Malformed { file, line: 1, field, .. }
                if file == "m.json" && field == "json"),
            "{err}"
        );
        let err = parse_chronus_model_info("m.json", "{\n\"a\": {\n").unwrap_err();
        assert!(
            matches!(&err, DatasetError::Malformed { line: 3, .. }),
            "{err}"
        );
        let err = parse_chronus_model_info("m.json", "{}").unwrap_err();
        assert!(matches!(err, DatasetError::NoValidRows { .. }), "{err}");
    }
}
