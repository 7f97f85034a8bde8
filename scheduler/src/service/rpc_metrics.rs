//! Per-RPC metrics: calls by service, method and status code, and how long they took, as
//! a tower layer around all of `marshal serve`'s gRPC services. It sits outside the
//! authentication interceptors, so their refusals (UNAUTHENTICATED, PERMISSION_DENIED)
//! are counted like any other status.
//!
//! A call is counted when it ends, with the status it ended with. A handler's or an
//! interceptor's error is a trailers-only response, which carries the status in its
//! headers: counted then. Any other response carries it in the trailers after its body
//! (a unary answer's message, a stream's last message), read as they pass: so a watch
//! stream is counted and timed when it ends, with the status it ended with (as
//! go-grpc-prometheus counts streams), not when it opens. A call dropped before it
//! answered, or a stream dropped before its trailers (the client cancelled, its deadline
//! passed, the connection went), counts as `Cancelled`.
//!
//! Label values are bounded: a path that names no method of the served services counts
//! as service and method `unknown`, so a client sending made-up paths cannot grow the
//! metric families without limit.

use std::collections::HashMap;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Instant;

use http_body::{Body, Frame, SizeHint};
use prost::Message as _;
use tonic::codegen::Service;
use tonic::codegen::http::{HeaderMap, Request, Response};
use tower_layer::Layer;

use crate::service::metrics::{Metrics, RpcLabels};

/// The gRPC methods the server serves, by request path (`/package.Service/Method`).
#[derive(Debug, Default)]
pub struct KnownMethods(HashMap<String, (String, String)>);

impl KnownMethods {
    /// Every method of every service in the encoded `FileDescriptorSet`s.
    pub fn from_descriptor_sets(sets: &[&[u8]]) -> Result<Self, prost::DecodeError> {
        let mut known = HashMap::new();
        for bytes in sets {
            let set = prost_types::FileDescriptorSet::decode(*bytes)?;
            for file in set.file {
                let package = file.package.unwrap_or_default();
                for service in file.service {
                    let full = match (package.as_str(), service.name()) {
                        ("", name) => name.to_string(),
                        (package, name) => format!("{package}.{name}"),
                    };
                    for method in service.method {
                        let name = method.name().to_string();
                        known.insert(format!("/{full}/{name}"), (full.clone(), name));
                    }
                }
            }
        }
        Ok(KnownMethods(known))
    }

    fn labels(&self, path: &str) -> (String, String) {
        self.0
            .get(path)
            .cloned()
            .unwrap_or_else(|| ("unknown".into(), "unknown".into()))
    }
}

/// The layer `Server::layer` takes.
#[derive(Clone, Debug)]
pub struct RpcMetricsLayer {
    metrics: Arc<Metrics>,
    known: Arc<KnownMethods>,
}

impl RpcMetricsLayer {
    pub fn new(metrics: Arc<Metrics>, known: KnownMethods) -> Self {
        RpcMetricsLayer {
            metrics,
            known: Arc::new(known),
        }
    }
}

impl<S> Layer<S> for RpcMetricsLayer {
    type Service = RpcMetrics<S>;

    fn layer(&self, inner: S) -> RpcMetrics<S> {
        RpcMetrics {
            inner,
            layer: self.clone(),
        }
    }
}

#[derive(Clone, Debug)]
pub struct RpcMetrics<S> {
    inner: S,
    layer: RpcMetricsLayer,
}

type BoxFuture<T> = Pin<Box<dyn Future<Output = T> + Send>>;

impl<S, ReqBody, ResBody> Service<Request<ReqBody>> for RpcMetrics<S>
where
    S: Service<Request<ReqBody>, Response = Response<ResBody>>,
    S::Future: Send + 'static,
{
    type Response = Response<Recorded<ResBody>>;
    type Error = S::Error;
    type Future = BoxFuture<Result<Self::Response, S::Error>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, req: Request<ReqBody>) -> Self::Future {
        let (service, method) = self.layer.known.labels(req.uri().path());
        let mut record = Record {
            metrics: self.layer.metrics.clone(),
            service,
            method,
            started: Instant::now(),
            code: None,
        };
        let call = self.inner.call(req);
        Box::pin(async move {
            let response = match call.await {
                Ok(response) => response,
                Err(e) => {
                    record.ended("transport error".to_string());
                    return Err(e);
                }
            };
            // A trailers-only response has ended: its status is in the headers.
            let record = match status_code(response.headers()) {
                Some(code) => {
                    record.ended(code);
                    None
                }
                None => Some(record),
            };
            Ok(response.map(|body| Recorded {
                inner: Box::pin(body),
                record,
            }))
        })
    }
}

/// A response body that records its call when its trailers pass (with their status),
/// or when it is dropped before them (`Cancelled`).
pub struct Recorded<B> {
    inner: Pin<Box<B>>,
    record: Option<Record>,
}

impl<B> std::fmt::Debug for Recorded<B> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Recorded")
            .field("recorded", &self.record.is_none())
            .finish_non_exhaustive()
    }
}

impl<B: Body> Body for Recorded<B> {
    type Data = B::Data;
    type Error = B::Error;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Self::Data>, Self::Error>>> {
        let polled = self.inner.as_mut().poll_frame(cx);
        let ended = match &polled {
            Poll::Ready(Some(Ok(frame))) => frame
                .trailers_ref()
                .map(|t| status_code(t).unwrap_or_else(|| "Unknown".into())),
            // A body that fails mid-stream ends the call without a status.
            Poll::Ready(Some(Err(_))) => Some("transport error".into()),
            // Ended without trailers: no status was sent.
            Poll::Ready(None) => Some("Unknown".into()),
            Poll::Pending => None,
        };
        if let Some(code) = ended
            && let Some(mut record) = self.record.take()
        {
            record.ended(code);
        }
        polled
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}

/// One call's labels and start, recorded when dropped: with the code the call ended
/// with, or `Cancelled` when its future was dropped first.
struct Record {
    metrics: Arc<Metrics>,
    service: String,
    method: String,
    started: Instant,
    code: Option<String>,
}

impl Record {
    fn ended(&mut self, code: String) {
        self.code = Some(code);
    }
}

impl Drop for Record {
    fn drop(&mut self) {
        let (service, method) = (
            std::mem::take(&mut self.service),
            std::mem::take(&mut self.method),
        );
        self.metrics
            .rpc_seconds
            .get_or_create(&vec![
                ("grpc_service", service.clone()),
                ("grpc_method", method.clone()),
            ])
            .observe(self.started.elapsed().as_secs_f64());
        let code = self.code.take().unwrap_or_else(|| "Cancelled".into());
        let labels: RpcLabels = vec![
            ("grpc_service", service),
            ("grpc_method", method),
            ("grpc_code", code),
        ];
        self.metrics.rpc_handled.get_or_create(&labels).inc();
    }
}

/// The gRPC status in `headers` (response headers or trailers) as tonic names it
/// (`NotFound`); `None` without one.
fn status_code(headers: &HeaderMap) -> Option<String> {
    let code = headers
        .get("grpc-status")?
        .to_str()
        .ok()
        .and_then(|v| v.parse::<i32>().ok())
        .map_or(tonic::Code::Unknown, tonic::Code::from);
    Some(format!("{code:?}"))
}

#[cfg(test)]
mod tests {
    use super::*;

    use std::collections::VecDeque;

    use tonic::codegen::Bytes;

    /// A response body of set frames: messages, then trailers.
    struct Frames(VecDeque<Frame<Bytes>>);

    impl Frames {
        /// `messages` messages, then trailers with `status`.
        fn ending_with(messages: usize, status: &'static str) -> Self {
            let mut frames: VecDeque<Frame<Bytes>> = (0..messages)
                .map(|_| Frame::data(Bytes::from_static(b"message")))
                .collect();
            let mut trailers = HeaderMap::new();
            trailers.insert("grpc-status", status.parse().unwrap());
            frames.push_back(Frame::trailers(trailers));
            Frames(frames)
        }
    }

    impl Body for Frames {
        type Data = Bytes;
        type Error = std::convert::Infallible;

        fn poll_frame(
            mut self: Pin<&mut Self>,
            _: &mut Context<'_>,
        ) -> Poll<Option<Result<Frame<Bytes>, Self::Error>>> {
            Poll::Ready(self.0.pop_front().map(Ok))
        }
    }

    /// Answers every call: with `Some(status)` in the headers, a trailers-only response;
    /// with `None`, with `.1` messages and then the status `.2` in the trailers (a
    /// unary success is `(None, 1, "0")`).
    #[derive(Clone)]
    struct Answers(Option<&'static str>, usize, &'static str);

    /// Never answers.
    #[derive(Clone)]
    struct Hangs;

    impl Service<Request<()>> for Hangs {
        type Response = Response<Frames>;
        type Error = std::convert::Infallible;
        type Future = std::future::Pending<Result<Response<Frames>, Self::Error>>;

        fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
            Poll::Ready(Ok(()))
        }

        fn call(&mut self, _: Request<()>) -> Self::Future {
            std::future::pending()
        }
    }

    impl Service<Request<()>> for Answers {
        type Response = Response<Frames>;
        type Error = std::convert::Infallible;
        type Future = std::future::Ready<Result<Response<Frames>, Self::Error>>;

        fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
            Poll::Ready(Ok(()))
        }

        fn call(&mut self, _: Request<()>) -> Self::Future {
            let response = match self.0 {
                Some(status) => {
                    let mut response = Response::new(Frames(VecDeque::new()));
                    response
                        .headers_mut()
                        .insert("grpc-status", status.parse().unwrap());
                    response
                }
                None => Response::new(Frames::ending_with(self.1, self.2)),
            };
            std::future::ready(Ok(response))
        }
    }

    /// Reads `body` to its end, as the server does when it sends it.
    async fn drain<B: Body + Unpin>(mut body: B) {
        while std::future::poll_fn(|cx| Pin::new(&mut body).poll_frame(cx))
            .await
            .is_some()
        {}
    }

    fn handled(metrics: &Metrics, labels: [&str; 3]) -> u64 {
        let labels: RpcLabels = vec![
            ("grpc_service", labels[0].into()),
            ("grpc_method", labels[1].into()),
            ("grpc_code", labels[2].into()),
        ];
        metrics.rpc_handled.get_or_create(&labels).get()
    }

    #[tokio::test]
    async fn calls_count_by_method_and_code_and_unknown_paths_share_one_label() {
        let metrics = Arc::new(Metrics::new());
        let known =
            KnownMethods::from_descriptor_sets(&[crate::service::FILE_DESCRIPTOR_SET]).unwrap();
        let layer = RpcMetricsLayer::new(metrics.clone(), known);
        let call = |status: Option<&'static str>, path: &str| {
            let mut service = layer.layer(Answers(status, 1, "0"));
            let request = Request::builder().uri(path).body(()).unwrap();
            service.call(request)
        };
        // A unary success is counted once its trailers pass.
        let ok = call(None, "/marshal.v1.JobService/Submit").await.unwrap();
        assert_eq!(
            handled(&metrics, ["marshal.v1.JobService", "Submit", "Ok"]),
            0
        );
        drain(ok.into_body()).await;
        call(Some("16"), "/marshal.v1.JobService/Submit")
            .await
            .unwrap();
        call(Some("5"), "/marshal.v1.JobService/Get").await.unwrap();
        for path in ["/marshal.v1.JobService/NoSuchMethod", "/made.up/Path", "/"] {
            call(Some("12"), path).await.unwrap();
        }
        let submit = ["marshal.v1.JobService", "Submit"];
        assert_eq!(handled(&metrics, [submit[0], submit[1], "Ok"]), 1);
        assert_eq!(
            handled(&metrics, [submit[0], submit[1], "Unauthenticated"]),
            1
        );
        assert_eq!(
            handled(&metrics, ["marshal.v1.JobService", "Get", "NotFound"]),
            1
        );
        assert_eq!(
            handled(&metrics, ["unknown", "unknown", "Unimplemented"]),
            3
        );
        let text = metrics.render();
        let submits = "marshal_grpc_server_handling_seconds_count{grpc_service=\"marshal.v1.JobService\",grpc_method=\"Submit\"} 2";
        assert!(text.contains(submits), "{text}");
        // A call dropped before it answers (a client's cancel, a deadline) is counted.
        let mut hangs = layer.layer(Hangs);
        let request = Request::builder()
            .uri("/marshal.v1.JobService/List")
            .body(())
            .unwrap();
        let pending = hangs.call(request);
        assert_eq!(
            handled(&metrics, ["marshal.v1.JobService", "List", "Cancelled"]),
            0
        );
        drop(pending);
        assert_eq!(
            handled(&metrics, ["marshal.v1.JobService", "List", "Cancelled"]),
            1
        );
        // The node service's methods are known too, the streaming ones included.
        let watch = call(None, "/marshal.v1.NodeService/WatchAssignments")
            .await
            .unwrap();
        drain(watch.into_body()).await;
        assert_eq!(
            handled(
                &metrics,
                ["marshal.v1.NodeService", "WatchAssignments", "Ok"]
            ),
            1
        );
    }

    #[tokio::test]
    async fn a_stream_is_counted_when_it_ends_with_the_status_of_its_trailers() {
        let metrics = Arc::new(Metrics::new());
        let known =
            KnownMethods::from_descriptor_sets(&[crate::service::FILE_DESCRIPTOR_SET]).unwrap();
        let layer = RpcMetricsLayer::new(metrics.clone(), known);
        let path = "/marshal.v1.NodeService/WatchAssignments";
        let request = || Request::builder().uri(path).body(()).unwrap();
        let count = |code: &str| {
            handled(
                &metrics,
                ["marshal.v1.NodeService", "WatchAssignments", code],
            )
        };
        // Cut off after three messages (a lagging watcher): not counted when it opened,
        // counted with its status when it ended.
        let cut_off = layer
            .layer(Answers(None, 3, "8"))
            .call(request())
            .await
            .unwrap();
        assert_eq!(count("Ok") + count("ResourceExhausted"), 0);
        drain(cut_off.into_body()).await;
        assert_eq!((count("Ok"), count("ResourceExhausted")), (0, 1));
        // Dropped after a message, before its trailers: the client went away.
        let mut body = layer
            .layer(Answers(None, 3, "0"))
            .call(request())
            .await
            .unwrap()
            .into_body();
        let first = std::future::poll_fn(|cx| Pin::new(&mut body).poll_frame(cx)).await;
        assert!(first.is_some_and(|f| f.unwrap().is_data()));
        assert_eq!(count("Cancelled"), 0);
        drop(body);
        assert_eq!((count("Ok"), count("Cancelled")), (0, 1));
        let text = metrics.render();
        let timed = "marshal_grpc_server_handling_seconds_count{grpc_service=\"marshal.v1.NodeService\",grpc_method=\"WatchAssignments\"} 2";
        assert!(text.contains(timed), "{text}");
    }
}
