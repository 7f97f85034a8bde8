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
    fails_with(
        &["datasets", "outcomes", "--from", "sacct", "--input", bad],
        "field `End`: missing column",
    );
    fails_with(
        &["datasets", "outcomes", "--from", "pods", "--input", bad],
        "bad.txt, line 1, field `json`",
    );
    fails_with(
        &[
            "datasets",
            "outcomes",
            "--from",
            "sacct",
            "--input",
            bad,
            "--utc-offset",
            "1h",
        ],
        "--utc-offset",
    );
}
