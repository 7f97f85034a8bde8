use chrono::FixedOffset;
use marshal_scheduler::shadow::IncumbentOutcome;
use proptest::prelude::*;

use super::pods::rfc3339_seconds;
use super::*;
use crate::parse_incumbent_outcomes;

const SACCT_ISO: &str = include_str!("../../tests/fixtures/sacct-allocations-iso.txt");
const SACCT_STEPS: &str = include_str!("../../tests/fixtures/sacct-steps-epoch.txt");
const PODS: &str = include_str!("../../tests/fixtures/kubectl-pods.json");

fn row(
    job: &str,
    scheduled: Option<f64>,
    deleted: Option<f64>,
    node: Option<&str>,
) -> IncumbentOutcome {
    IncumbentOutcome {
        job: job.into(),
        scheduled,
        deleted,
        node: node.map(String::from),
    }
}

fn plus_one_hour() -> FixedOffset {
    parse_utc_offset("+01:00").unwrap()
}

fn utc() -> FixedOffset {
    parse_utc_offset("Z").unwrap()
}

#[test]
fn sacct_local_times_are_shifted_by_the_offset_and_never_started_jobs_have_no_times() {
    let export = parse_sacct("sacct.txt", SACCT_ISO, plus_one_hour()).unwrap();
    assert_eq!(
        export.rows,
        vec![
            row(
                "4211",
                Some(1_795_162_445.0),
                Some(1_795_168_961.0),
                Some("gpu01")
            ),
            row("4212", Some(1_795_162_800.0), None, Some("node5")),
            row("4213", None, None, None),
            // Cancelled while pending: its End is the cancellation, not a run's end.
            row("4214", None, None, None),
            row(
                "4215_7",
                Some(1_795_162_710.0),
                Some(1_795_165_200.0),
                Some("a1")
            ),
            row(
                "4216+0",
                Some(1_795_163_400.0),
                Some(1_795_169_700.0),
                Some("rack1-n08")
            ),
            // PENDING with an expected start from the backfill scheduler.
            row("4218", None, None, None),
        ]
    );
    assert_eq!(export.report.skipped_at(), vec![(8, "End")]);
    assert!(export.report.skipped[0].reason.contains("yesterday"));
    assert_eq!((export.report.rows_read, export.report.rows_kept()), (8, 7));
    assert_eq!(export.steps_left_out, 0);
    // Start and End of every row read, up to the bad End of line 8; Submit is not read.
    assert_eq!(export.local_times, 10);
}

#[test]
fn sacct_times_without_an_offset_are_utc() {
    let export = parse_sacct("sacct.txt", SACCT_ISO, utc()).unwrap();
    assert_eq!(export.rows[0].scheduled, Some(1_795_162_445.0 + 3600.0));
}

#[test]
fn sacct_epoch_times_steps_reordered_columns_and_bad_rows() {
    let export = parse_sacct("steps.txt", SACCT_STEPS, plus_one_hour()).unwrap();
    assert_eq!(
        export.rows,
        vec![
            row(
                "101",
                Some(1_795_162_445.0),
                Some(1_795_168_961.0),
                Some("gpu08")
            ),
            row("102", Some(1_795_162_800.0), None, Some("gpu10")),
        ],
        "epoch times are not shifted by the offset"
    );
    assert_eq!(export.steps_left_out, 4);
    assert_eq!(export.local_times, 0);
    // Line 8 repeats job 101's run: merged, changing nothing.
    assert_eq!(export.runs_merged, 1);
    assert_eq!(
        export.report.skipped_at(),
        vec![(9, "End"), (10, "Start"), (11, "NodeList")]
    );
    assert!(export.report.skipped[0].reason.contains("before its start"));
    assert_eq!((export.report.rows_read, export.report.rows_kept()), (6, 3));
}

#[test]
fn a_sacct_export_of_steps_only_says_to_export_allocations() {
    let text = "JobID|Start|End|State|NodeList\n\
                101.batch|1795162445|1795168961|COMPLETED|gpu08\n\
                101.0|1795162446|1795168960|COMPLETED|gpu08\n";
    let err = parse_sacct("steps.txt", text, utc())
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("only job steps (2 rows") && err.contains("--allocations"),
        "{err}"
    );
}

/// `sacct --duplicates --allocations`: every run of a requeued job is a row of its own.
#[test]
fn sacct_runs_of_a_requeued_job_become_one_row() {
    let text = "JobID|State|Start|End|NodeList\n\
                7|REQUEUED|1000|1500|gpu01\n\
                8|PREEMPTED|2000|2100|gpu02\n\
                7|COMPLETED|1600|4000|gpu05\n\
                8|RUNNING|2200|Unknown|gpu03\n\
                9|NODE_FAIL|3000|3100|gpu04\n\
                9|PENDING|Unknown|Unknown|None assigned\n\
                10|COMPLETED|5200|6000|gpu07\n\
                10|REQUEUED|5000|5100|gpu06\n";
    let export = parse_sacct("dup.txt", text, utc()).unwrap();
    assert_eq!(
        export.rows,
        vec![
            // Placed first at 1000 on gpu01, ended with its second run.
            row("7", Some(1000.0), Some(4000.0), Some("gpu01")),
            // Its second run is still running: not ended.
            row("8", Some(2000.0), None, Some("gpu02")),
            // Waiting again after a node failure: not ended either.
            row("9", Some(3000.0), None, Some("gpu04")),
            // Runs listed out of order: the earlier run still gives start and node.
            row("10", Some(5000.0), Some(6000.0), Some("gpu06")),
        ]
    );
    assert_eq!(export.runs_merged, 4);
    assert_eq!(export.report.rows_skipped, 0);
    // A bad run is skipped with its line and leaves the job's other runs as they are.
    let bad = "JobID|Start|End\n7|1000|1500\n7|1600|1200\n";
    let export = parse_sacct("bad.txt", bad, utc()).unwrap();
    assert_eq!(
        export.rows,
        vec![row("7", Some(1000.0), Some(1500.0), None)]
    );
    assert_eq!(export.report.skipped_at(), vec![(3, "End")]);
    assert_eq!(export.runs_merged, 0);
}

#[test]
fn sacct_times_in_a_time_zone_take_the_offset_in_force_across_daylight_saving() {
    // Europe/Berlin: CET (+01:00) until 2026-03-29 02:00, then CEST (+02:00) until
    // 2026-10-25 03:00, when 02:00–03:00 comes twice.
    let berlin = parse_time_zone("Europe/Berlin").unwrap();
    let utc_of = |t: &str| chrono::DateTime::parse_from_rfc3339(t).unwrap().timestamp() as f64;
    let text = "JobID|Start|End\n\
                1|2026-03-29T01:30:00|2026-03-29T03:30:00\n\
                2|2026-03-29T02:30:00|2026-03-29T04:00:00\n\
                3|2026-10-25T02:30:00|2026-10-25T04:00:00\n";
    let export = parse_sacct("dst.txt", text, berlin).unwrap();
    assert_eq!(
        export.rows,
        vec![
            // One hour of wall clock across the spring change is one hour of UTC less.
            row(
                "1",
                Some(utc_of("2026-03-29T00:30:00Z")),
                Some(utc_of("2026-03-29T01:30:00Z")),
                None
            ),
            // 02:30 on the autumn night happened twice: the earlier, in CEST.
            row(
                "3",
                Some(utc_of("2026-10-25T00:30:00Z")),
                Some(utc_of("2026-10-25T03:00:00Z")),
                None
            ),
        ]
    );
    assert_eq!(export.ambiguous_times, 1);
    // Row 2 stops at its bad start, so its end is never read.
    assert_eq!(export.local_times, 5);
    // 02:30 on the spring night never happened: a bad time, skipped with its line.
    assert_eq!(export.report.skipped_at(), vec![(3, "Start")]);
    let reason = &export.report.skipped[0].reason;
    assert!(
        reason.contains("never happened in Europe/Berlin"),
        "{reason}"
    );
    // A fixed offset reads the whole file with one offset, an hour off on one side.
    let fixed = parse_sacct("dst.txt", text, plus_one_hour()).unwrap();
    assert_eq!(fixed.rows[0].deleted, Some(utc_of("2026-03-29T02:30:00Z")));
    assert_eq!(fixed.ambiguous_times, 0);
    for bad in ["Europe/Atlantis", "", "+01:00", "CEST-ish"] {
        let err = parse_time_zone(bad).unwrap_err();
        assert!(err.contains("IANA time zone"), "{bad}: {err}");
    }
    assert_eq!(
        parse_time_zone(" UTC ").unwrap(),
        WallClock::Zone(chrono_tz::Tz::UTC)
    );
}

#[test]
fn sacct_missing_required_column_is_an_error_naming_it() {
    for (text, column) in [
        ("JobID|Start|State\n1|Unknown|PENDING\n", "End"),
        ("JobID|End\n1|Unknown\n", "Start"),
        ("Job|Start|End\n1|Unknown|Unknown\n", "JobID"),
    ] {
        let err = parse_sacct("s.txt", text, utc()).unwrap_err().to_string();
        assert!(
            err.contains("s.txt") && err.contains(&format!("`{column}`")),
            "{err}"
        );
    }
    let err = parse_sacct("s.txt", "JobID|Start|End\n1.batch|1|2\n", utc()).unwrap_err();
    assert!(
        err.to_string().contains("only job steps (1 row such as"),
        "{err}"
    );
}

#[test]
fn utc_offsets_parse_in_the_usual_spellings_and_refuse_the_rest() {
    for (text, seconds) in [
        ("+02:00", 7200),
        ("-05:30", -19_800),
        ("+0530", 19_800),
        ("+09", 32_400),
        ("Z", 0),
        ("UTC", 0),
    ] {
        assert_eq!(
            parse_utc_offset(text).unwrap().local_minus_utc(),
            seconds,
            "{text}"
        );
    }
    for bad in [
        "",
        "2",
        "+2",
        "+24:00",
        "+01:60",
        "+0:100",
        "+1é1",
        "+01:00:00",
    ] {
        assert!(parse_utc_offset(bad).is_err(), "{bad}");
    }
}

#[test]
fn hostlists_give_their_first_host() {
    for (list, first) in [
        ("gpu[01-03,07]", Some("gpu01")),
        ("gpu[01-03]", Some("gpu01")),
        ("node5", Some("node5")),
        ("a[1-2],b3", Some("a1")),
        ("b3,a[1-2]", Some("b3")),
        ("gpu[007]", Some("gpu007")),
        ("rack[1-2]-n[08-09]", Some("rack1-n08")),
        ("None assigned", None),
        ("", None),
    ] {
        assert_eq!(first_host(list).unwrap().as_deref(), first, "{list}");
    }
    for bad in ["gpu[01-03", "gpu]", "gpu[]", "gpu[a-b]", "[1-2[3]]", ",a"] {
        assert!(first_host(bad).is_err(), "{bad}");
    }
}

proptest! {
    #[test]
    fn a_hostlist_starts_with_its_first_range_start_zero_padded(
        prefix in "[a-z][a-z-]{0,6}",
        width in 1usize..5,
        lo in 0u32..500,
        span in 0u32..50,
        more in proptest::collection::vec(0u32..1000, 0..3),
        tail in proptest::option::of("[a-z]{1,4}[0-9]{1,2}"),
    ) {
        let pad = |n: u32| format!("{n:0width$}");
        let mut ranges = vec![format!("{}-{}", pad(lo), pad(lo + span))];
        ranges.extend(more.iter().map(|&n| pad(n)));
        let mut list = format!("{prefix}[{}]", ranges.join(","));
        if let Some(tail) = tail {
            list = format!("{list},{tail}");
        }
        prop_assert_eq!(first_host(&list).unwrap(), Some(format!("{prefix}{}", pad(lo))));
    }
}

#[test]
fn pods_map_completed_running_pending_and_deleted_and_skip_malformed_items() {
    let export = parse_kubectl_pods("pods.json", PODS, PodId::Namespaced).unwrap();
    assert_eq!(
        export.rows,
        vec![
            // Completed: the later of its containers' ends.
            row(
                "ml/train-resnet-0",
                Some(1_795_370_400.0),
                Some(1_795_375_900.0),
                Some("gpu-03")
            ),
            // Running: one container still runs (the other's end does not count).
            row(
                "ml/train-bert-1",
                Some(1_795_370_700.0),
                None,
                Some("gpu-07")
            ),
            // Pending: PodScheduled is False.
            row("research/train-llama-2", None, None, None),
            // Deleted while running: its deletion timestamp.
            row(
                "research/serve-vllm-3",
                Some(1_795_372_805.0),
                Some(1_795_377_600.0),
                Some("gpu-01")
            ),
        ]
    );
    assert_eq!(
        export.report.skipped_at(),
        vec![(75, "status.conditions"), (86, "item")]
    );
    let first = &export.report.skipped[0].reason;
    assert!(
        first.contains("items[4] (pod broken-4)") && first.contains("yesterday"),
        "{first}"
    );
    assert!(export.report.skipped[1].reason.starts_with("items[5]:"));
    let by_name = parse_kubectl_pods("pods.json", PODS, PodId::Name).unwrap();
    assert_eq!(by_name.rows[0].job, "train-resnet-0");
}

#[test]
fn pods_that_ended_without_a_container_end_end_at_their_last_condition_change() {
    // A pod the kubelet refused at admission: bound, then Failed, no container status.
    let text = r#"{"kind":"List","items":[
        {"metadata":{"name":"refused","namespace":"a"},"spec":{"nodeName":"gpu01"},
         "status":{"phase":"Failed","reason":"OutOfcpu","conditions":[
           {"type":"PodScheduled","status":"True","lastTransitionTime":"2026-11-22T10:00:00Z"}]}},
        {"metadata":{"name":"done","namespace":"a"},"spec":{"nodeName":"gpu01"},
         "status":{"phase":"Succeeded","containerStatuses":[],"conditions":[
           {"type":"PodScheduled","status":"True","lastTransitionTime":"2026-11-22T10:00:00Z"},
           {"type":"Ready","status":"False","lastTransitionTime":"2026-11-22T11:00:00Z"}]}},
        {"metadata":{"name":"unknown","namespace":"a"},"status":{"phase":"Failed"}},
        {"metadata":{"name":"running","namespace":"a"},"spec":{"nodeName":"gpu01"},
         "status":{"phase":"Running","conditions":[
           {"type":"PodScheduled","status":"True","lastTransitionTime":"2026-11-22T10:00:00Z"}]}}]}"#;
    let export = parse_kubectl_pods("p.json", text, PodId::Name).unwrap();
    let t0 = 1_795_341_600.0; // 2026-11-22T10:00:00Z
    assert_eq!(
        export.rows,
        vec![
            row("refused", Some(t0), Some(t0), Some("gpu01")),
            row("done", Some(t0), Some(t0 + 3_600.0), Some("gpu01")),
            row("running", Some(t0), None, Some("gpu01")),
        ]
    );
    assert_eq!(export.report.skipped_at(), vec![(9, "status.phase")]);
    assert!(
        export.report.skipped[0]
            .reason
            .contains("Failed, with no time it ended"),
        "{}",
        export.report.skipped[0].reason
    );
}

#[test]
fn pods_with_one_name_in_two_namespaces_repeat_under_the_name_id() {
    let text = r#"{"kind":"List","items":[
        {"metadata":{"name":"p","namespace":"a"}},
        {"metadata":{"name":"p","namespace":"b"}}]}"#;
    let namespaced = parse_kubectl_pods("p.json", text, PodId::Namespaced).unwrap();
    assert_eq!(namespaced.rows.len(), 2);
    let named = parse_kubectl_pods("p.json", text, PodId::Name).unwrap();
    assert_eq!(named.rows.len(), 1);
    assert_eq!(named.report.skipped_at(), vec![(3, "metadata.name")]);
}

#[test]
fn pod_files_that_are_not_a_list_are_errors() {
    let err = parse_kubectl_pods("p.json", "{\"items\": [", PodId::Name).unwrap_err();
    assert!(err.to_string().contains("p.json"), "{err}");
    let err = parse_kubectl_pods("p.json", "{\"kind\": \"Deployment\"}", PodId::Name).unwrap_err();
    assert!(err.to_string().contains("items"), "{err}");
    let err = parse_kubectl_pods("p.json", "{\"items\": [1, 2]}", PodId::Name).unwrap_err();
    assert!(err.to_string().contains("no valid rows"), "{err}");
}

#[test]
fn a_pods_file_with_two_items_keys_is_refused_rather_than_losing_the_first_list() {
    let pod = |n: &str| {
        format!(
            r#"{{"kind":"Pod","metadata":{{"name":"{n}","namespace":"d"}},"spec":{{"nodeName":"n1"}}}}"#
        )
    };
    let text = format!(
        "{{\"kind\": \"List\",\n \"items\": [{}],\n \"items\": [{}]}}",
        pod("a"),
        pod("b")
    );
    // A JSON reader alone would keep only pod `b`.
    let err = parse_kubectl_pods("p.json", &text, PodId::Name).unwrap_err();
    let msg = err.to_string();
    assert!(
        msg.starts_with("p.json, line 3, field `items`: a second top-level `items` key"),
        "{msg}"
    );
    // One list of both pods reads both.
    let merged = format!(
        "{{\"kind\": \"List\", \"items\": [{}, {}]}}",
        pod("a"),
        pod("b")
    );
    assert_eq!(
        parse_kubectl_pods("p.json", &merged, PodId::Name)
            .unwrap()
            .rows
            .len(),
        2
    );
}

#[test]
fn rfc3339_times_take_fractions_and_offsets() {
    assert_eq!(rfc3339_seconds("2026-11-22T18:40:05Z"), Ok(1_795_372_805.0));
    assert_eq!(
        rfc3339_seconds("2026-11-22T19:40:05.25+01:00"),
        Ok(1_795_372_805.25)
    );
    let micro = rfc3339_seconds("2026-11-22T13:10:05.000001-05:30").unwrap();
    assert!((micro - 1_795_372_805.000_001).abs() < 5e-7, "{micro}");
    assert!(rfc3339_seconds("2026-11-22 18:40").is_err());
    assert!(rfc3339_seconds("1969-12-31T23:59:59Z").is_err());
}

#[test]
fn exported_csv_parses_back_into_the_same_outcomes() {
    for export in [
        parse_sacct("sacct.txt", SACCT_ISO, plus_one_hour()).unwrap(),
        parse_kubectl_pods("pods.json", PODS, PodId::Namespaced).unwrap(),
    ] {
        let csv = write_incumbent_outcomes(&export.rows);
        assert!(
            csv.starts_with("job,scheduled_time,deletion_time,node\n"),
            "{csv}"
        );
        let (back, report) = parse_incumbent_outcomes("out.csv", &csv).unwrap();
        assert_eq!(report.rows_skipped, 0);
        assert_eq!(back, export.rows);
    }
    let csv = write_incumbent_outcomes(&[row("4211", Some(1_795_162_445.0), None, Some("gpu01"))]);
    assert_eq!(
        csv,
        "job,scheduled_time,deletion_time,node\n4211,1795162445,,gpu01\n"
    );
}
