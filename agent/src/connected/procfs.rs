//! Which process a pid names, read from `/proc` (Linux only).
//!
//! A pid alone names a process only while it lives: once a worker exits and is reaped,
//! the kernel may give its pid to any new process. The pair (pid, start time) does not
//! repeat within one boot (`/proc/<pid>/stat` field 22, clock ticks since boot), and the
//! boot id (`/proc/sys/kernel/random/boot_id`) tells one boot from the next, so a
//! restarted agent never adopts — or kills — a stranger that inherited a worker's pid.

use std::io;

/// A process as recorded when the agent started it.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub struct ProcessIdentity {
    pub pid: u32,
    /// `/proc/<pid>/stat` field 22: clock ticks after boot when the process started.
    pub start_ticks: u64,
}

/// The fields of `/proc/<pid>/stat` the agent uses.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub struct ProcStat {
    /// Field 3: `R`, `S`, `D`, `Z` (exited, not yet reaped), `X` (dead), …
    pub state: char,
    /// Field 5: its process group.
    pub pgrp: u32,
    /// Field 22.
    pub start_ticks: u64,
}

#[derive(Debug, thiserror::Error)]
pub enum ProcError {
    #[error("reading {path}: {source}")]
    Io { path: String, source: io::Error },
    #[error("{path}: unexpected contents")]
    Malformed { path: String },
    #[cfg(not(target_os = "linux"))]
    #[error("supervising `--exec` workers across agent restarts reads /proc, which only Linux has")]
    Unsupported,
}

/// Parses the text of `/proc/<pid>/stat`. The command name (field 2) sits in
/// parentheses and may itself hold spaces and parentheses, so the fields are counted
/// from the *last* `)`.
pub fn parse_stat(text: &str) -> Option<ProcStat> {
    let after_name = &text[text.rfind(')')? + 1..];
    let fields: Vec<&str> = after_name.split_whitespace().collect();
    // fields[0] is field 3 (state), so field N is fields[N - 3].
    let state = fields.first()?.chars().next()?;
    let pgrp = fields.get(5 - 3)?.parse().ok()?;
    let start_ticks = fields.get(22 - 3)?.parse().ok()?;
    Some(ProcStat {
        state,
        pgrp,
        start_ticks,
    })
}

/// The process's stat, or `None` when no process has that pid.
#[cfg(target_os = "linux")]
pub fn stat(pid: u32) -> Result<Option<ProcStat>, ProcError> {
    let path = format!("/proc/{pid}/stat");
    match std::fs::read_to_string(&path) {
        Ok(text) => parse_stat(&text)
            .map(Some)
            .ok_or(ProcError::Malformed { path }),
        // ESRCH: the process went away between open and read.
        Err(e) if e.kind() == io::ErrorKind::NotFound || e.raw_os_error() == Some(3) => Ok(None),
        Err(source) => Err(ProcError::Io { path, source }),
    }
}

#[cfg(not(target_os = "linux"))]
pub fn stat(_pid: u32) -> Result<Option<ProcStat>, ProcError> {
    Err(ProcError::Unsupported)
}

/// This boot's id: a worker recorded under another boot died with that boot.
#[cfg(target_os = "linux")]
pub fn boot_id() -> Result<String, ProcError> {
    let path = "/proc/sys/kernel/random/boot_id";
    std::fs::read_to_string(path)
        .map(|s| s.trim().to_string())
        .map_err(|source| ProcError::Io {
            path: path.into(),
            source,
        })
}

#[cfg(not(target_os = "linux"))]
pub fn boot_id() -> Result<String, ProcError> {
    Err(ProcError::Unsupported)
}

/// The identity of a live process (read right after starting it).
pub fn identify(pid: u32) -> Result<ProcessIdentity, ProcError> {
    match stat(pid)? {
        Some(s) => Ok(ProcessIdentity {
            pid,
            start_ticks: s.start_ticks,
        }),
        None => Err(ProcError::Io {
            path: format!("/proc/{pid}/stat"),
            source: io::Error::from(io::ErrorKind::NotFound),
        }),
    }
}

/// Whether the recorded process still runs: same pid, same start time, and not a
/// zombie (a worker that exited but whose parent has not reaped it is gone for our
/// purposes: its exit file, if any, is written).
pub fn is_running(id: ProcessIdentity) -> Result<bool, ProcError> {
    Ok(stat(id.pid)?
        .is_some_and(|s| s.start_ticks == id.start_ticks && !matches!(s.state, 'Z' | 'X')))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stat_fields_are_counted_from_the_last_parenthesis() {
        let text = "4242 (we ird) (name)) S 1 4242 4242 0 -1 4194560 120 0 0 0 1 2 0 0 20 0 1 0 987654 2437120 250 18446744073709551615 1 1 0 0 0 0 0 0 65536 0 0 0 17 3 0 0 0 0 0\n";
        let s = parse_stat(text).unwrap();
        assert_eq!(s.state, 'S');
        assert_eq!(s.pgrp, 4242);
        assert_eq!(s.start_ticks, 987_654);
        assert_eq!(parse_stat("12 (sh) R 1 2"), None);
        assert_eq!(parse_stat("garbage"), None);
    }

    #[cfg(target_os = "linux")]
    #[test]
    fn this_process_is_running_and_a_wrong_start_time_is_someone_else() {
        let me = identify(std::process::id()).unwrap();
        assert!(is_running(me).unwrap());
        let stranger = ProcessIdentity {
            start_ticks: me.start_ticks + 1,
            ..me
        };
        assert!(!is_running(stranger).unwrap());
        assert!(!boot_id().unwrap().is_empty());
    }
}
