//! NVML is loaded at run time; without a driver the error says so.

use marshal_telemetry::{NvmlConfig, NvmlSource, TelemetryError};

#[test]
fn missing_nvml_library_is_a_clear_error() {
    let cfg = NvmlConfig {
        lib_path: Some("/nonexistent/libnvidia-ml.so.1".into()),
        ..NvmlConfig::default()
    };
    match NvmlSource::open_with(cfg) {
        Err(TelemetryError::NvmlUnavailable(reason)) => {
            assert!(
                reason.contains("/nonexistent/libnvidia-ml.so.1"),
                "{reason}"
            );
            let msg = TelemetryError::NvmlUnavailable(reason).to_string();
            assert!(msg.starts_with("NVML is unavailable"), "{msg}");
        }
        other => panic!("expected NvmlUnavailable, got {other:?}"),
    }
}

#[test]
fn default_open_fails_cleanly_or_samples_every_gpu() {
    match NvmlSource::open() {
        Err(TelemetryError::NvmlUnavailable(reason)) => {
            assert!(reason.contains("NVML"), "{reason}");
        }
        Err(other) => panic!("expected NvmlUnavailable, got {other:?}"),
        Ok(mut src) => {
            // A machine with a driver: every GPU yields one well-formed row.
            let rows = src.sample_at(1_741_910_400_000_000);
            assert_eq!(rows.len(), src.device_count());
            for r in &rows {
                assert!(!r.gpu_uuid.is_empty());
                assert!(r.sm_util_pct.is_none_or(|u| (0.0..=100.0).contains(&u)));
            }
            let topo = src.discover_topology().unwrap();
            assert_eq!(topo.gpus.len(), rows.len());
            let n = rows.len();
            assert_eq!(topo.pairs.len(), n * n.saturating_sub(1) / 2);
            // MIG off: no instances; MIG on: each one named with a parsed profile.
            let mig_on = rows.iter().any(|r| r.mig_mode == Some(true));
            let instances = src.mig_instances().unwrap();
            assert!(mig_on || instances.is_empty(), "{instances:?}");
        }
    }
}
