use super::*;
use crate::domain::{GpuId, GpuShare, Job, JobId, NodeId, Placement, WorkerPlacement};
use crate::service::jobs::{JobRecord, JobState};
use crate::service::records::{
    CandidateRecord, DecisionRecord, MAX_CANDIDATES, MigrationKind, MigrationRecord, NodeRecord,
    ScoredCandidateRecord, SlotRecord, StoredStopWait, Verdict, WorkerRecord,
};

fn placed_job() -> JobRecord {
    let mut job = Job::whole_gpus(JobId(4711), 2, 12.5, 3600.0);
    job.workers = 1;
    job.gpu = crate::domain::GpuDemand::Whole(2);
    let mut r = JobRecord::new(job, Some("key-1".into()), 1_795_000_000_000_000);
    let placement = Placement {
        workers: vec![WorkerPlacement {
            node: NodeId(17),
            gpus: (0..2)
                .map(|g| GpuShare {
                    gpu: GpuId(136 + g),
                    milli: 1000,
                    mig_compute: 0,
                    mig_memory: 0,
                })
                .collect(),
        }],
    };
    r.transition(JobState::Placed, "", Some(placement), 1_795_000_000_002_000)
        .unwrap();
    r.decision_id = 9001;
    r
}

/// A placement decision as the cycle records it, with the full candidate list.
pub(crate) fn placement_decision() -> DecisionRecord {
    let job = placed_job();
    DecisionRecord {
        id: 9001,
        source: "cycle".into(),
        at_us: 1_795_000_000_002_000,
        job: "4711".into(),
        spec: job.job.clone(),
        policy: "topo-pack".into(),
        path: "heuristic:topo-pack".into(),
        confidence: None,
        verdict: Verdict::Place,
        reason: String::new(),
        placement: vec![WorkerRecord {
            node: "node-17".into(),
            gpus: (0..2)
                .map(|index| SlotRecord {
                    index,
                    milli: 1000,
                    mig_compute: 0,
                    mig_memory: 0,
                })
                .collect(),
        }],
        queue_depth: 3,
        idle_gpus: 4096,
        feasible_nodes: 1100,
        candidates: (0..MAX_CANDIDATES as u32)
            .map(|i| CandidateRecord {
                node: format!("node-{}", 17 + i),
                idle_gpus: 8 - i % 8,
                free_milli: (8 - i % 8) * 1000,
                chosen: i == 0,
                score: None,
            })
            .collect(),
        model_version: None,
        gate_threshold: None,
        score_note: "no score: the topo-pack heuristic exposes no per-candidate score".into(),
        scored: Vec::new(),
        migration: None,
        features: None,
    }
}

fn migration_decision() -> DecisionRecord {
    DecisionRecord {
        verdict: Verdict::Migrate,
        confidence: Some(0.75),
        model_version: Some("5c0ffee5c0ffee00".into()),
        gate_threshold: Some(0.5),
        scored: vec![ScoredCandidateRecord {
            nodes: vec!["node-3".into(), "node-4".into()],
            wait: false,
            fallback_choice: true,
            chosen: true,
            logit: Some(1.5),
            probability: Some(0.8),
        }],
        migration: Some(MigrationRecord {
            kind: MigrationKind::Rebalance,
            from: vec![WorkerRecord {
                node: "node-9".into(),
                gpus: vec![],
            }],
            from_span: None,
            to_span: Some("node".into()),
            gain_s: Some(12.0),
            safety_factor: None,
            cost_s: 90.0,
            restart_s: 60.0,
            lost_work_s: 30.0,
            for_job: Some("12".into()),
            for_job_name: Some("job-12".into()),
        }),
        ..placement_decision()
    }
}

#[test]
fn records_round_trip() {
    let job = placed_job();
    assert_eq!(decode::<JobRecord>(&encode(&job).unwrap()).unwrap(), job);
    for d in [placement_decision(), migration_decision()] {
        assert_eq!(decode::<DecisionRecord>(&encode(&d).unwrap()).unwrap(), d);
    }
    let node = NodeRecord {
        registered: true,
        quarantined: true,
        failures: 3,
        reason: "3 failures".into(),
        unreachable: true,
        unreachable_since_us: 42,
        last_seen_us: 7,
        telemetry_samples: 9,
        ..NodeRecord::default()
    };
    let back: NodeRecord = decode(&encode(&node).unwrap()).unwrap();
    // The two in-memory counters are not stored.
    assert_eq!(
        back,
        NodeRecord {
            last_seen_us: 0,
            telemetry_samples: 0,
            ..node
        }
    );
}

#[test]
fn records_written_as_json_are_still_read() {
    let job = placed_job();
    let json = serde_json::to_vec(&job).unwrap();
    assert_eq!(decode::<JobRecord>(&json).unwrap(), job);
    let d = migration_decision();
    let json = serde_json::to_vec(&d).unwrap();
    assert_eq!(decode::<DecisionRecord>(&json).unwrap(), d);
}

#[test]
fn damaged_records_are_errors_not_panics() {
    let bytes = encode(&placement_decision()).unwrap();
    for cut in [1, 2, bytes.len() / 2, bytes.len() - 1] {
        let err = decode::<DecisionRecord>(&bytes[..cut]).unwrap_err();
        assert!(err.starts_with("postcard:"), "cut at {cut}: {err}");
    }
    let mut longer = bytes.clone();
    longer.push(0);
    assert!(
        decode::<DecisionRecord>(&longer)
            .unwrap_err()
            .contains("1 bytes left over")
    );
    let newer = decode::<JobRecord>(&[7, 1, 2]).unwrap_err();
    assert!(
        newer.starts_with("record format 7 was written by a newer Marshal"),
        "{newer}"
    );
    assert_eq!(
        decode::<JobRecord>(&[0xfe, 1, 2]).unwrap_err(),
        "unknown record format byte 0xfe"
    );
    assert_eq!(decode::<JobRecord>(&[]).unwrap_err(), "empty record");
    assert!(
        decode::<JobRecord>(b"{\"job\":")
            .unwrap_err()
            .starts_with("JSON:")
    );
}

/// The commit's write-back grows with these sizes; JSON took 746 B for this job record
/// and about 2.1 KB for this decision.
#[test]
fn records_stay_small() {
    let job = encode(&placed_job()).unwrap().len();
    let decision = encode(&placement_decision()).unwrap().len();
    assert!(job <= 160, "job record {job} B");
    assert!(decision <= 520, "decision record {decision} B");
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// The stored layout is the database format (see the module docs): if this fails, a
/// stored type changed; give the new layout a new format byte and keep reading this one.
#[test]
fn the_stored_layout_is_pinned() {
    assert_eq!(hex(&encode(&placed_job()).unwrap()), GOLDEN_JOB);
    assert_eq!(
        hex(&encode(&migration_decision()).unwrap()),
        GOLDEN_MIGRATION_DECISION
    );
}

/// A node record as stored; and every variant of every enum in a stored record, by the
/// index postcard stores for it. A variant inserted before others renumbers them, and
/// every stored `Completed` job would read back as the next state: add variants at the
/// end only (or bump the format byte).
#[test]
fn node_records_and_every_stored_enum_variant_are_pinned() {
    let node = NodeRecord {
        registered: true,
        cordoned: false,
        quarantined: true,
        failures: 3,
        reason: "3 failures".into(),
        unreachable: true,
        unreachable_since_us: 42,
        ..NodeRecord::default()
    };
    assert_eq!(hex(&encode(&node).unwrap()), GOLDEN_NODE);
    assert_eq!(decode::<NodeRecord>(&hex_bytes(GOLDEN_NODE)).unwrap(), node);
    let waits = vec![StoredStopWait {
        node: "n-0".into(),
        attempt: 2,
        until_us: 1_795_000_000_000_000,
    }];
    assert_eq!(hex(&encode(&waits).unwrap()), GOLDEN_STOP_WAITS);
    assert_eq!(
        decode::<Vec<StoredStopWait>>(&hex_bytes(GOLDEN_STOP_WAITS)).unwrap(),
        waits
    );
    let states: Vec<String> = JobState::ALL.iter().map(of).collect();
    assert_eq!(
        states,
        ["00", "01", "02", "03", "04", "05", "06", "07", "08"]
    );
    assert_eq!(
        [
            Verdict::Place,
            Verdict::Wait,
            Verdict::Reject,
            Verdict::Migrate
        ]
        .map(|v| of(&v)),
        ["00", "01", "02", "03"]
    );
    assert_eq!(
        [MigrationKind::Consolidate, MigrationKind::Rebalance].map(|v| of(&v)),
        ["00", "01"]
    );
    use crate::domain::{CommPattern, GpuDemand};
    assert_eq!(
        [
            GpuDemand::None,
            GpuDemand::Whole(2),
            GpuDemand::Milli(300),
            GpuDemand::Mig {
                compute: 1,
                memory: 1
            }
        ]
        .map(|v| of(&v)),
        ["00", "0102", "02ac02", "030101"]
    );
    assert_eq!(
        [
            CommPattern::None,
            CommPattern::DataParallel,
            CommPattern::TensorParallel,
            CommPattern::PipelineParallel
        ]
        .map(|v| of(&v)),
        ["00", "01", "02", "03"]
    );
    // An elastic job's bounds follow `Option`'s 1.
    assert_eq!(
        of(&Some(crate::domain::Elastic {
            min_workers: 2,
            max_workers: 8
        })),
        "010208"
    );
}

/// `value` in postcard, in hex.
fn of<T: serde::Serialize>(value: &T) -> String {
    hex(&postcard::to_allocvec(value).unwrap())
}

fn hex_bytes(text: &str) -> Vec<u8> {
    (0..text.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(&text[i..i + 2], 16).unwrap())
        .collect()
}

const GOLDEN_STOP_WAITS: &str = "0101036e2d300280c0f995e0a2b006";
const GOLDEN_NODE: &str = "01010001030a33206661696c757265730154";

const GOLDEN_JOB: &str = "01e724086a6f622d343731310764656661756c7400010102000000010000000000000020ac400000000000209c400000000000003e400000000000004e4000010000000000000029400100010111028801e80700008901e807000080c0f995e0a2b006a0dff995e0a2b006a9460101056b65792d31c52000b061bfda410000000000000000000000b061bfda410000";
const GOLDEN_MIGRATION_DECISION: &str = "01a946056379636c65a0dff995e0a2b0060434373131e724086a6f622d343731310764656661756c7400010102000000010000000000000020ac400000000000209c400000000000003e400000000000004e40000100000000000000294009746f706f2d7061636b136865757269737469633a746f706f2d7061636b01000000000000e83f030001076e6f64652d31370200e807000001e8070000038020cc0810076e6f64652d313708c03e0100076e6f64652d313807d8360000076e6f64652d313906f02e0000076e6f64652d32300588270000076e6f64652d323104a01f0000076e6f64652d323203b8170000076e6f64652d323302d00f0000076e6f64652d323401e8070000076e6f64652d323508c03e0000076e6f64652d323607d8360000076e6f64652d323706f02e0000076e6f64652d32380588270000076e6f64652d323904a01f0000076e6f64652d333003b8170000076e6f64652d333102d00f0000076e6f64652d333201e807000001103563306666656535633066666565303001000000000000e03f406e6f2073636f72653a2074686520746f706f2d7061636b20686575726973746963206578706f736573206e6f207065722d63616e6469646174652073636f72650102066e6f64652d33066e6f64652d3400010101000000000000f83f019a9999999999e93f010101066e6f64652d39000001046e6f64650100000000000028400000000000008056400000000000004e400000000000003e400102313201066a6f622d3132";
