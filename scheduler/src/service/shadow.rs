//! Shadow mode's live advisor: the Advisor service alone (and health), answering a
//! foreign scheduler's `Advise` calls and appending every recommendation to a shadow log
//! (JSON lines, one [`DecisionRecord`] each). It holds no cluster and no jobs, so it
//! cannot act. With `policy = "learned"` it advises through the same model slot as
//! `marshal serve` (gate, fallback, hot reload), and each record carries the path.

use std::collections::VecDeque;
use std::io::Write as _;
use std::path::Path;
use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};

use tonic::{Request, Response, Status};

use crate::service::error::ServiceError;
use std::sync::Arc;

use crate::service::model::ModelSlot;
use crate::service::pb;
use crate::service::pb::advisor_service_server::AdvisorService;
use crate::service::records::DecisionRecord;

/// Decisions kept in memory for Explain (the log has them all).
const EXPLAIN_WINDOW: usize = 100_000;

#[derive(Debug)]
pub struct ShadowAdvisor {
    policy: String,
    model: Arc<dyn ModelSlot>,
    log: Mutex<std::io::BufWriter<std::fs::File>>,
    log_name: String,
    next_id: AtomicU64,
    recent: Mutex<VecDeque<DecisionRecord>>,
    cpu_nodes_first: bool,
}

impl ShadowAdvisor {
    /// Recommends CPU-only nodes first for CPU-only jobs
    /// ([`crate::service::ServiceConfig::cpu_nodes_first`]).
    pub fn with_cpu_nodes_first(self, on: bool) -> Self {
        ShadowAdvisor {
            cpu_nodes_first: on,
            ..self
        }
    }

    /// Appends to `log` (created when missing). Decision ids continue after the
    /// largest already in it, so Explain ids stay unique across restarts. `model` serves
    /// the `learned` policy ([`crate::service::model::NoModel`] for a heuristic advisor).
    ///
    /// Only the log's tail is read ([`TAIL_BYTES`], more if no record ends in it): a log
    /// of months is not read whole at every start. Ids are handed out in order and
    /// appended within one call of each other, so the largest is among the last records.
    /// (Counting lines, as before, gave an id twice after a crash that lost a record
    /// written out of order.)
    pub fn open(
        policy: &str,
        log: &Path,
        model: Arc<dyn ModelSlot>,
    ) -> Result<Self, std::io::Error> {
        let file = std::fs::OpenOptions::new()
            .create(true)
            .read(true)
            .append(true)
            .open(log)?;
        let largest_id = largest_id_at_the_end(log, &file)?;
        Ok(ShadowAdvisor {
            policy: policy.to_string(),
            model,
            log: Mutex::new(std::io::BufWriter::new(file)),
            log_name: log.display().to_string(),
            next_id: AtomicU64::new(largest_id + 1),
            recent: Mutex::new(VecDeque::new()),
            cpu_nodes_first: false,
        })
    }

    fn append(&self, records: &[DecisionRecord]) -> Result<(), Status> {
        let mut log = self.log.lock().unwrap_or_else(|e| e.into_inner());
        let io = |e: std::io::Error| Status::internal(format!("shadow log {}: {e}", self.log_name));
        for r in records {
            let line = serde_json::to_string(r).map_err(|e| Status::internal(e.to_string()))?;
            writeln!(log, "{line}").map_err(io)?;
        }
        log.flush().map_err(io)
    }
}

/// How much of the log's end [`ShadowAdvisor::open`] reads for the largest id: a few
/// hundred records.
pub const TAIL_BYTES: u64 = 1 << 20;

/// The largest decision id among the complete records at the end of the log (0 when
/// there are none), after cutting off a torn last record.
///
/// A log that does not end in a newline was cut mid-record (a crash or a full disk while
/// appending). That record's call failed, so no caller saw it; appending after it would
/// glue the next record onto it and damage both, so it is cut off.
fn largest_id_at_the_end(log: &Path, file: &std::fs::File) -> Result<u64, std::io::Error> {
    use std::io::{Read as _, Seek as _, SeekFrom};
    let len = file.metadata()?.len();
    let mut window = TAIL_BYTES.min(len);
    let tail = loop {
        let mut reader = file;
        reader.seek(SeekFrom::Start(len - window))?;
        let mut tail = Vec::with_capacity(window as usize);
        reader.take(window).read_to_end(&mut tail)?;
        // Enough once it holds a whole line (between two newlines), or the whole log.
        if window == len || tail.iter().filter(|&&b| b == b'\n').nth(1).is_some() {
            break tail;
        }
        window = (window * 2).min(len);
    };
    let start = len - window;
    let complete = if tail.is_empty() || tail.ends_with(b"\n") {
        tail.len()
    } else {
        tail.iter().rposition(|&b| b == b'\n').map_or(0, |i| i + 1)
    };
    if complete < tail.len() {
        tracing::warn!(
            log = %log.display(),
            bytes = tail.len() - complete,
            "the shadow log ends in a torn record (no newline); cut off before appending"
        );
        file.set_len(start + complete as u64)?;
        file.sync_all()?;
    }
    // The window's first line may be a record's end; it parses as nothing and is skipped.
    #[derive(serde::Deserialize)]
    struct Id {
        id: u64,
    }
    Ok(tail[..complete]
        .split(|&b| b == b'\n')
        .filter_map(|line| serde_json::from_slice::<Id>(line).ok())
        .map(|r| r.id)
        .max()
        .unwrap_or(0))
}

#[tonic::async_trait]
impl AdvisorService for std::sync::Arc<ShadowAdvisor> {
    async fn advise(
        &self,
        req: Request<pb::AdviseRequest>,
    ) -> Result<Response<pb::AdviseResponse>, Status> {
        let req = req.into_inner();
        let (name, mut recs, mut records) = crate::service::advisor::advise_off_thread(
            req,
            &self.policy,
            self.model.as_ref(),
            self.cpu_nodes_first,
        )
        .await?;
        for (rec, record) in recs.iter_mut().zip(records.iter_mut()) {
            record.id = self.next_id.fetch_add(1, Ordering::Relaxed);
            rec.decision_id = record.id;
        }
        self.append(&records)?;
        let mut recent = self.recent.lock().unwrap_or_else(|e| e.into_inner());
        for r in records {
            if recent.len() == EXPLAIN_WINDOW {
                recent.pop_front();
            }
            recent.push_back(r);
        }
        Ok(Response::new(pb::AdviseResponse {
            recommendations: recs,
            policy: name,
        }))
    }

    async fn explain(
        &self,
        req: Request<pb::ExplainRequest>,
    ) -> Result<Response<pb::Explanation>, Status> {
        let id = req.into_inner().decision_id;
        if id == 0 {
            return Err(ServiceError::invalid("decision_id", "missing (ids start at 1)").into());
        }
        let recent = self.recent.lock().unwrap_or_else(|e| e.into_inner());
        let record = recent.iter().find(|r| r.id == id).ok_or_else(|| {
            Status::not_found(format!(
                "decision {id} is not among the last {EXPLAIN_WINDOW} of this process; \
                 the shadow log {} has every decision",
                self.log_name
            ))
        })?;
        Ok(Response::new(
            record.to_pb(&crate::domain::GpuCatalog::default()),
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::service::model::NoModel;

    #[test]
    fn a_torn_last_record_is_cut_off_before_appending_and_ids_continue() {
        let dir = tempfile::tempdir().unwrap();
        let log = dir.path().join("shadow.jsonl");
        let complete = "{\"id\":1}\n{\"id\":2}\n";
        std::fs::write(&log, format!("{complete}{{\"id\":3,\"jo")).unwrap();
        let advisor = ShadowAdvisor::open("topo-pack", &log, Arc::new(NoModel)).unwrap();
        assert_eq!(std::fs::read_to_string(&log).unwrap(), complete);
        assert_eq!(advisor.next_id.load(Ordering::Relaxed), 3);

        // A log that ends cleanly is left as it is.
        drop(advisor);
        let advisor = ShadowAdvisor::open("topo-pack", &log, Arc::new(NoModel)).unwrap();
        assert_eq!(std::fs::read_to_string(&log).unwrap(), complete);
        assert_eq!(advisor.next_id.load(Ordering::Relaxed), 3);
    }

    #[test]
    fn ids_continue_after_the_largest_even_when_a_record_was_lost() {
        let dir = tempfile::tempdir().unwrap();
        let log = dir.path().join("shadow.jsonl");
        // Two calls raced; the one holding id 5 was lost in a crash: five lines, but 6
        // is taken.
        let lines: String = [1, 2, 3, 4, 6]
            .iter()
            .map(|id| format!("{{\"id\":{id},\"job\":\"x\"}}\n"))
            .collect();
        std::fs::write(&log, &lines).unwrap();
        let advisor = ShadowAdvisor::open("topo-pack", &log, Arc::new(NoModel)).unwrap();
        assert_eq!(advisor.next_id.load(Ordering::Relaxed), 7);
        // An empty log starts at 1.
        let empty = dir.path().join("empty.jsonl");
        let advisor = ShadowAdvisor::open("topo-pack", &empty, Arc::new(NoModel)).unwrap();
        assert_eq!(advisor.next_id.load(Ordering::Relaxed), 1);
    }

    #[test]
    fn a_long_log_is_read_only_at_its_end() {
        let dir = tempfile::tempdir().unwrap();
        let log = dir.path().join("shadow.jsonl");
        // 3 MiB of records, then a torn one; the window is 1 MiB.
        let pad = "p".repeat(1000);
        let mut text = String::new();
        let mut id = 0;
        while (text.len() as u64) < 3 * TAIL_BYTES {
            id += 1;
            text.push_str(&format!("{{\"id\":{id},\"pad\":\"{pad}\"}}\n"));
        }
        let complete = text.len();
        text.push_str("{\"id\":99999,\"pa");
        std::fs::write(&log, &text).unwrap();
        let advisor = ShadowAdvisor::open("topo-pack", &log, Arc::new(NoModel)).unwrap();
        assert_eq!(advisor.next_id.load(Ordering::Relaxed), id + 1);
        assert_eq!(std::fs::metadata(&log).unwrap().len(), complete as u64);
        // One record longer than the window: the window grows until a record ends in it.
        let huge = format!("{{\"id\":41,\"pad\":\"{}\"}}\n", "q".repeat(3 << 20));
        std::fs::write(&log, format!("{{\"id\":40}}\n{huge}")).unwrap();
        let advisor = ShadowAdvisor::open("topo-pack", &log, Arc::new(NoModel)).unwrap();
        assert_eq!(advisor.next_id.load(Ordering::Relaxed), 42);
    }
}
