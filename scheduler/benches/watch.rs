//! Assignment fan-out to node agents' watches (criterion): `cargo bench -p
//! marshal-scheduler --features service --bench watch`.
//!
//! 1,250 watchers (one per node of a 10,000-GPU cluster, each a task, as each
//! `WatchAssignments` stream is) and 1,000 assignments spread over the nodes, published
//! in one burst as a commit publishes an epoch's events; timed until every assignment
//! has reached its node's watcher, on a single-threaded runtime (one core).
//! `per-node` is what the server does ([`NodeWatchers`]); `broadcast` is the one channel
//! for all watchers that it used before, each watcher dropping other nodes' assignments.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use criterion::{Criterion, criterion_group, criterion_main};
use marshal_scheduler::domain::NodeId;
use marshal_scheduler::service::pb;
use marshal_scheduler::service::tokio::{self, sync::Notify, sync::broadcast};
use marshal_scheduler::service::watchers::NodeWatchers;

const WATCHERS: u32 = 1250;
const ASSIGNMENTS: usize = 1000;

fn assignment(i: usize) -> (NodeId, pb::Assignment) {
    let node = NodeId((i as u32 * 7919) % WATCHERS);
    let a = pb::Assignment {
        job_id: i as u64,
        action: pb::AssignmentAction::Start as i32,
        ..Default::default()
    };
    (node, a)
}

/// Counts deliveries and wakes the publisher when all have arrived.
#[derive(Default)]
struct Delivered {
    count: AtomicUsize,
    all: Notify,
}

impl Delivered {
    fn one(&self) {
        if self.count.fetch_add(1, Ordering::AcqRel) + 1 == ASSIGNMENTS {
            self.all.notify_one();
        }
    }
}

/// `iters` bursts of `publish`, each timed until every assignment was delivered.
async fn timed(iters: u64, delivered: &Delivered, publish: impl Fn()) -> Duration {
    // Let every watcher start waiting first.
    tokio::task::yield_now().await;
    let mut took = Duration::ZERO;
    for _ in 0..iters {
        delivered.count.store(0, Ordering::Release);
        let start = Instant::now();
        publish();
        delivered.all.notified().await;
        took += start.elapsed();
    }
    took
}

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap()
}

fn per_node(iters: u64) -> Duration {
    runtime().block_on(async {
        let watchers = Arc::new(NodeWatchers::default());
        let delivered = Arc::new(Delivered::default());
        for n in 0..WATCHERS {
            let mut watch = watchers.subscribe(NodeId(n));
            let delivered = delivered.clone();
            tokio::spawn(async move {
                while watch.rx.recv().await.is_some() {
                    delivered.one();
                }
            });
        }
        timed(iters, &delivered, || {
            for i in 0..ASSIGNMENTS {
                let (node, a) = assignment(i);
                watchers.publish(node, &a);
            }
        })
        .await
    })
}

fn broadcast_all(iters: u64) -> Duration {
    runtime().block_on(async {
        let (tx, _) = broadcast::channel::<Arc<(NodeId, pb::Assignment)>>(1 << 16);
        let delivered = Arc::new(Delivered::default());
        for n in 0..WATCHERS {
            let mut rx = tx.subscribe();
            let delivered = delivered.clone();
            tokio::spawn(async move {
                while let Ok(e) = rx.recv().await {
                    if e.0 == NodeId(n) {
                        delivered.one();
                    }
                }
            });
        }
        timed(iters, &delivered, || {
            for i in 0..ASSIGNMENTS {
                let _ = tx.send(Arc::new(assignment(i)));
            }
        })
        .await
    })
}

fn bench_fanout(c: &mut Criterion) {
    let mut g = c.benchmark_group("watch_fanout_1250x1000");
    g.sample_size(20);
    g.bench_function("per-node", |b| b.iter_custom(per_node));
    g.bench_function("broadcast", |b| b.iter_custom(broadcast_all));
    g.finish();
}

criterion_group!(benches, bench_fanout);
criterion_main!(benches);
