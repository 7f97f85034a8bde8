//! Persistence in redb: jobs, node status, decisions and counters, written by one writer
//! in batches (group commit), each batch one durable transaction.

use std::path::{Path, PathBuf};

use redb::{Database, Durability, ReadableDatabase, ReadableTable, TableDefinition};

use crate::service::codec;
use crate::service::inventory::Inventory;
use crate::service::jobs::JobRecord;
use crate::service::records::{DecisionRecord, NodeRecord, StoredStopWait};

const JOBS: TableDefinition<u64, &[u8]> = TableDefinition::new("jobs");
const NODES: TableDefinition<&str, &[u8]> = TableDefinition::new("nodes");
const DECISIONS: TableDefinition<u64, &[u8]> = TableDefinition::new("decisions");
const META: TableDefinition<&str, u64> = TableDefinition::new("meta");
/// The inventory the job records' ids refer to (`service::inventory`), under one key.
const INVENTORY: TableDefinition<&str, &[u8]> = TableDefinition::new("inventory");
const INVENTORY_KEY: &str = "current";
/// Per job, the nodes still to confirm that its stopped workers ended
/// (`service::stop_waits`). Tables of their own, so that the job and node records keep
/// their layout (`service::codec`).
const STOP_WAITS: TableDefinition<u64, &[u8]> = TableDefinition::new("stop_waits");
/// Per node, the stop grace (µs) its agent confirms stops within; absent: it does not.
const STOP_GRACES: TableDefinition<&str, i64> = TableDefinition::new("stop_graces");

pub const META_NEXT_JOB: &str = "next_job_id";
pub const META_NEXT_DECISION: &str = "next_decision_id";
/// The database's identity, made when it is created (or first opened by a Marshal that
/// keeps one) and never changed: the decision log's files name it.
pub const META_DATABASE_ID: &str = "database_id";

#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    #[error("database {path}: {message}")]
    Db { path: String, message: String },
    #[error("database {path}: table {table}, key {key}: corrupt record: {message}")]
    Corrupt {
        path: String,
        table: &'static str,
        key: String,
        message: String,
    },
}

/// One group commit: records already serialised under the scheduler's lock.
#[derive(Debug, Default)]
pub struct Batch {
    pub jobs: Vec<(u64, Vec<u8>)>,
    pub nodes: Vec<(String, Vec<u8>)>,
    pub decisions: Vec<(u64, Vec<u8>)>,
    pub meta: Vec<(&'static str, u64)>,
    /// The inventory the batch's job records refer to, when it changes.
    pub inventory: Option<Vec<u8>>,
    /// Jobs to delete (finished and past their retention).
    pub deleted_jobs: Vec<u64>,
    /// Delete every decision record with a smaller id (past their retention).
    pub decisions_before: Option<u64>,
    /// A job's stop waits, serialised; `None`: it has none any more.
    pub stop_waits: Vec<(u64, Option<Vec<u8>>)>,
    /// A node's stop grace; `None`: its agent does not confirm stops.
    pub stop_graces: Vec<(String, Option<i64>)>,
}

impl Batch {
    pub fn is_empty(&self) -> bool {
        self.jobs.is_empty()
            && self.nodes.is_empty()
            && self.decisions.is_empty()
            && self.meta.is_empty()
            && self.inventory.is_none()
            && self.deleted_jobs.is_empty()
            && self.decisions_before.is_none()
            && self.stop_waits.is_empty()
            && self.stop_graces.is_empty()
    }
}

#[derive(Debug, Default)]
pub struct Loaded {
    pub jobs: Vec<JobRecord>,
    pub nodes: Vec<(String, NodeRecord)>,
    pub next_job: u64,
    pub next_decision: u64,
    /// The inventory the job records were written under; `None` in a database written
    /// before it was kept.
    pub inventory: Option<Inventory>,
    /// See [`META_DATABASE_ID`].
    pub database_id: u64,
    /// Per job, its stop waits (a damaged record is left out, with an error logged).
    pub stop_waits: Vec<(u64, Vec<StoredStopWait>)>,
    /// The keys of damaged stop-wait records.
    pub damaged_stop_waits: Vec<u64>,
    /// Per node, its agent's stop grace (µs).
    pub stop_graces: Vec<(String, i64)>,
}

#[derive(Debug)]
pub struct Store {
    db: Database,
    path: PathBuf,
    /// fsync every commit (the recovery guarantees depend on it).
    durable: bool,
}

/// A fresh database identity. It must differ between databases, not be reproducible:
/// no schedule depends on it, so it takes no seed.
fn new_database_id(path: &Path) -> u64 {
    use std::hash::BuildHasher as _;
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos());
    std::collections::hash_map::RandomState::new().hash_one((now, std::process::id(), path))
}

impl Store {
    /// Opens (or creates) the database. `durable: false` skips the fsync of each commit:
    /// for measuring the scheduler without the disk, never for production.
    pub fn open(path: &Path, durable: bool) -> Result<Store, StoreError> {
        let err = |e: &dyn std::fmt::Display| StoreError::Db {
            path: path.display().to_string(),
            message: e.to_string(),
        };
        // redb asserts, rather than returns an error, on some damaged files (one cut
        // short of its header's length): that is a damaged database, not a crash.
        let db = std::panic::catch_unwind(|| Database::create(path))
            .map_err(|panic| {
                let what = panic
                    .downcast_ref::<&str>()
                    .map(|s| s.to_string())
                    .or_else(|| panic.downcast_ref::<String>().cloned())
                    .unwrap_or_else(|| "no message".into());
                err(&format!("the database file is damaged (redb: {what})"))
            })?
            .map_err(|e| err(&e))?;
        // Creating the tables up front lets readers open them unconditionally.
        let txn = db.begin_write().map_err(|e| err(&e))?;
        {
            txn.open_table(JOBS).map_err(|e| err(&e))?;
            txn.open_table(NODES).map_err(|e| err(&e))?;
            txn.open_table(DECISIONS).map_err(|e| err(&e))?;
            let mut meta = txn.open_table(META).map_err(|e| err(&e))?;
            if meta.get(META_DATABASE_ID).map_err(|e| err(&e))?.is_none() {
                meta.insert(META_DATABASE_ID, new_database_id(path))
                    .map_err(|e| err(&e))?;
            }
            txn.open_table(INVENTORY).map_err(|e| err(&e))?;
            txn.open_table(STOP_WAITS).map_err(|e| err(&e))?;
            txn.open_table(STOP_GRACES).map_err(|e| err(&e))?;
        }
        txn.commit().map_err(|e| err(&e))?;
        Ok(Store {
            db,
            path: path.to_path_buf(),
            durable,
        })
    }

    fn err(&self, e: impl std::fmt::Display) -> StoreError {
        StoreError::Db {
            path: self.path.display().to_string(),
            message: e.to_string(),
        }
    }

    /// Everything but the decisions (read on demand by Explain). A corrupt job record
    /// stops the load: starting without it would lose the job silently.
    pub fn load(&self) -> Result<Loaded, StoreError> {
        let txn = self.db.begin_read().map_err(|e| self.err(e))?;
        let mut loaded = Loaded::default();
        let jobs = txn.open_table(JOBS).map_err(|e| self.err(e))?;
        for entry in jobs.iter().map_err(|e| self.err(e))? {
            let (k, v) = entry.map_err(|e| self.err(e))?;
            let record: JobRecord =
                codec::decode(v.value()).map_err(|message| StoreError::Corrupt {
                    path: self.path.display().to_string(),
                    table: "jobs",
                    key: k.value().to_string(),
                    message,
                })?;
            loaded.jobs.push(record);
        }
        let nodes = txn.open_table(NODES).map_err(|e| self.err(e))?;
        for entry in nodes.iter().map_err(|e| self.err(e))? {
            let (k, v) = entry.map_err(|e| self.err(e))?;
            let record: NodeRecord =
                codec::decode(v.value()).map_err(|message| StoreError::Corrupt {
                    path: self.path.display().to_string(),
                    table: "nodes",
                    key: k.value().to_string(),
                    message,
                })?;
            loaded.nodes.push((k.value().to_string(), record));
        }
        let meta = txn.open_table(META).map_err(|e| self.err(e))?;
        let get = |key: &str| -> Result<u64, StoreError> {
            Ok(meta
                .get(key)
                .map_err(|e| self.err(e))?
                .map(|v| v.value())
                .unwrap_or(1))
        };
        // The counters are committed with the records, but an id handed out twice
        // overwrites a record (and an Explain then answers for another decision), so
        // they are never taken below what the tables hold: a counter missing or behind
        // (a database edited by hand, or written by a build with a bug) costs nothing.
        let largest_job = loaded.jobs.iter().map(|r| u64::from(r.job.id.0)).max();
        loaded.next_job = get(META_NEXT_JOB)?.max(largest_job.map_or(1, |j| j + 1));
        let decisions = txn.open_table(DECISIONS).map_err(|e| self.err(e))?;
        let last_decision = decisions
            .last()
            .map_err(|e| self.err(e))?
            .map_or(0, |(k, _)| k.value());
        let last_referenced = loaded.jobs.iter().map(|r| r.decision_id).max().unwrap_or(0);
        loaded.next_decision = get(META_NEXT_DECISION)?
            .max(last_decision.saturating_add(1))
            .max(last_referenced.saturating_add(1));
        loaded.database_id = meta
            .get(META_DATABASE_ID)
            .map_err(|e| self.err(e))?
            .map_or(0, |v| v.value());
        let inventory = txn.open_table(INVENTORY).map_err(|e| self.err(e))?;
        if let Some(v) = inventory.get(INVENTORY_KEY).map_err(|e| self.err(e))? {
            loaded.inventory =
                Some(
                    codec::decode(v.value()).map_err(|message| StoreError::Corrupt {
                        path: self.path.display().to_string(),
                        table: "inventory",
                        key: INVENTORY_KEY.into(),
                        message,
                    })?,
                );
        }
        let stop_waits = txn.open_table(STOP_WAITS).map_err(|e| self.err(e))?;
        for entry in stop_waits.iter().map_err(|e| self.err(e))? {
            let (k, v) = entry.map_err(|e| self.err(e))?;
            // Unlike a job, a damaged wait loses no work: it only ends a hold early (and
            // a hold lasts one stop grace), so it does not stop the start.
            match codec::decode(v.value()) {
                Ok(waits) => loaded.stop_waits.push((k.value(), waits)),
                Err(message) => {
                    tracing::error!(
                        database = %self.path.display(),
                        table = "stop_waits",
                        key = k.value(),
                        %message,
                        "corrupt record left out (and deleted): the job's next START is not held for its stopped workers"
                    );
                    loaded.damaged_stop_waits.push(k.value());
                }
            }
        }
        let graces = txn.open_table(STOP_GRACES).map_err(|e| self.err(e))?;
        for entry in graces.iter().map_err(|e| self.err(e))? {
            let (k, v) = entry.map_err(|e| self.err(e))?;
            loaded.stop_graces.push((k.value().to_string(), v.value()));
        }
        Ok(loaded)
    }

    /// Writes one batch durably (fsync before returning).
    pub fn commit(&self, batch: &Batch) -> Result<(), StoreError> {
        let mut txn = self.db.begin_write().map_err(|e| self.err(e))?;
        if !self.durable {
            txn.set_durability(Durability::None)
                .map_err(|e| self.err(e))?;
        }
        {
            let mut jobs = txn.open_table(JOBS).map_err(|e| self.err(e))?;
            for (k, v) in &batch.jobs {
                jobs.insert(*k, v.as_slice()).map_err(|e| self.err(e))?;
            }
            for k in &batch.deleted_jobs {
                jobs.remove(*k).map_err(|e| self.err(e))?;
            }
            let mut nodes = txn.open_table(NODES).map_err(|e| self.err(e))?;
            for (k, v) in &batch.nodes {
                nodes
                    .insert(k.as_str(), v.as_slice())
                    .map_err(|e| self.err(e))?;
            }
            let mut decisions = txn.open_table(DECISIONS).map_err(|e| self.err(e))?;
            for (k, v) in &batch.decisions {
                decisions
                    .insert(*k, v.as_slice())
                    .map_err(|e| self.err(e))?;
            }
            if let Some(below) = batch.decisions_before {
                decisions
                    .retain_in(..below, |_, _| false)
                    .map_err(|e| self.err(e))?;
            }
            let mut meta = txn.open_table(META).map_err(|e| self.err(e))?;
            for (k, v) in &batch.meta {
                meta.insert(*k, *v).map_err(|e| self.err(e))?;
            }
            let mut stop_waits = txn.open_table(STOP_WAITS).map_err(|e| self.err(e))?;
            for (k, v) in &batch.stop_waits {
                match v {
                    Some(bytes) => stop_waits.insert(*k, bytes.as_slice()).map(drop),
                    None => stop_waits.remove(*k).map(drop),
                }
                .map_err(|e| self.err(e))?;
            }
            let mut graces = txn.open_table(STOP_GRACES).map_err(|e| self.err(e))?;
            for (k, v) in &batch.stop_graces {
                match v {
                    Some(us) => graces.insert(k.as_str(), *us).map(drop),
                    None => graces.remove(k.as_str()).map(drop),
                }
                .map_err(|e| self.err(e))?;
            }
            if let Some(bytes) = &batch.inventory {
                txn.open_table(INVENTORY)
                    .map_err(|e| self.err(e))?
                    .insert(INVENTORY_KEY, bytes.as_slice())
                    .map_err(|e| self.err(e))?;
            }
        }
        txn.commit().map_err(|e| self.err(e))
    }

    pub fn decision(&self, id: u64) -> Result<Option<DecisionRecord>, StoreError> {
        let txn = self.db.begin_read().map_err(|e| self.err(e))?;
        let table = txn.open_table(DECISIONS).map_err(|e| self.err(e))?;
        let Some(v) = table.get(id).map_err(|e| self.err(e))? else {
            return Ok(None);
        };
        codec::decode(v.value())
            .map(Some)
            .map_err(|message| StoreError::Corrupt {
                path: self.path.display().to_string(),
                table: "decisions",
                key: id.to_string(),
                message,
            })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::domain::{Job, JobId};

    #[test]
    fn a_database_file_cut_short_is_an_error_naming_it_not_a_panic() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("t.redb");
        drop(Store::open(&path, true).unwrap());
        let whole = std::fs::read(&path).unwrap();
        for len in [500, 1000, 4096, whole.len() / 2] {
            let cut = dir.path().join(format!("cut-{len}.redb"));
            std::fs::write(&cut, &whole[..len.min(whole.len())]).unwrap();
            let err = Store::open(&cut, true).unwrap_err().to_string();
            assert!(err.contains(&format!("cut-{len}.redb")), "{len}: {err}");
        }
    }

    #[test]
    fn a_database_keeps_its_identity_and_another_has_its_own() {
        let dir = tempfile::tempdir().unwrap();
        let (a, b) = (dir.path().join("a.redb"), dir.path().join("b.redb"));
        let id = |path: &Path| Store::open(path, true).unwrap().load().unwrap().database_id;
        let first = id(&a);
        assert_ne!(first, 0);
        assert_eq!(id(&a), first, "reopened, the identity changed");
        assert_ne!(id(&b), first);
    }

    #[test]
    fn ids_continue_past_the_stored_records_whatever_the_counters_say() {
        let dir = tempfile::tempdir().unwrap();
        let store = Store::open(&dir.path().join("t.redb"), true).unwrap();
        let mut job = JobRecord::new(Job::whole_gpus(JobId(41), 1, 0.0, 1.0), None, 7);
        job.decision_id = 90;
        store
            .commit(&Batch {
                jobs: vec![(41, codec::encode(&job).unwrap())],
                decisions: vec![(120, b"{}".to_vec())],
                // Counters behind the tables (no META_NEXT_DECISION at all).
                meta: vec![(META_NEXT_JOB, 3)],
                ..Default::default()
            })
            .unwrap();
        let loaded = store.load().unwrap();
        assert_eq!(loaded.next_job, 42);
        assert_eq!(loaded.next_decision, 121);
        // A counter ahead of the tables is kept (ids are never reused).
        store
            .commit(&Batch {
                meta: vec![(META_NEXT_JOB, 500), (META_NEXT_DECISION, 900)],
                ..Default::default()
            })
            .unwrap();
        let loaded = store.load().unwrap();
        assert_eq!((loaded.next_job, loaded.next_decision), (500, 900));
    }

    #[test]
    fn a_committed_batch_survives_reopening_and_a_corrupt_job_stops_the_load() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("t.redb");
        {
            let store = Store::open(&path, true).unwrap();
            // Job 5 as written before records had a format byte (JSON), job 6 as now.
            let r = JobRecord::new(Job::whole_gpus(JobId(5), 1, 0.0, 1.0), None, 7);
            let r6 = JobRecord::new(Job::whole_gpus(JobId(6), 1, 0.0, 1.0), None, 8);
            let batch = Batch {
                jobs: vec![
                    (5, serde_json::to_vec(&r).unwrap()),
                    (6, codec::encode(&r6).unwrap()),
                ],
                nodes: vec![("n1".into(), b"{\"registered\":true,\"cordoned\":false,\"quarantined\":false,\"failures\":0,\"reason\":\"\"}".to_vec())],
                decisions: vec![],
                meta: vec![(META_NEXT_JOB, 6)],
                inventory: None,
                deleted_jobs: vec![],
                decisions_before: None,
                stop_waits: vec![],
                stop_graces: vec![],
            };
            store.commit(&batch).unwrap();
        }
        let store = Store::open(&path, true).unwrap();
        let loaded = store.load().unwrap();
        assert_eq!(loaded.jobs.len(), 2);
        assert_eq!(loaded.jobs[0].job.id, JobId(5));
        assert_eq!(loaded.jobs[1].job.id, JobId(6));
        assert!(loaded.nodes[0].1.registered);
        // The counter said 6, but job 6 is taken: a new job would have overwritten it.
        assert_eq!(loaded.next_job, 7);
        assert_eq!(loaded.next_decision, 1);
        let bad = Batch {
            jobs: vec![(9, b"{not json".to_vec())],
            ..Default::default()
        };
        store.commit(&bad).unwrap();
        let err = store.load().unwrap_err().to_string();
        assert!(err.contains("table jobs, key 9"), "{err}");
        drop(store);
        dir.close().unwrap();
    }

    /// Stop waits and stop graces are stored, replaced and deleted per key; a damaged
    /// wait is left out of the load (it only ends a hold early), naming nothing else.
    #[test]
    fn stop_waits_and_graces_round_trip_and_a_damaged_wait_is_left_out() {
        let dir = tempfile::tempdir().unwrap();
        let store = Store::open(&dir.path().join("t.redb"), true).unwrap();
        let wait = |attempt| StoredStopWait {
            node: "n-0".into(),
            attempt,
            until_us: 1_700_000_000_000_000,
        };
        store
            .commit(&Batch {
                stop_waits: vec![
                    (3, Some(codec::encode(&vec![wait(1)]).unwrap())),
                    (4, Some(vec![1, 0xff, 0xff])),
                    (5, Some(codec::encode(&vec![wait(2), wait(3)]).unwrap())),
                ],
                stop_graces: vec![("n-0".into(), Some(30_000_000)), ("n-1".into(), Some(5))],
                ..Default::default()
            })
            .unwrap();
        let loaded = store.load().unwrap();
        assert_eq!(
            loaded.stop_waits,
            vec![(3, vec![wait(1)]), (5, vec![wait(2), wait(3)])]
        );
        assert_eq!(loaded.damaged_stop_waits, vec![4]);
        assert_eq!(
            loaded.stop_graces,
            vec![("n-0".into(), 30_000_000), ("n-1".into(), 5)]
        );
        store
            .commit(&Batch {
                stop_waits: vec![(3, None), (4, None)],
                stop_graces: vec![("n-1".into(), None)],
                ..Default::default()
            })
            .unwrap();
        let loaded = store.load().unwrap();
        assert_eq!(loaded.stop_waits, vec![(5, vec![wait(2), wait(3)])]);
        assert_eq!(loaded.stop_graces, vec![("n-0".into(), 30_000_000)]);
    }
}
