//! MIG instances: what the node agent hands to a job that asked for a MIG slice.
//!
//! The scheduler places a MIG demand as (compute slices of 7, memory slices of 8) on a
//! GPU index; it never sees the instances, which an administrator creates with
//! `nvidia-smi mig`. The agent enumerates them through NVML
//! ([`crate::NvmlSource::mig_instances`]) and gives a job the UUID of a free instance of
//! exactly the size it was placed as, so `CUDA_VISIBLE_DEVICES=MIG-…` confines its
//! processes to that slice.
//!
//! NVML names a MIG device after its profile: `NVIDIA A100-SXM4-80GB MIG 1g.10gb`, or
//! `… MIG 1c.3g.40gb` for a compute instance smaller than its GPU instance. The compute
//! slices are the `c` count when present, else the `g` count; the memory slices are the
//! profile's memory over the parent GPU's, in eighths, rounded (`10gb` of an 80 GiB A100
//! is 1 slice, `20gb` of a 40 GiB one is 4).

/// One MIG device on a GPU.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct MigInstance {
    /// Index of the parent GPU (as the scheduler numbers the node's GPUs).
    pub gpu: u32,
    /// NVML's UUID, `MIG-…`: the value for `CUDA_VISIBLE_DEVICES`.
    pub uuid: String,
    /// The profile as NVML names it, e.g. `1g.10gb`.
    pub profile: String,
    /// Compute slices of 7.
    pub compute: u8,
    /// Memory slices of 8.
    pub memory: u8,
}

/// Compute slices and memory in GB from a MIG device name; `None` if the name holds no
/// profile.
pub fn parse_profile(device_name: &str) -> Option<(String, u8, f64)> {
    let profile = device_name.rsplit_once("MIG ")?.1.trim();
    let parts: Vec<&str> = profile.split('.').collect();
    let count = |s: &str, unit: char| -> Option<u8> {
        s.strip_suffix(unit)?.parse().ok().filter(|n| *n > 0)
    };
    let (compute, mem) = match parts.as_slice() {
        [g, mem] => (count(g, 'g')?, *mem),
        [c, g, mem] => {
            let (c, g) = (count(c, 'c')?, count(g, 'g')?);
            (c.min(g), *mem)
        }
        _ => return None,
    };
    let gb: f64 = mem.strip_suffix("gb")?.parse().ok()?;
    (gb > 0.0 && compute <= 7).then(|| (profile.to_string(), compute, gb))
}

/// Memory slices (of 8) of `gb` on a GPU with `parent_bytes` of memory.
pub fn memory_slices(gb: f64, parent_bytes: u64) -> Option<u8> {
    if parent_bytes == 0 {
        return None;
    }
    let parent_gib = parent_bytes as f64 / f64::from(1u32 << 30);
    let slices = (gb / parent_gib * 8.0).round();
    (1.0..=8.0).contains(&slices).then_some(slices as u8)
}

#[cfg(test)]
mod tests {
    use super::*;

    const GIB: u64 = 1 << 30;

    #[test]
    fn profiles_of_a100_and_h100_parse_to_slices() {
        let (p, c, gb) = parse_profile("NVIDIA A100-SXM4-80GB MIG 1g.10gb").unwrap();
        assert_eq!((p.as_str(), c, gb), ("1g.10gb", 1, 10.0));
        assert_eq!(memory_slices(gb, 80 * GIB), Some(1));
        let (_, c, gb) = parse_profile("NVIDIA A100-SXM4-40GB MIG 3g.20gb").unwrap();
        assert_eq!((c, memory_slices(gb, 40 * GIB)), (3, Some(4)));
        let (_, c, gb) = parse_profile("NVIDIA H100 80GB HBM3 MIG 7g.80gb").unwrap();
        // The H100 reports a little less than 80 GiB.
        assert_eq!((c, memory_slices(gb, 81_559 * (1 << 20))), (7, Some(8)));
        let (_, c, gb) = parse_profile("NVIDIA H100 80GB HBM3 MIG 1g.20gb").unwrap();
        assert_eq!((c, memory_slices(gb, 80 * GIB)), (1, Some(2)));
        // A compute instance smaller than its GPU instance: the compute count decides.
        let (p, c, gb) = parse_profile("NVIDIA A100-SXM4-80GB MIG 1c.3g.40gb").unwrap();
        assert_eq!(
            (p.as_str(), c, memory_slices(gb, 80 * GIB)),
            ("1c.3g.40gb", 1, Some(4))
        );
    }

    #[test]
    fn names_without_a_profile_and_absurd_sizes_are_refused() {
        assert_eq!(parse_profile("NVIDIA A100-SXM4-80GB"), None);
        assert_eq!(parse_profile("NVIDIA A100 MIG 9g.10gb"), None);
        assert_eq!(parse_profile("NVIDIA A100 MIG 0g.10gb"), None);
        assert_eq!(parse_profile("NVIDIA A100 MIG 1g.tengb"), None);
        assert_eq!(parse_profile("NVIDIA A100 MIG 1g"), None);
        assert_eq!(memory_slices(10.0, 0), None);
        assert_eq!(memory_slices(200.0, 80 * GIB), None);
    }
}
