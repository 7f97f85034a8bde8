//! The `grpc.health.v1.Health` service, with a shutdown tonic-health lacks.
//!
//! tonic-health's `Watch` streams never end: their status channels live as long as the
//! reporter. A graceful shutdown waits for open calls, so one load balancer or sidecar
//! watching health held every shutdown for its whole grace period and then had its call
//! dropped, having been told SERVING to the end. Here a shutdown first reports every
//! service NOT_SERVING ([`Health::not_serving`]), so watchers hear it, and then ends
//! the watch streams with the server's stop signal.

use std::pin::Pin;
use std::task::{Context, Poll};

use tokio::sync::watch;
use tokio_stream::Stream;
use tonic::{Request, Response, Status};
use tonic_health::ServingStatus;
use tonic_health::pb::health_server::{Health as HealthApi, HealthServer};
use tonic_health::pb::{HealthCheckRequest, HealthCheckResponse};
use tonic_health::server::{HealthReporter, HealthService};

/// Reports the server's health, and says NOT_SERVING before it stops.
#[derive(Clone, Debug)]
pub struct Health {
    reporter: HealthReporter,
    services: &'static [&'static str],
}

impl Health {
    /// The reporter, every one of `services` SERVING, and the gRPC service to add to
    /// the server, whose watch streams end once `stop` turns true.
    pub async fn serving(
        services: &'static [&'static str],
        stop: watch::Receiver<bool>,
    ) -> (Self, HealthServer<impl HealthApi>) {
        let reporter = HealthReporter::new();
        for s in services {
            reporter.set_service_status(s, ServingStatus::Serving).await;
        }
        let service = Stopping {
            inner: HealthService::from_health_reporter(reporter.clone()),
            stop,
        };
        (Health { reporter, services }, HealthServer::new(service))
    }

    /// The whole server and every service NOT_SERVING (a shutdown, or a failure that
    /// stops all changes).
    pub async fn not_serving(&self) {
        self.reporter
            .set_service_status("", ServingStatus::NotServing)
            .await;
        for s in self.services {
            self.reporter
                .set_service_status(s, ServingStatus::NotServing)
                .await;
        }
    }
}

/// tonic-health's service, with watch streams that end at the stop signal.
struct Stopping {
    inner: HealthService,
    stop: watch::Receiver<bool>,
}

#[tonic::async_trait]
impl HealthApi for Stopping {
    async fn check(
        &self,
        request: Request<HealthCheckRequest>,
    ) -> Result<Response<HealthCheckResponse>, Status> {
        self.inner.check(request).await
    }

    type WatchStream = UntilStopped;

    async fn watch(
        &self,
        request: Request<HealthCheckRequest>,
    ) -> Result<Response<Self::WatchStream>, Status> {
        let inner = self.inner.watch(request).await?.into_inner();
        Ok(Response::new(UntilStopped {
            inner: Box::pin(inner),
            stopped: Box::pin(crate::service::core::stopped(self.stop.clone())),
        }))
    }
}

type Statuses = Pin<Box<dyn Stream<Item = Result<HealthCheckResponse, Status>> + Send>>;

/// A watch stream that ends at the stop signal, after delivering any status sent before
/// it (a shutdown's NOT_SERVING).
pub struct UntilStopped {
    inner: Statuses,
    stopped: Pin<Box<dyn std::future::Future<Output = ()> + Send>>,
}

impl std::fmt::Debug for UntilStopped {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("UntilStopped").finish_non_exhaustive()
    }
}

impl Stream for UntilStopped {
    type Item = Result<HealthCheckResponse, Status>;

    fn poll_next(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        let this = self.get_mut();
        if let Poll::Ready(item) = this.inner.as_mut().poll_next(cx) {
            return Poll::Ready(item);
        }
        match this.stopped.as_mut().poll(cx) {
            Poll::Ready(()) => Poll::Ready(None),
            Poll::Pending => Poll::Pending,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio_stream::StreamExt as _;

    fn status(r: Option<Result<HealthCheckResponse, Status>>) -> Option<i32> {
        r.map(|r| r.unwrap().status)
    }

    #[tokio::test]
    async fn a_watch_hears_not_serving_then_ends_at_the_stop() {
        let (stop, stop_rx) = watch::channel(false);
        let (health, server) = Health::serving(&["x.Service"], stop_rx).await;
        drop(server);
        let service = Stopping {
            inner: HealthService::from_health_reporter(health.reporter.clone()),
            stop: stop.subscribe(),
        };
        let request = |name: &str| {
            Request::new(HealthCheckRequest {
                service: name.into(),
            })
        };
        let mut watch = service
            .watch(request("x.Service"))
            .await
            .unwrap()
            .into_inner();
        let serving = tonic_health::pb::health_check_response::ServingStatus::Serving as i32;
        let not_serving = tonic_health::pb::health_check_response::ServingStatus::NotServing as i32;
        assert_eq!(status(watch.next().await), Some(serving));
        // Before the stop: the stream stays open.
        let open = tokio::time::timeout(std::time::Duration::from_millis(100), watch.next()).await;
        assert!(open.is_err(), "the watch ended before the stop");
        health.not_serving().await;
        let _ = stop.send(true);
        let ended = tokio::time::timeout(std::time::Duration::from_secs(5), async {
            let mut seen = Vec::new();
            while let Some(s) = watch.next().await {
                seen.push(s.unwrap().status);
            }
            seen
        })
        .await
        .expect("the watch did not end at the stop");
        assert_eq!(ended, [not_serving]);
        let checked = service.check(request("")).await.unwrap().into_inner();
        assert_eq!(checked.status, not_serving);
    }
}
