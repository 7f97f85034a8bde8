//! The sink's bound on queued messages, with hysteresis: a producer that finds the queue
//! full sleeps until the writer has drained it to half, not until one slot is free.
//!
//! A bounded channel (`std::sync::mpsc::sync_channel`) wakes a blocked producer for
//! every message the consumer takes. When the producer is faster than the writer, as a
//! collector replaying a backlog is, the queue stays full and the writer pays a futex
//! wake-up per message: 7 % of the writer thread's time on the per-link sink benchmark.
//! Here the writer wakes producers once per `capacity / 2` messages, and a producer that
//! finds room never touches the lock: a counter, reserved by compare-and-swap, keeps the
//! queue at most `capacity` long, and the messages themselves travel on an unbounded
//! channel.
//!
//! No wake-up is lost: a producer stores `waiting` before its last look at the counter
//! and sleeps holding the lock it stored under; the writer takes a message off the
//! counter before it reads `waiting`, and takes the lock before it notifies (all
//! sequentially consistent). When the writer stops, for any reason, [`WriterSide`]'s drop
//! closes the gate and wakes every producer.

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering::SeqCst};
use std::sync::{Arc, Condvar, Mutex, MutexGuard, PoisonError};

/// The shared gate between producers and the writer thread.
#[derive(Debug)]
pub(crate) struct Backpressure {
    queued: AtomicUsize,
    capacity: usize,
    /// Producers blocked on a full queue are woken when it drains to this many.
    resume_at: usize,
    waiting: AtomicBool,
    closed: AtomicBool,
    lock: Mutex<()>,
    room: Condvar,
}

/// Whether [`Backpressure::reserve`] got a slot.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Reserved {
    Yes,
    /// The queue is full (only from [`Backpressure::try_reserve`] and
    /// [`Backpressure::reserve_until`]).
    Full,
    /// The writer has stopped.
    Closed,
}

impl Backpressure {
    /// A gate for at most `capacity` (≥ 1) queued messages.
    pub(crate) fn new(capacity: usize) -> Arc<Self> {
        let capacity = capacity.max(1);
        Arc::new(Self {
            queued: AtomicUsize::new(0),
            capacity,
            resume_at: capacity / 2,
            waiting: AtomicBool::new(false),
            closed: AtomicBool::new(false),
            lock: Mutex::new(()),
            room: Condvar::new(),
        })
    }

    /// Takes a slot if one is free.
    pub(crate) fn try_reserve(&self) -> Reserved {
        if self.closed.load(SeqCst) {
            return Reserved::Closed;
        }
        match self
            .queued
            .fetch_update(SeqCst, SeqCst, |q| (q < self.capacity).then_some(q + 1))
        {
            Ok(_) => Reserved::Yes,
            Err(_) => Reserved::Full,
        }
    }

    /// Takes a slot, sleeping while the queue is full.
    pub(crate) fn reserve(&self) -> Reserved {
        self.reserve_waiting(None)
    }

    /// Takes a slot, sleeping while the queue is full until `deadline` at most
    /// ([`Reserved::Full`] then).
    pub(crate) fn reserve_until(&self, deadline: std::time::Instant) -> Reserved {
        self.reserve_waiting(Some(deadline))
    }

    fn reserve_waiting(&self, deadline: Option<std::time::Instant>) -> Reserved {
        match self.try_reserve() {
            Reserved::Full => {}
            done => return done,
        }
        let mut guard = self.locked();
        loop {
            self.waiting.store(true, SeqCst);
            match self.try_reserve() {
                Reserved::Full => {}
                done => return done,
            }
            guard = match deadline {
                None => self
                    .room
                    .wait(guard)
                    .unwrap_or_else(PoisonError::into_inner),
                Some(deadline) => {
                    let now = std::time::Instant::now();
                    if now >= deadline {
                        return Reserved::Full;
                    }
                    let waited = self.room.wait_timeout(guard, deadline - now);
                    waited.unwrap_or_else(PoisonError::into_inner).0
                }
            };
        }
    }

    /// Gives back a slot that was reserved but not used (the message was not sent).
    pub(crate) fn release(&self) {
        self.taken();
    }

    /// The writer took a message off the queue.
    pub(crate) fn taken(&self) {
        let left = self.queued.fetch_sub(1, SeqCst) - 1;
        if left <= self.resume_at && self.waiting.swap(false, SeqCst) {
            self.wake_all();
        }
    }

    fn close(&self) {
        self.closed.store(true, SeqCst);
        self.wake_all();
    }

    fn wake_all(&self) {
        drop(self.locked());
        self.room.notify_all();
    }

    fn locked(&self) -> MutexGuard<'_, ()> {
        self.lock.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

/// The writer thread's handle on the gate: dropping it (the writer returned or
/// panicked) closes the gate, so no producer sleeps forever.
#[derive(Debug)]
pub(crate) struct WriterSide(pub(crate) Arc<Backpressure>);

impl Drop for WriterSide {
    fn drop(&mut self) {
        self.0.close();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::mpsc;
    use std::thread;
    use std::time::Duration;

    #[test]
    fn at_most_capacity_slots_are_taken() {
        let gate = Backpressure::new(3);
        for _ in 0..3 {
            assert_eq!(gate.try_reserve(), Reserved::Yes);
        }
        assert_eq!(gate.try_reserve(), Reserved::Full);
        gate.taken();
        assert_eq!(gate.try_reserve(), Reserved::Yes);
        assert_eq!(gate.try_reserve(), Reserved::Full);
        gate.release();
        assert_eq!(gate.try_reserve(), Reserved::Yes);
    }

    #[test]
    fn a_blocked_producer_resumes_only_once_the_queue_is_half_drained() {
        let gate = Backpressure::new(4);
        for _ in 0..4 {
            assert_eq!(gate.reserve(), Reserved::Yes);
        }
        let (done_tx, done_rx) = mpsc::channel();
        let producer = {
            let gate = gate.clone();
            thread::spawn(move || {
                let r = gate.reserve();
                done_tx.send(r).unwrap();
            })
        };
        // One message taken leaves 3 queued, above half: the producer keeps sleeping.
        thread::sleep(Duration::from_millis(50));
        gate.taken();
        assert!(
            done_rx.recv_timeout(Duration::from_millis(200)).is_err(),
            "woken before the queue drained to half"
        );
        gate.taken();
        assert_eq!(
            done_rx.recv_timeout(Duration::from_secs(10)),
            Ok(Reserved::Yes)
        );
        producer.join().unwrap();
        assert_eq!(gate.queued.load(SeqCst), 3);
    }

    #[test]
    fn producers_blocked_on_a_full_queue_wake_when_the_writer_stops() {
        let gate = Backpressure::new(1);
        assert_eq!(gate.reserve(), Reserved::Yes);
        let writer = WriterSide(gate.clone());
        let producers: Vec<_> = (0..3)
            .map(|_| {
                let gate = gate.clone();
                thread::spawn(move || gate.reserve())
            })
            .collect();
        thread::sleep(Duration::from_millis(50));
        drop(writer);
        for p in producers {
            assert_eq!(p.join().unwrap(), Reserved::Closed);
        }
        assert_eq!(gate.try_reserve(), Reserved::Closed);
    }

    #[test]
    fn many_producers_never_exceed_capacity_and_every_message_gets_through() {
        let gate = Backpressure::new(8);
        let (tx, rx) = mpsc::channel::<usize>();
        let producers: Vec<_> = (0..4)
            .map(|_| {
                let (gate, tx) = (gate.clone(), tx.clone());
                thread::spawn(move || {
                    for i in 0..2_000 {
                        assert_eq!(gate.reserve(), Reserved::Yes);
                        assert!(gate.queued.load(SeqCst) <= 8);
                        tx.send(i).unwrap();
                    }
                })
            })
            .collect();
        drop(tx);
        let mut received = 0;
        while rx.recv().is_ok() {
            gate.taken();
            received += 1;
        }
        for p in producers {
            p.join().unwrap();
        }
        assert_eq!(received, 8_000);
        assert_eq!(gate.queued.load(SeqCst), 0);
    }
}
