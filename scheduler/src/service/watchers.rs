//! Assignment watchers, by node. Each agent watches its own node's assignments; with one
//! broadcast channel for all of them, every assignment woke every watcher (a task per
//! agent, 1,250 on a 10,000-GPU cluster) only for all but one to drop it. Here an
//! assignment goes to the watchers of its node only, through a bounded channel per
//! watcher, whose memory follows its backlog (a broadcast ring per node would hold its
//! full capacity per node from the start).

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};

use tokio::sync::mpsc;

use crate::domain::NodeId;
use crate::service::pb;

/// Assignments one watcher may have waiting before it is cut off as lagging (its agent
/// then resynchronises from a fresh watch's snapshot).
pub const WATCH_BACKLOG: usize = 4096;

#[derive(Debug)]
struct Watcher {
    tx: mpsc::Sender<pb::Assignment>,
    lagged: Arc<AtomicBool>,
}

/// The open assignment watches by node.
#[derive(Debug, Default)]
pub struct NodeWatchers {
    by_node: Mutex<HashMap<NodeId, Vec<Watcher>>>,
}

/// One watcher's end: the assignments published for its node after it subscribed.
#[derive(Debug)]
pub struct NodeWatch {
    pub rx: mpsc::Receiver<pb::Assignment>,
    lagged: Arc<AtomicBool>,
}

impl NodeWatch {
    /// Whether the watch ended because it fell [`WATCH_BACKLOG`] assignments behind.
    pub fn lagged(&self) -> bool {
        self.lagged.load(Ordering::Acquire)
    }
}

impl NodeWatchers {
    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<NodeId, Vec<Watcher>>> {
        self.by_node.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// A new watch of `node`: it receives every assignment [`NodeWatchers::publish`]ed
    /// for `node` from now on.
    pub fn subscribe(&self, node: NodeId) -> NodeWatch {
        let (tx, rx) = mpsc::channel(WATCH_BACKLOG);
        let lagged = Arc::new(AtomicBool::new(false));
        let mut by_node = self.lock();
        let watchers = by_node.entry(node).or_default();
        // Watches closed since the node's last assignment: an idle node whose agent
        // reconnects (or a client opening and closing watches) would pile them up.
        watchers.retain(|w| !w.tx.is_closed());
        watchers.push(Watcher {
            tx,
            lagged: lagged.clone(),
        });
        NodeWatch { rx, lagged }
    }

    /// Sends `assignment` to `node`'s watchers. A watcher gone is forgotten; one whose
    /// backlog is full is marked lagging and dropped, which ends its stream.
    pub fn publish(&self, node: NodeId, assignment: &pb::Assignment) {
        let mut by_node = self.lock();
        let Some(watchers) = by_node.get_mut(&node) else {
            return;
        };
        watchers.retain(|w| match w.tx.try_send(assignment.clone()) {
            Ok(()) => true,
            Err(mpsc::error::TrySendError::Closed(_)) => false,
            Err(mpsc::error::TrySendError::Full(_)) => {
                w.lagged.store(true, Ordering::Release);
                false
            }
        });
        if watchers.is_empty() {
            by_node.remove(&node);
        }
    }

    /// Open watches of `node` (as of the last publish to it: a watch closed since is
    /// still counted).
    pub fn watching(&self, node: NodeId) -> usize {
        self.lock().get(&node).map_or(0, Vec::len)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn start(job: u64) -> pb::Assignment {
        pb::Assignment {
            job_id: job,
            action: pb::AssignmentAction::Start as i32,
            ..Default::default()
        }
    }

    #[test]
    fn an_assignment_reaches_its_nodes_watchers_only() {
        let watchers = NodeWatchers::default();
        let (a, b) = (NodeId(0), NodeId(1));
        let mut on_a = [watchers.subscribe(a), watchers.subscribe(a)];
        let mut on_b = watchers.subscribe(b);
        watchers.publish(a, &start(7));
        watchers.publish(NodeId(9), &start(8));
        for w in &mut on_a {
            assert_eq!(w.rx.try_recv().unwrap().job_id, 7);
            assert!(w.rx.try_recv().is_err());
        }
        assert!(
            on_b.rx.try_recv().is_err(),
            "node b woke for node a's assignment"
        );
        // A watcher that went away is forgotten at the next subscription to its node...
        let gone = watchers.subscribe(b);
        drop(gone);
        let _again = watchers.subscribe(b);
        assert_eq!(watchers.watching(b), 2, "the closed watch was kept");
        // ...or the next publish to it.
        let [first, mut second] = on_a;
        drop(first);
        watchers.publish(a, &start(9));
        assert_eq!(watchers.watching(a), 1);
        assert_eq!(second.rx.try_recv().unwrap().job_id, 9);
        drop(second);
        watchers.publish(a, &start(10));
        assert_eq!(watchers.watching(a), 0);
        assert_eq!(watchers.watching(b), 2);
    }

    #[test]
    fn a_watcher_that_falls_behind_is_cut_off_as_lagging() {
        let watchers = NodeWatchers::default();
        let mut slow = watchers.subscribe(NodeId(0));
        for job in 0..WATCH_BACKLOG as u64 {
            watchers.publish(NodeId(0), &start(job));
        }
        assert!(!slow.lagged());
        watchers.publish(NodeId(0), &start(u64::MAX));
        assert!(slow.lagged());
        assert_eq!(watchers.watching(NodeId(0)), 0);
        // What it had is still delivered, then the stream ends.
        let mut got = 0;
        while let Ok(a) = slow.rx.try_recv() {
            assert_eq!(a.job_id, got);
            got += 1;
        }
        assert_eq!(got, WATCH_BACKLOG as u64);
        assert!(matches!(
            slow.rx.try_recv(),
            Err(mpsc::error::TryRecvError::Disconnected)
        ));
    }
}
