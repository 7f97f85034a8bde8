//! Names, paths and bad input through the public entry points.

use std::path::PathBuf;

use marshal_datasets::{DatasetError, load_cluster, load_trace};
use marshal_scheduler::domain::{GpuCatalog, GpuDemand};

/// A file in the system temp directory, unique to this process and name, removed on drop.
struct TempFile(PathBuf);

impl TempFile {
    fn arg(&self) -> &str {
        self.0.to_str().unwrap()
    }
}

impl Drop for TempFile {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.0);
        if let Some(dir) = self.0.parent() {
            let _ = std::fs::remove_dir(dir); // only once empty
        }
    }
}

fn temp_file(name: &str, contents: &str) -> TempFile {
    // One directory per file: tests run in parallel, and a shared directory could be
    // removed by one test's drop between another's create and write.
    static NEXT: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
    let n = NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let dir = std::env::temp_dir().join(format!("marshal-datasets-{}-{n}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join(name);
    std::fs::write(&path, contents).unwrap();
    TempFile(path)
}

#[test]
fn unknown_trace_lists_the_known_names() {
    let catalog = GpuCatalog::default();
    for name in ["nope", "philly-week16", "philly-weekx", "openb-"] {
        let err = load_trace(name, &catalog).unwrap_err();
        let DatasetError::UnknownTrace { name: got, known } = &err else {
            panic!("{name}: {err}");
        };
        assert_eq!(got, name);
        assert!(known.iter().any(|k| k == "openb-default"));
        assert!(known.iter().any(|k| k == "philly-week15"));
        assert!(known.iter().any(|k| k == "pollux-realistic-8"));
        assert!(
            known.iter().any(|k| k == "sia-rate50-10"),
            "unbundled names too"
        );
        let text = err.to_string();
        assert!(
            text.contains("openb-multigpu20") && text.contains("openb-<variant>"),
            "{text}"
        );
    }
}

#[test]
fn unknown_cluster_lists_the_presets() {
    let err = load_cluster("dgx-h100-65").unwrap_err();
    assert!(matches!(&err, DatasetError::UnknownCluster { known, .. } if known.len() == 11));
    let text = err.to_string();
    for preset in [
        "openb",
        "openb-all",
        "dgx-h100-64",
        "philly",
        "pollux-64",
        "elasticflow-128",
        "dlrm-peak",
        "nd40rs-v100-64",
        "dgx-a100-64",
        "rtx2080ti-64",
        "quadro-rtx6000-32",
    ] {
        assert!(text.contains(preset), "{text}");
    }
}

#[test]
fn missing_files_are_io_errors_naming_the_path() {
    let catalog = GpuCatalog::default();
    let err = load_trace("/nonexistent/pods.csv", &catalog).unwrap_err();
    assert!(matches!(&err, DatasetError::Io { path, .. } if path.ends_with("pods.csv")));
    assert!(err.to_string().contains("/nonexistent/pods.csv"), "{err}");
    for arg in ["/nonexistent/nodes.csv", "missing-cluster.toml"] {
        let err = load_cluster(arg).unwrap_err();
        assert!(matches!(err, DatasetError::Io { .. }), "{err}");
        assert!(err.to_string().contains(arg), "{err}");
    }
}

#[test]
fn trace_files_are_recognised_by_header() {
    let catalog = GpuCatalog::default();
    let short = temp_file(
        "short.csv",
        "name,cpu_milli,memory_mib,num_gpu,gpu_milli\np0,1000,1024,1,500\np1,1000,1024,nan,0\n",
    );
    let (jobs, report) = load_trace(short.arg(), &catalog).unwrap();
    assert_eq!(jobs.len(), 1);
    assert_eq!(jobs[0].gpu, GpuDemand::Milli(500));
    assert_eq!(
        (report.skipped[0].line, report.skipped[0].field.as_str()),
        (3, "num_gpu")
    );

    let philly = temp_file(
        "philly.csv",
        "timestamp,duration,num_gpus,gpu_time,cluster\n2017-10-01 00:00:00,NaN,1,1,a\n2017-10-01 00:00:10,5,4,20,a\n\n",
    );
    let (jobs, report) = load_trace(philly.arg(), &catalog).unwrap();
    assert_eq!(
        (jobs.len(), report.rows_read, report.rows_skipped),
        (1, 2, 1)
    );
    assert_eq!(
        (report.skipped[0].line, report.skipped[0].field.as_str()),
        (2, "duration")
    );

    let nodes = temp_file(
        "nodes-as-trace.csv",
        "sn,cpu_milli,memory_mib,gpu,model\nn,1,1,1,T4\n",
    );
    let err = load_trace(nodes.arg(), &catalog).unwrap_err();
    assert!(err.to_string().contains("node list"), "{err}");

    let odd = temp_file("odd.csv", "a,b,c\n1,2,3\n");
    let err = load_trace(odd.arg(), &catalog).unwrap_err();
    assert!(
        matches!(&err, DatasetError::Malformed { file, line: 1, .. } if file.ends_with("odd.csv")),
        "{err}"
    );

    let empty = temp_file("empty.csv", "");
    let err = load_trace(empty.arg(), &catalog).unwrap_err();
    assert!(err.to_string().contains("empty.csv") && err.to_string().contains("empty file"));
}

#[test]
fn new_trace_formats_are_recognised_by_header() {
    let catalog = GpuCatalog::default();
    let cases = [
        (
            "itp.csv",
            "job_id,submission_time,duration,num_gpu\na,10,5,2\nb,x,5,1\n",
            "submission_time",
        ),
        (
            "pollux.csv",
            "name,time,application,num_replicas,batch_size\ncifar10-0,1,cifar10,4,128\nncf-1,1,ncf,0,1\n",
            "num_replicas",
        ),
        (
            "chronus.csv",
            "job_id,user,num_gpu,submit_time,iterations,model_name,duration,interval,expect_time_list,expect_value_list,best_effort,job_type\n0,vc_a,1,5,1,vgg16,3,1,4,10,0,strict\n1,vc_a,1,5,1,vgg16,3,1,4,10,0,later\n",
            "job_type",
        ),
        (
            "dlrm.csv",
            "instance_sn,role,app_name,cpu_request,cpu_limit,gpu_request,gpu_limit,rdma_request,rdma_limit,memory_request,memory_limit,disk_request,disk_limit,max_instance_per_node,creation_time,scheduled_time,deletion_time\ni0,HN,app_0,12,12,1,1,25,25,120.0,120.0,640.0,800.0,8,,,\ni1,HN,app_0,12,12,1,1,25,25,120.0,120.0,640.0,800.0,8,9,8,\n",
            "scheduled_time",
        ),
    ];
    for (file, text, bad_field) in cases {
        let tmp = temp_file(file, text);
        let (jobs, report) = load_trace(tmp.arg(), &catalog).unwrap();
        assert_eq!(jobs.len(), 1, "{file}");
        assert_eq!(
            (report.skipped[0].line, report.skipped[0].field.as_str()),
            (3, bad_field),
            "{file}"
        );
        assert!(report.source.ends_with(file));
    }
}

#[test]
fn cluster_files_load_from_toml_and_node_lists() {
    let toml = temp_file(
        "two.toml",
        "name = \"two\"\n[[nodes]]\ncount = 2\ngpu_model = \"A100-80\"\ngpus = 8\nnvlink_domain = 8\ncpu_milli = 1000\nmemory_mib = 1024\n",
    );
    let spec = load_cluster(toml.arg()).unwrap();
    assert_eq!((spec.name.as_str(), spec.gpu_count()), ("two", 16));

    let bad = temp_file("bad.toml", "name = \"bad\"\n[[nodes]]\ngpus = 8\n");
    let err = load_cluster(bad.arg()).unwrap_err();
    assert!(
        matches!(&err, DatasetError::InvalidCluster { file, .. } if file.ends_with("bad.toml")),
        "{err}"
    );

    let csv = temp_file(
        "mini.csv",
        "sn,cpu_milli,memory_mib,gpu,model\na,1000,1024,4,T4\nb,1000,1024,4,T4\n",
    );
    let spec = load_cluster(csv.arg()).unwrap();
    assert_eq!(
        (spec.name.as_str(), spec.node_count(), spec.gpu_count()),
        ("mini", 2, 8)
    );

    let unknown_model = temp_file(
        "z.csv",
        "sn,cpu_milli,memory_mib,gpu,model\na,1000,1024,4,Z9\n",
    );
    let err = load_cluster(unknown_model.arg()).unwrap_err();
    assert!(
        err.to_string().contains("Z9") && err.to_string().contains("z.csv"),
        "{err}"
    );

    // One good node and one bad is an error too: a cluster may not lose a node.
    let partly_bad = temp_file(
        "half.csv",
        "sn,cpu_milli,memory_mib,gpu,model
a,1000,1024,4,T4
b,1000,x,4,T4
",
    );
    let err = load_cluster(partly_bad.arg()).unwrap_err().to_string();
    assert!(
        err.contains("half.csv") && err.contains("1 of 2 node rows") && err.contains("line 3"),
        "{err}"
    );
}

/// Unbundled openb variants come from ../shared/traces when it is there.
#[test]
fn openb_variants_are_read_from_the_traces_directory() {
    let catalog = GpuCatalog::default();
    match load_trace("openb-gpushare40", &catalog) {
        Ok((jobs, report)) => {
            assert_eq!(jobs.len(), 8_152);
            assert_eq!(report.rows_skipped, 0);
            assert!(report.source.ends_with("openb_pod_list_gpushare40.csv"));
        }
        Err(DatasetError::TraceNotFound { searched, .. }) => {
            eprintln!("skipped: openb variants not found in {searched:?}");
        }
        Err(e) => panic!("{e}"),
    }
    let err = load_trace("openb-nosuchvariant", &catalog).unwrap_err();
    assert!(matches!(err, DatasetError::TraceNotFound { .. }), "{err}");
}

#[test]
fn recorded_logs_are_recognised_by_header() {
    let catalog = GpuCatalog::default();
    let dlrm = temp_file(
        "recorded.csv",
        "instance_sn,role,app_name,cpu_request,cpu_limit,gpu_request,gpu_limit,rdma_request,\
         rdma_limit,memory_request,memory_limit,disk_request,disk_limit,\
         max_instance_per_node,creation_time,scheduled_time,deletion_time\n\
         i0,HN,app_0,12,12,1,1,25,25,120.0,120.0,640.0,800.0,8,100.0,130.0,400.0\n",
    );
    let (rows, report) = marshal_datasets::load_recorded_trace(dlrm.arg(), &catalog).unwrap();
    assert_eq!(report.rows_read, 1);
    assert_eq!(rows[0].0.gpu, GpuDemand::Whole(1));
    assert_eq!(
        (rows[0].1.created, rows[0].1.scheduled, rows[0].1.deleted),
        (100.0, Some(130.0), 400.0)
    );
    // A trace that records no scheduling decisions is refused, saying what is accepted.
    let err = marshal_datasets::load_recorded_trace("philly", &catalog).unwrap_err();
    let text = err.to_string();
    assert!(
        text.contains("not a recorded log") && text.contains("DLRM"),
        "{text}"
    );
}

#[test]
fn text_inputs_drop_a_utf8_mark_refuse_utf16_and_devices_and_name_bad_bytes() {
    use marshal_datasets::read_text_file;

    let bom = temp_file("bom.csv", "\u{feff}job,gpus\n");
    assert_eq!(read_text_file(&bom.0).unwrap(), "job,gpus\n");

    // PowerShell's `kubectl get pods -o json > pods.json` writes UTF-16 with a mark.
    let utf16 = temp_file("pods.json", "");
    let mut bytes = vec![0xff, 0xfe];
    bytes.extend("{}".encode_utf16().flat_map(u16::to_le_bytes));
    std::fs::write(&utf16.0, bytes).unwrap();
    let err = read_text_file(&utf16.0).unwrap_err().to_string();
    assert!(
        err.contains("pods.json, line 1") && err.contains("UTF-16"),
        "{err}"
    );

    let latin1 = temp_file("sacct.txt", "");
    std::fs::write(&latin1.0, b"JobID|Start\n12|caf\xe9\n").unwrap();
    let err = read_text_file(&latin1.0).unwrap_err().to_string();
    assert!(err.contains("line 2") && err.contains("byte 7"), "{err}");

    #[cfg(unix)]
    {
        // Read whole, /dev/zero would fill memory; it is refused before a byte is read.
        let err = read_text_file(std::path::Path::new("/dev/zero"))
            .unwrap_err()
            .to_string();
        assert!(err.contains("a device, not a file"), "{err}");
    }
}
