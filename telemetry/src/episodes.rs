//! Logging a failure once per episode, not once per tick.
//!
//! A sampler ticks every second or so. A GPU that fell off the bus, or a source that
//! keeps failing, would otherwise put a warning in the log at every tick (86,400 lines
//! a day per GPU), burying everything else exactly when something is wrong. An
//! [`Episode`] says when a failure begins (warn then, with the error) and when it ends
//! (say how many ticks it lasted); the ticks between are counted, not logged.

/// One condition's failures, in episodes.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Episode {
    /// Failures in the current episode; 0 while all is well.
    failures: u64,
}

impl Episode {
    /// A failure: `true` if it begins an episode (log it), `false` inside one.
    pub fn failed(&mut self) -> bool {
        self.failures += 1;
        self.failures == 1
    }

    /// A success: the number of failures of the episode it ends (log the recovery), or
    /// `None` when there was none.
    pub fn succeeded(&mut self) -> Option<u64> {
        let ended = (self.failures > 0).then_some(self.failures);
        self.failures = 0;
        ended
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_failure_is_told_when_it_begins_and_when_it_ends_not_at_every_tick() {
        let mut e = Episode::default();
        assert_eq!(e.succeeded(), None);
        let told: Vec<bool> = (0..5).map(|_| e.failed()).collect();
        assert_eq!(told, [true, false, false, false, false]);
        assert_eq!(e.succeeded(), Some(5));
        assert_eq!(e.succeeded(), None);
        // A new episode is told again.
        assert!(e.failed());
    }
}
