//! `marshal datasets outcomes`: the incumbent's outcomes CSV exported from `sacct` and
//! `kubectl` output, end to end through the binary.

use std::path::PathBuf;

mod common;

use common::{fails_with, marshal};

fn fixture(name: &str) -> String {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("datasets/tests/fixtures")
        .join(name)
        .display()
        .to_string()
}

#[test]
fn sacct_output_becomes_the_outcomes_csv_and_bad_rows_are_named() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("outcomes.csv");
    let input = fixture("sacct-allocations-iso.txt");
    let run = marshal(&[
        "datasets",
        "outcomes",
        "--from",
        "sacct",
        "--input",
        &input,
        "--out",
        out.to_str().unwrap(),
        "--utc-offset",
        "+01:00",
    ]);
    let stderr = String::from_utf8_lossy(&run.stderr);
    assert!(run.status.success(), "{stderr}");
    assert!(run.stdout.is_empty(), "the CSV goes to --out only");
    assert_eq!(
        std::fs::read_to_string(&out).unwrap(),
        "job,scheduled_time,deletion_time,node\n\
         4211,1795162445,1795168961,gpu01\n\
         4212,1795162800,,node5\n\
         4213,,,\n\
         4214,,,\n\
         4215_7,1795162710,1795165200,a1\n\
         4216+0,1795163400,1795169700,rack1-n08\n\
         4218,,,\n"
    );
    assert!(stderr.contains("wrote 7 rows"), "{stderr}");
    assert!(
        stderr.contains(&format!("{input}:8: skipped: field `End`")),
        "{stderr}"
    );

    // Without --out the CSV is stdout; without --utc-offset local times are UTC, and
    // stderr says so.
    let run = marshal(&["datasets", "outcomes", "--from", "sacct", "--input", &input]);
    let stdout = String::from_utf8_lossy(&run.stdout);
    assert!(
        stdout.contains("\n4211,1795166045,1795172561,gpu01\n"),
        "{stdout}"
    );
    assert!(String::from_utf8_lossy(&run.stderr).contains("read as UTC"));
}

#[test]
fn a_file_that_is_not_sacct_output_fails_with_a_clear_message() {
    let dir = tempfile::tempdir().unwrap();
    let bad = dir.path().join("bad.txt");
    std::fs::write(&bad, "JobID|Start|State\n1|Unknown|PENDING\n").unwrap();
    let bad = bad.to_str().unwrap();
    let outcomes = |from: &str, extra: &[&str], needle: &str| {
        let args = ["datasets", "outcomes", "--from", from, "--input", bad];
        fails_with(&[&args[..], extra].concat(), needle);
    };
    outcomes("sacct", &[], "field `End`: missing column");
    outcomes("pods", &[], "bad.txt, line 1, field `json`");
    outcomes("sacct", &["--utc-offset", "1h"], "--utc-offset");
    outcomes(
        "sacct",
        &["--time-zone", "Mars/Olympus_Mons"],
        "--time-zone: \"Mars/Olympus_Mons\" is not an IANA time zone name",
    );
    outcomes(
        "pods",
        &["--time-zone", "Europe/Berlin"],
        "apply to --from sacct only",
    );
}

#[test]
fn a_time_zone_converts_local_times_across_a_daylight_saving_change() {
    let dir = tempfile::tempdir().unwrap();
    let input = dir.path().join("dst.txt");
    std::fs::write(
        &input,
        "JobID|Start|End\n1|2026-03-29T01:30:00|2026-03-29T03:30:00\n\
         2|2026-10-25T02:30:00|2026-10-25T04:00:00\n",
    )
    .unwrap();
    let input = input.to_str().unwrap();
    let args = ["datasets", "outcomes", "--from", "sacct", "--input", input];
    let run = marshal(&[&args[..], &["--time-zone", "Europe/Berlin"]].concat());
    assert!(run.status.success());
    let stdout = String::from_utf8_lossy(&run.stdout);
    // 01:30 CET and 03:30 CEST are 00:30 and 01:30 UTC; the doubled 02:30 is CEST's.
    assert!(stdout.contains("\n1,1774744200,1774747800,\n"), "{stdout}");
    assert!(stdout.contains("\n2,1792888200,1792897200,\n"), "{stdout}");
    let stderr = String::from_utf8_lossy(&run.stderr);
    assert!(
        stderr.contains("1 local times fell in an hour the clocks went through twice"),
        "{stderr}"
    );
    assert!(!stderr.contains("read as UTC"), "{stderr}");
    // Both a zone and an offset is one too many.
    let both = marshal(&[&args[..], &["--time-zone", "UTC", "--utc-offset", "+01:00"]].concat());
    assert!(!both.status.success());
}
