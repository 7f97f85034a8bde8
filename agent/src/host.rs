//! Per-node samples from the Linux host: network and InfiniBand port counters, host
//! memory, CPU utilisation.
//!
//! Sources, all plain files so no privilege or library is needed:
//! - Ethernet and IPoIB interfaces: `/proc/net/dev` (bytes received and sent);
//! - InfiniBand ports: `/sys/class/infiniband/<hca>/ports/<n>/counters/port_xmit_data`
//!   and `port_rcv_data`, which count 4-byte words (named `<hca>:<n>`);
//! - memory: `/proc/meminfo` (`MemTotal`, used = total − `MemAvailable`);
//! - CPU: `/proc/stat`'s `cpu` line, utilisation over the interval since the previous
//!   sample (none on the first).
//!
//! A file that is missing or unreadable leaves its fields null; it is not an error, as
//! containers and non-Linux hosts lack some of them.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use marshal_telemetry::{NetPort, NodeSample};

/// Reads the host's counters; `root` is `/` except in tests.
#[derive(Debug)]
pub struct HostSampler {
    root: PathBuf,
    cluster: Arc<str>,
    node: Arc<str>,
    previous_cpu: Option<(u64, u64)>,
}

impl HostSampler {
    pub fn new(cluster: &str, node: &str) -> Self {
        Self::with_root("/", cluster, node)
    }

    pub fn with_root(root: impl Into<PathBuf>, cluster: &str, node: &str) -> Self {
        HostSampler {
            root: root.into(),
            cluster: Arc::from(cluster),
            node: Arc::from(node),
            previous_cpu: None,
        }
    }

    fn read(&self, rel: &str) -> Option<String> {
        std::fs::read_to_string(self.root.join(rel)).ok()
    }

    pub fn sample(&mut self, timestamp_us: i64) -> NodeSample {
        let mut ports = self
            .read("proc/net/dev")
            .map(|t| parse_net_dev(&t))
            .unwrap_or_default();
        ports.extend(infiniband_ports(&self.root.join("sys/class/infiniband")));
        let (total, available) = self
            .read("proc/meminfo")
            .map_or((None, None), |t| parse_meminfo(&t));
        let cpu = self.read("proc/stat").and_then(|t| parse_cpu(&t));
        let cpu_util_pct = match (cpu, self.previous_cpu) {
            (Some((busy, all)), Some((busy0, all0))) if all > all0 => {
                Some(((busy.saturating_sub(busy0)) as f64 / (all - all0) as f64 * 100.0) as f32)
            }
            _ => None,
        };
        if cpu.is_some() {
            self.previous_cpu = cpu;
        }
        NodeSample {
            timestamp_us,
            cluster: self.cluster.clone(),
            node: self.node.clone(),
            net_ports: (!ports.is_empty()).then_some(ports),
            host_mem_used_bytes: total.zip(available).map(|(t, a)| t.saturating_sub(a)),
            host_mem_total_bytes: total,
            cpu_util_pct,
        }
    }
}

/// Interfaces of `/proc/net/dev` except loopback: (name, rx bytes, tx bytes).
fn parse_net_dev(text: &str) -> Vec<NetPort> {
    text.lines()
        .skip(2)
        .filter_map(|line| {
            let (name, rest) = line.split_once(':')?;
            let name = name.trim();
            let fields: Vec<u64> = rest
                .split_whitespace()
                .filter_map(|f| f.parse().ok())
                .collect();
            (name != "lo" && fields.len() >= 9).then(|| NetPort {
                port: Arc::from(name),
                rx_bytes: fields[0],
                tx_bytes: fields[8],
            })
        })
        .collect()
}

/// Every InfiniBand port's data counters (words of 4 bytes) as bytes.
fn infiniband_ports(dir: &Path) -> Vec<NetPort> {
    let mut out = Vec::new();
    let Ok(hcas) = std::fs::read_dir(dir) else {
        return out;
    };
    let mut hcas: Vec<_> = hcas.flatten().map(|e| e.path()).collect();
    hcas.sort();
    for hca in hcas {
        let Ok(ports) = std::fs::read_dir(hca.join("ports")) else {
            continue;
        };
        let mut ports: Vec<_> = ports.flatten().map(|e| e.path()).collect();
        ports.sort();
        for port in ports {
            let counter = |name: &str| -> Option<u64> {
                std::fs::read_to_string(port.join("counters").join(name))
                    .ok()?
                    .trim()
                    .parse::<u64>()
                    .ok()
                    .map(|words| words.saturating_mul(4))
            };
            if let (Some(tx), Some(rx)) = (counter("port_xmit_data"), counter("port_rcv_data")) {
                let name = format!(
                    "{}:{}",
                    hca.file_name().unwrap_or_default().to_string_lossy(),
                    port.file_name().unwrap_or_default().to_string_lossy()
                );
                out.push(NetPort {
                    port: Arc::from(name.as_str()),
                    tx_bytes: tx,
                    rx_bytes: rx,
                });
            }
        }
    }
    out
}

/// (`MemTotal`, `MemAvailable`) in bytes.
fn parse_meminfo(text: &str) -> (Option<u64>, Option<u64>) {
    let field = |key: &str| {
        text.lines()
            .find(|l| l.starts_with(key))
            .and_then(|l| l.split_whitespace().nth(1)?.parse::<u64>().ok())
            .map(|kib| kib * 1024)
    };
    (field("MemTotal:"), field("MemAvailable:"))
}

/// (busy, total) jiffies of the aggregate `cpu` line.
fn parse_cpu(text: &str) -> Option<(u64, u64)> {
    let line = text.lines().find(|l| l.starts_with("cpu "))?;
    let v: Vec<u64> = line
        .split_whitespace()
        .skip(1)
        .filter_map(|f| f.parse().ok())
        .collect();
    if v.len() < 4 {
        return None;
    }
    // user nice system idle iowait irq softirq steal (guest time is inside user).
    let total: u64 = v.iter().take(8).sum();
    let idle = v[3] + v.get(4).copied().unwrap_or(0);
    Some((total - idle, total))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn write(root: &Path, rel: &str, text: &str) {
        let p = root.join(rel);
        std::fs::create_dir_all(p.parent().unwrap()).unwrap();
        std::fs::write(p, text).unwrap();
    }

    #[test]
    fn host_counters_are_read_from_proc_and_sys() {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path();
        write(
            root,
            "proc/net/dev",
            "Inter-|   Receive |  Transmit\n face |bytes packets|bytes\n    lo: 10 1 0 0 0 0 0 0 10 1 0 0 0 0 0 0\n  eth0: 1000 5 0 0 0 0 0 0 2000 7 0 0 0 0 0 0\n",
        );
        write(
            root,
            "sys/class/infiniband/mlx5_0/ports/1/counters/port_xmit_data",
            "250\n",
        );
        write(
            root,
            "sys/class/infiniband/mlx5_0/ports/1/counters/port_rcv_data",
            "100\n",
        );
        write(
            root,
            "proc/meminfo",
            "MemTotal:       1000 kB\nMemFree:         100 kB\nMemAvailable:    400 kB\n",
        );
        write(
            root,
            "proc/stat",
            "cpu  100 0 100 800 0 0 0 0 0 0\ncpu0 1 2 3 4\n",
        );
        let mut host = HostSampler::with_root(root, "c", "n1");
        let first = host.sample(1);
        let ports = first.net_ports.unwrap();
        assert_eq!(ports.len(), 2, "loopback left out");
        assert_eq!(
            (ports[0].port.as_ref(), ports[0].rx_bytes, ports[0].tx_bytes),
            ("eth0", 1000, 2000)
        );
        assert_eq!(
            (ports[1].port.as_ref(), ports[1].tx_bytes, ports[1].rx_bytes),
            ("mlx5_0:1", 1000, 400)
        );
        assert_eq!(first.host_mem_total_bytes, Some(1000 * 1024));
        assert_eq!(first.host_mem_used_bytes, Some(600 * 1024));
        assert_eq!(first.cpu_util_pct, None, "no interval yet");
        write(root, "proc/stat", "cpu  150 0 150 900 0 0 0 0 0 0\n");
        assert_eq!(host.sample(2).cpu_util_pct, Some(50.0));
    }

    #[test]
    fn missing_files_leave_fields_null() {
        let dir = tempfile::tempdir().unwrap();
        let sample = HostSampler::with_root(dir.path(), "c", "n").sample(1);
        assert_eq!(
            (
                sample.net_ports,
                sample.host_mem_total_bytes,
                sample.cpu_util_pct
            ),
            (None, None, None)
        );
    }
}
