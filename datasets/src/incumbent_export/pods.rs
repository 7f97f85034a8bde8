//! Kubernetes: `kubectl get pods -A -o json`.

use chrono::DateTime;
use serde_json::Value;

use super::json_items::items_layout;
use super::{IncumbentExport, outcome};
use crate::jobs::Unique;
use crate::table::{Bad, malformed};
use crate::{DatasetError, ParseReport};

/// How a pod is named in the CSV: it must be the id the caller passed to `Advise`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum PodId {
    /// `namespace/name` (the default).
    #[default]
    Namespaced,
    /// `name` alone.
    Name,
}

/// Parses `kubectl get pods -A -o json` (a `List` with `items`; a single `Pod` is
/// accepted too), one row per pod:
///
/// - `job`: `namespace/name`, or `name` ([`PodId`]);
/// - `scheduled_time`: the `lastTransitionTime` of `status.conditions` `PodScheduled` =
///   `True` (RFC 3339); empty when the pod was never scheduled;
/// - `deletion_time`: when every container has terminated, the latest
///   `status.containerStatuses[*].state.terminated.finishedAt`; else
///   `metadata.deletionTimestamp` when set; else, for a pod whose `status.phase` says
///   it ended (`Succeeded`, `Failed`) without saying when (one the kubelet refused at
///   admission, e.g. `OutOfcpu`, has no container status), the latest
///   `lastTransitionTime` of its conditions, and the pod is skipped when it has none;
///   else empty (still running);
/// - `node`: `spec.nodeName`.
///
/// A malformed pod (not an object, no name, a time that is not RFC 3339, an end before
/// its start, a repeated id) is skipped with the line it starts on and a reason naming
/// `items[i]` and the pod; text that is not JSON, no `items`, or two `items` keys (JSON
/// readers keep the last, which would drop the first list), is an error.
pub fn parse_kubectl_pods(
    name: &str,
    text: &str,
    id: PodId,
) -> Result<IncumbentExport, DatasetError> {
    let doc: Value = serde_json::from_str(text)
        .map_err(|e| malformed(name, e.line().max(1), "json", e.to_string()))?;
    let layout = items_layout(text);
    if let Some(&second) = layout.keys.get(1) {
        return Err(malformed(
            name,
            second,
            "items",
            "a second top-level `items` key: a JSON reader keeps only the last, so the pods \
             listed under the first would be lost; merge the lists into one `items` array"
                .into(),
        ));
    }
    let single;
    let items: &[Value] = match doc.get("items") {
        Some(Value::Array(items)) => items,
        _ if doc.get("kind").and_then(Value::as_str) == Some("Pod") => {
            single = [doc.clone()];
            &single
        }
        _ => {
            return Err(malformed(
                name,
                1,
                "items",
                "expected the output of `kubectl get pods -A -o json`: a List with `items`".into(),
            ));
        }
    };
    let lines = layout.items;
    let mut report = ParseReport::new(name);
    let mut rows = Vec::new();
    let mut jobs = Unique::default();
    for (i, item) in items.iter().enumerate() {
        report.rows_read += 1;
        let parsed = pod(item, id).and_then(|o| {
            jobs.insert(&o.job, "metadata.name")?;
            Ok(o)
        });
        match parsed {
            Ok(o) => rows.push(o),
            Err(bad) => {
                let line = if lines.len() == items.len() {
                    lines[i]
                } else {
                    1
                };
                let pod = str_at(item, "/metadata/name")
                    .map(|n| format!(" (pod {n})"))
                    .unwrap_or_default();
                report.skip(line, bad.field, format!("items[{i}]{pod}: {}", bad.reason));
            }
        }
    }
    if rows.is_empty() {
        return Err(report.no_valid_rows());
    }
    Ok(IncumbentExport {
        rows,
        report,
        steps_left_out: 0,
        runs_merged: 0,
        local_times: 0,
        ambiguous_times: 0,
    })
}

fn pod(item: &Value, id: PodId) -> Result<marshal_scheduler::shadow::IncumbentOutcome, Bad> {
    if !item.is_object() {
        return Err(Bad::new("item", "not an object"));
    }
    if let Some(kind) = item.get("kind").and_then(Value::as_str)
        && kind != "Pod"
    {
        return Err(Bad::new("kind", format!("a {kind}, not a Pod")));
    }
    let name = required_str(item, "/metadata/name", "metadata.name")?;
    let job = match id {
        PodId::Name => name.to_string(),
        PodId::Namespaced => format!(
            "{}/{name}",
            required_str(item, "/metadata/namespace", "metadata.namespace")?
        ),
    };
    let scheduled = scheduled_at(item)?;
    let deleted = match all_finished(item)? {
        Some(t) => Some(t),
        None => time_at(
            item,
            "/metadata/deletionTimestamp",
            "metadata.deletionTimestamp",
        )?,
    };
    let deleted = match (deleted, str_at(item, "/status/phase")) {
        (None, Some(phase @ ("Succeeded" | "Failed"))) => match last_transition(item)? {
            Some(t) => Some(t),
            None => {
                return Err(Bad::new(
                    "status.phase",
                    format!("{phase}, with no time it ended (no container end, no condition)"),
                ));
            }
        },
        (deleted, _) => deleted,
    };
    let node = str_at(item, "/spec/nodeName").map(String::from);
    outcome(job, scheduled, deleted, node, "deletion_time")
}

/// When the `PodScheduled` condition turned `True`, if it has.
fn scheduled_at(item: &Value) -> Result<Option<f64>, Bad> {
    const FIELD: &str = "status.conditions";
    let conditions = match item.pointer("/status/conditions") {
        None | Some(Value::Null) => return Ok(None),
        Some(Value::Array(c)) => c,
        Some(_) => return Err(Bad::new(FIELD, "not a list")),
    };
    let scheduled = conditions.iter().find(|c| {
        c.get("type").and_then(Value::as_str) == Some("PodScheduled")
            && c.get("status").and_then(Value::as_str) == Some("True")
    });
    match scheduled {
        None => Ok(None),
        Some(c) => match time_at(c, "/lastTransitionTime", FIELD)? {
            Some(t) => Ok(Some(t)),
            None => Err(Bad::new(FIELD, "PodScheduled has no lastTransitionTime")),
        },
    }
}

/// The latest `lastTransitionTime` of the pod's conditions, if any has one.
fn last_transition(item: &Value) -> Result<Option<f64>, Bad> {
    const FIELD: &str = "status.conditions";
    let Some(Value::Array(conditions)) = item.pointer("/status/conditions") else {
        return Ok(None);
    };
    let mut latest: Option<f64> = None;
    for c in conditions {
        if let Some(t) = time_at(c, "/lastTransitionTime", FIELD)? {
            latest = Some(latest.map_or(t, |l| l.max(t)));
        }
    }
    Ok(latest)
}

/// The latest `finishedAt` when every container has terminated (`None` when one has
/// not, or there are none, or none of them says when it finished).
fn all_finished(item: &Value) -> Result<Option<f64>, Bad> {
    const FIELD: &str = "status.containerStatuses";
    let statuses = match item.pointer("/status/containerStatuses") {
        None | Some(Value::Null) => return Ok(None),
        Some(Value::Array(s)) => s,
        Some(_) => return Err(Bad::new(FIELD, "not a list")),
    };
    let mut latest: Option<f64> = None;
    for status in statuses {
        let Some(terminated) = status
            .pointer("/state/terminated")
            .filter(|t| t.is_object())
        else {
            return Ok(None);
        };
        if let Some(t) = time_at(terminated, "/finishedAt", FIELD)? {
            latest = Some(latest.map_or(t, |l| l.max(t)));
        }
    }
    Ok(latest)
}

fn str_at<'v>(value: &'v Value, pointer: &str) -> Option<&'v str> {
    value
        .pointer(pointer)
        .and_then(Value::as_str)
        .filter(|s| !s.is_empty())
}

fn required_str<'v>(value: &'v Value, pointer: &str, field: &'static str) -> Result<&'v str, Bad> {
    str_at(value, pointer).ok_or_else(|| Bad::new(field, "missing or not a string"))
}

/// An RFC 3339 time at `pointer` in Unix seconds; `None` when absent or null.
fn time_at(value: &Value, pointer: &str, field: &'static str) -> Result<Option<f64>, Bad> {
    match value.pointer(pointer) {
        None | Some(Value::Null) => Ok(None),
        Some(Value::String(s)) => rfc3339_seconds(s).map(Some).map_err(|r| Bad::new(field, r)),
        Some(other) => Err(Bad::new(field, format!("{other} is not an RFC 3339 time"))),
    }
}

/// Unix seconds (with the fraction) of an RFC 3339 time (`2026-11-22T18:40:05Z`,
/// `…05.25+01:00`).
pub(super) fn rfc3339_seconds(s: &str) -> Result<f64, String> {
    let t = DateTime::parse_from_rfc3339(s)
        .map_err(|e| format!("{s:?} is not an RFC 3339 time ({e})"))?;
    if t.timestamp() < 0 {
        return Err(format!("{s:?} is before 1970"));
    }
    Ok(t.timestamp() as f64 + f64::from(t.timestamp_subsec_nanos()) / 1e9)
}
