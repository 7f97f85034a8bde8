//! Per-RPC metrics: calls by service, method and status code, and how long they took, as
//! a tower layer around all of `marshal serve`'s gRPC services. It sits outside the
//! authentication interceptors, so their refusals (UNAUTHENTICATED, PERMISSION_DENIED)
//! are counted like any other status.
//!
//! The status is read from the response headers. A handler's or an interceptor's error
//! is a trailers-only response, which carries it there; a unary success carries it in
//! the trailers, after the body, and is counted OK. A streaming call (the watches) is
//! counted and timed when its stream opens: an error later in the stream is not seen.
//! A call dropped before it answered (the client cancelled, its deadline passed) counts
//! as `Cancelled`.
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

use prost::Message as _;
use tonic::codegen::Service;
use tonic::codegen::http::{Request, Response};
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
    type Response = S::Response;
    type Error = S::Error;
    type Future = BoxFuture<Result<S::Response, S::Error>>;

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
            let result = call.await;
            record.ended(match &result {
                Ok(response) => status_code(response),
                Err(_) => "transport error".to_string(),
            });
            result
        })
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

/// The response's gRPC status as tonic names it (`NotFound`); OK without one in the
/// headers (see the module's docs).
fn status_code<B>(response: &Response<B>) -> String {
    let code = response
        .headers()
        .get("grpc-status")
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse::<i32>().ok())
        .map_or(tonic::Code::Ok, tonic::Code::from);
    format!("{code:?}")
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Answers every call with `status` in the headers (none: a unary success).
    #[derive(Clone)]
    struct Answers(Option<&'static str>);

    /// Never answers.
    #[derive(Clone)]
    struct Hangs;

    impl Service<Request<()>> for Hangs {
        type Response = Response<()>;
        type Error = std::convert::Infallible;
        type Future = std::future::Pending<Result<Response<()>, Self::Error>>;

        fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
            Poll::Ready(Ok(()))
        }

        fn call(&mut self, _: Request<()>) -> Self::Future {
            std::future::pending()
        }
    }

    impl Service<Request<()>> for Answers {
        type Response = Response<()>;
        type Error = std::convert::Infallible;
        type Future = std::future::Ready<Result<Response<()>, Self::Error>>;

        fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
            Poll::Ready(Ok(()))
        }

        fn call(&mut self, _: Request<()>) -> Self::Future {
            let mut response = Response::new(());
            if let Some(status) = self.0 {
                response
                    .headers_mut()
                    .insert("grpc-status", status.parse().unwrap());
            }
            std::future::ready(Ok(response))
        }
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
            let mut service = layer.layer(Answers(status));
            let request = Request::builder().uri(path).body(()).unwrap();
            service.call(request)
        };
        call(None, "/marshal.v1.JobService/Submit").await.unwrap();
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
        call(None, "/marshal.v1.NodeService/WatchAssignments")
            .await
            .unwrap();
        assert_eq!(
            handled(
                &metrics,
                ["marshal.v1.NodeService", "WatchAssignments", "Ok"]
            ),
            1
        );
    }
}
