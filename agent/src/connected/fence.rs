//! Fencing: stopping this node's workers once the scheduler has given them up, so that
//! no job runs here and on the node it was requeued to at once.
//!
//! The scheduler requeues a node's jobs when the node has been unreachable for its grace
//! period. The agent cannot see that happen; what it knows is when it last sent a call
//! the scheduler answered, and what the scheduler told it:
//! - **A refused registration** of a node registered before carries how long until the
//!   jobs are requeued (`marshal-requeue-in-ms`). That is definite (the scheduler is up
//!   and has said no), so the agent always fences then.
//! - **Silence**: a successful registration carries the node timeout and grace. The
//!   scheduler heard the last answered call no earlier than it was sent, so it requeues
//!   no earlier than that send plus timeout plus grace. Fencing on silence is opt-in
//!   (`fence_when_silent`): the agent cannot tell a network partition from a scheduler
//!   that is down, and a scheduler down that long (an upgrade) requeues nothing, since
//!   a restarted scheduler gives every agent a full timeout again. Fencing on silence
//!   then stops every job of the cluster for nothing.
//!
//! Both deadlines are moved a twentieth earlier, for the two monotonic clocks' rates
//! and for the kill itself, and earlier again by the stop grace, so that a worker given
//! its grace to checkpoint has ended by the requeue; the requeued job needs a
//! scheduling cycle and a start on another node after the requeue too. For silence the
//! grace counts at most half the scheduler's limit: a grace as long as the limit would
//! fence at every registration, and every job would die at the first hiccup.

use std::time::Duration;

use tokio::sync::watch;
use tokio::time::Instant;

/// What the agent knows of the scheduler's deadline for this node's jobs.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Lease {
    /// Fence after `silence_limit` without an answered call.
    pub fence_when_silent: bool,
    /// How much earlier than the deadline the stop begins: the stop grace.
    lead: Duration,
    /// Node timeout plus grace, from the last successful registration.
    silence_limit: Option<Duration>,
    /// When the latest call the scheduler answered was sent.
    last_answered: Option<Instant>,
    /// Fence by then: a refusal said the jobs are requeued about then.
    refused_deadline: Option<Instant>,
}

impl Lease {
    pub fn new(fence_when_silent: bool, lead: Duration) -> Self {
        Lease {
            fence_when_silent,
            lead,
            ..Lease::default()
        }
    }

    /// When this node's workers must be stopped, if ever.
    pub fn fence_at(&self) -> Option<Instant> {
        match (self.silent_fence_at(), self.refused_fence_at()) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        }
    }

    fn silent_fence_at(&self) -> Option<Instant> {
        match (
            self.fence_when_silent,
            self.silence_limit,
            self.last_answered,
        ) {
            (true, Some(limit), Some(sent)) => {
                let limit = early(limit);
                Some(sent + limit - self.lead.min(limit / 2))
            }
            _ => None,
        }
    }

    fn refused_fence_at(&self) -> Option<Instant> {
        let deadline = self.refused_deadline?;
        // Earlier than any instant there is (a grace longer than the uptime): now.
        Some(
            deadline
                .checked_sub(self.lead)
                .unwrap_or_else(|| deadline.min(Instant::now())),
        )
    }

    /// The stop grace is more than half of the silence limit the scheduler said: silence
    /// fencing gives workers less than their grace (see the module's docs).
    pub fn grace_cut_for_silence(&self) -> bool {
        self.fence_when_silent
            && self
                .silence_limit
                .is_some_and(|limit| self.lead > early(limit) / 2)
    }

    /// A registration sent at `sent` succeeded, under these liveness rules (0: the
    /// scheduler did not say).
    pub fn registered(&mut self, sent: Instant, timeout: Duration, grace: Duration) {
        let limit = timeout + grace;
        self.silence_limit = (!timeout.is_zero()).then_some(limit);
        self.last_answered = Some(sent);
        self.refused_deadline = None;
    }

    /// The scheduler answered a call sent at `sent` (a telemetry batch, a heartbeat, a
    /// report, a watch opened).
    pub fn answered(&mut self, sent: Instant) {
        if self.last_answered.is_none_or(|t| t < sent) {
            self.last_answered = Some(sent);
        }
    }

    /// A registration sent at `sent` was refused, the jobs to be requeued `requeue_in`
    /// after the scheduler answered.
    pub fn refused(&mut self, sent: Instant, requeue_in: Duration) {
        let deadline = sent + early(requeue_in);
        self.refused_deadline = Some(self.refused_deadline.map_or(deadline, |d| d.min(deadline)));
    }

    /// Why [`fence_at`](Self::fence_at) has come, for the log.
    pub fn why(&self) -> &'static str {
        let refused = self.refused_fence_at();
        if refused.is_some() && self.silent_fence_at().is_none_or(|s| refused <= Some(s)) {
            "the scheduler refused this node's registration and requeues its jobs at the end of its grace"
        } else {
            "the scheduler has not answered for about its node timeout plus grace, and requeues this node's jobs then if it is up"
        }
    }

    /// The workers were stopped: nothing is owed until the next registration.
    pub fn fenced(&mut self) {
        self.last_answered = None;
        self.refused_deadline = None;
    }
}

/// `d` less a twentieth.
fn early(d: Duration) -> Duration {
    d - d / 20
}

/// The lease, shared by the session's calls and the task that waits for the deadline.
/// Changes that move the deadline later do not wake the waiter: it looks again when the
/// deadline it slept towards comes.
#[derive(Debug)]
pub struct Contact(watch::Sender<Lease>);

impl Contact {
    pub fn new(fence_when_silent: bool, lead: Duration) -> Self {
        Contact(watch::Sender::new(Lease::new(fence_when_silent, lead)))
    }

    pub fn update(&self, change: impl FnOnce(&mut Lease)) {
        self.0.send_if_modified(|lease| {
            let before = lease.fence_at();
            change(lease);
            match (lease.fence_at(), before) {
                (Some(after), Some(before)) => after < before,
                (after, _) => after.is_some() && before.is_none(),
            }
        });
    }

    pub fn lease(&self) -> Lease {
        *self.0.borrow()
    }

    /// Resolves when the workers must be stopped.
    pub async fn due(&self) {
        let mut changes = self.0.subscribe();
        loop {
            let at = changes.borrow_and_update().fence_at();
            match at {
                Some(at) if at <= Instant::now() => return,
                Some(at) => {
                    tokio::select! {
                        _ = tokio::time::sleep_until(at) => {}
                        _ = changes.changed() => {}
                    }
                }
                // The sender lives as long as `self`.
                None => {
                    let _ = changes.changed().await;
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const S: Duration = Duration::from_secs(1);

    #[test]
    fn silence_fences_only_when_asked_and_only_after_a_registration_said_the_rules() {
        let t0 = Instant::now();
        let mut quiet = Lease::new(false, Duration::ZERO);
        quiet.registered(t0, 30 * S, 60 * S);
        assert_eq!(quiet.fence_at(), None);
        let mut fencing = Lease::new(true, Duration::ZERO);
        fencing.answered(t0);
        assert_eq!(fencing.fence_at(), None, "no rules known yet");
        fencing.registered(t0, 30 * S, 60 * S);
        assert_eq!(fencing.fence_at(), Some(t0 + Duration::from_millis(85_500)));
        // An answered call moves it on; an older send (a slow call) does not move it back.
        fencing.answered(t0 + 10 * S);
        fencing.answered(t0 + 5 * S);
        assert_eq!(
            fencing.fence_at(),
            Some(t0 + 10 * S + Duration::from_millis(85_500))
        );
        // A scheduler that does not say its rules: no silence fencing.
        let mut old = Lease::new(true, Duration::ZERO);
        old.registered(t0, Duration::ZERO, Duration::ZERO);
        assert_eq!(old.fence_at(), None);
    }

    #[test]
    fn a_refusal_fences_whatever_the_setting_at_the_earlier_deadline_until_a_registration() {
        let t0 = Instant::now();
        let mut lease = Lease::new(false, Duration::ZERO);
        lease.refused(t0, 20 * S);
        assert_eq!(lease.fence_at(), Some(t0 + 19 * S));
        // A later refusal's deadline cannot postpone an earlier one.
        lease.refused(t0 + 5 * S, 20 * S);
        assert_eq!(lease.fence_at(), Some(t0 + 19 * S));
        lease.refused(t0 + 5 * S, 10 * S);
        assert_eq!(
            lease.fence_at(),
            Some(t0 + 5 * S + Duration::from_millis(9_500))
        );
        let mut silent = Lease::new(true, Duration::ZERO);
        silent.registered(t0, 30 * S, 60 * S);
        silent.refused(t0 + S, 2 * S);
        assert_eq!(
            silent.fence_at(),
            Some(t0 + S + Duration::from_millis(1_900))
        );
        // A registration that succeeds lifts the refusal.
        lease.registered(t0 + 6 * S, 30 * S, 60 * S);
        assert_eq!(lease.fence_at(), None);
        silent.fenced();
        assert_eq!(silent.fence_at(), None);
    }

    #[test]
    fn the_stop_grace_moves_both_deadlines_earlier() {
        let t0 = Instant::now() + 3600 * S;
        let mut lease = Lease::new(true, 10 * S);
        lease.registered(t0, 30 * S, 60 * S);
        assert_eq!(lease.fence_at(), Some(t0 + Duration::from_millis(75_500)));
        lease.refused(t0, 20 * S);
        assert_eq!(lease.fence_at(), Some(t0 + 9 * S));
        // A requeue sooner than the grace: at once.
        let now = Instant::now();
        let mut soon = Lease::new(false, 10 * S);
        soon.refused(now, 2 * S);
        assert!(soon.fence_at().unwrap() <= Instant::now());
    }

    #[test]
    fn silence_fencing_keeps_at_least_half_the_limit_whatever_the_grace() {
        let t0 = Instant::now();
        // A 30 s grace against a scheduler that requeues 30 s after silence (10 + 20):
        // fencing at registration would be a livelock; half the limit is kept.
        let mut lease = Lease::new(true, 30 * S);
        lease.registered(t0, 10 * S, 20 * S);
        assert_eq!(lease.fence_at(), Some(t0 + Duration::from_millis(14_250)));
        assert!(lease.grace_cut_for_silence());
        assert!(lease.why().contains("not answered"));
        let mut roomy = Lease::new(true, 30 * S);
        roomy.registered(t0, 30 * S, 60 * S);
        assert!(!roomy.grace_cut_for_silence());
        // The refusal that comes first is the reason given, grace or not.
        roomy.refused(t0, 40 * S);
        assert_eq!(roomy.fence_at(), Some(t0 + 8 * S));
        assert!(roomy.why().contains("refused"), "{}", roomy.why());
    }

    #[tokio::test(start_paused = true)]
    async fn the_waiter_wakes_for_an_earlier_deadline_and_not_before_a_later_one() {
        let contact = std::sync::Arc::new(Contact::new(true, Duration::ZERO));
        let t0 = Instant::now();
        contact.update(|l| l.registered(t0, 10 * S, 10 * S));
        let waiter = {
            let contact = contact.clone();
            tokio::spawn(async move {
                contact.due().await;
                Instant::now()
            })
        };
        tokio::time::sleep(5 * S).await;
        // Answered: the deadline moves from 19 s to 24 s.
        contact.update(|l| l.answered(t0 + 5 * S));
        tokio::time::sleep(15 * S).await;
        assert!(!waiter.is_finished(), "fenced at the old deadline");
        // A refusal brings it forward, to 20 s + 0.95 s.
        contact.update(|l| l.refused(t0 + 20 * S, S));
        let fenced_at = waiter.await.unwrap();
        assert_eq!(fenced_at - t0, 20 * S + Duration::from_millis(950));
    }
}
