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

    /// Appends to `log` (created when missing). Decision ids continue after those
    /// already in it, so Explain ids stay unique across restarts. `model` serves the
    /// `learned` policy ([`crate::service::model::NoModel`] for a heuristic advisor).
    pub fn open(
        policy: &str,
        log: &Path,
        model: Arc<dyn ModelSlot>,
    ) -> Result<Self, std::io::Error> {
        let existing = match std::fs::read(log) {
            Ok(bytes) => {
                let complete = drop_torn_record(log, &bytes)?;
                bytes[..complete]
                    .split(|&b| b == b'\n')
                    .filter(|l| !l.trim_ascii().is_empty())
                    .count() as u64
            }
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => 0,
            Err(e) => return Err(e),
        };
        let file = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(log)?;
        Ok(ShadowAdvisor {
            policy: policy.to_string(),
            model,
            log: Mutex::new(std::io::BufWriter::new(file)),
            log_name: log.display().to_string(),
            next_id: AtomicU64::new(existing + 1),
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

/// A log that does not end in a newline was cut mid-record (a crash or a full disk while
/// appending). That record's call failed, so no caller saw it; appending after it would
/// glue the next record onto it and damage both, so it is cut off. Returns the length of
/// the complete records.
fn drop_torn_record(log: &Path, bytes: &[u8]) -> Result<usize, std::io::Error> {
    if bytes.is_empty() || bytes.ends_with(b"\n") {
        return Ok(bytes.len());
    }
    let complete = bytes.iter().rposition(|&b| b == b'\n').map_or(0, |i| i + 1);
    tracing::warn!(
        log = %log.display(),
        bytes = bytes.len() - complete,
        "the shadow log ends in a torn record (no newline); cut off before appending"
    );
    let file = std::fs::OpenOptions::new().write(true).open(log)?;
    file.set_len(complete as u64)?;
    file.sync_all()?;
    Ok(complete)
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
}
