//! The gRPC services: thin adapters from requests to the core and back.

use std::pin::Pin;
use std::sync::Arc;

use tokio::sync::{broadcast, mpsc};
use tokio_stream::Stream;
use tokio_stream::wrappers::ReceiverStream;
use tonic::{Request, Response, Status, Streaming};

use crate::service::auth::BoundNode;
use crate::service::client::REQUEUE_IN_METADATA;
use crate::service::convert::{self, job_id, job_to_pb, state_from_pb};
use crate::service::core::{Core, now_us};
use crate::service::error::ServiceError;
use crate::service::pb;
use crate::service::pb::admin_service_server::AdminService;
use crate::service::pb::advisor_service_server::AdvisorService;
use crate::service::pb::job_service_server::JobService;
use crate::service::pb::node_service_server::NodeService;
use crate::service::watchers::{NodeWatch, WATCH_BACKLOG};

type Stream_<T> = Pin<Box<dyn Stream<Item = Result<T, Status>> + Send>>;

/// All four services share one core.
#[derive(Clone, Debug)]
pub struct Api {
    pub core: Arc<Core>,
    /// Flips on shutdown, ending every open stream so the server can stop.
    pub shutdown: tokio::sync::watch::Receiver<bool>,
}

const MAX_LIST: u32 = 10_000;

impl Api {
    fn job(&self, id: u32) -> Result<pb::Job, ServiceError> {
        let inner = self.core.lock();
        Ok(job_to_pb(inner.record(id)?, &inner.topo))
    }

    /// Sends `first`, then what `source` yields, until the watcher goes away, the source
    /// ends (with its last word, if any) or the server shuts down. A watcher cut off for
    /// falling behind is counted under `watch` (`watchers_cut_off_total`).
    fn forward<T: Send + 'static>(
        &self,
        watch: &'static str,
        first: Vec<T>,
        mut source: impl Source<T>,
    ) -> Stream_<T> {
        let (tx, out) = mpsc::channel(1024);
        let shutdown = crate::service::core::stopped(self.shutdown.clone());
        let metrics = self.core.metrics.clone();
        tokio::spawn(async move {
            tokio::pin!(shutdown);
            for item in first {
                if tx.send(Ok(item)).await.is_err() {
                    return;
                }
            }
            loop {
                let next = tokio::select! {
                    n = source.next() => n,
                    _ = tx.closed() => return,
                    _ = &mut shutdown => {
                        let _ = tx.send(Err(Status::unavailable("the scheduler is shutting down"))).await;
                        return;
                    }
                };
                match next {
                    Next::Item(item) => {
                        if tx.send(Ok(item)).await.is_err() {
                            return;
                        }
                    }
                    Next::Skip => {}
                    Next::End(last) => {
                        if let Some(status) = last {
                            if status.code() == tonic::Code::ResourceExhausted {
                                metrics
                                    .watchers_cut_off
                                    .get_or_create(&vec![("watch", watch)])
                                    .inc();
                            }
                            let _ = tx.send(Err(status)).await;
                        }
                        return;
                    }
                }
            }
        });
        Box::pin(ReceiverStream::new(out))
    }
}

/// What a watch's source gives next.
enum Next<T> {
    Item(T),
    /// Something not for this watcher.
    Skip,
    /// The source ended; the status, if any, tells the watcher why.
    End(Option<Status>),
}

trait Source<T>: Send + 'static {
    fn next(&mut self) -> impl std::future::Future<Output = Next<T>> + Send;
}

/// Job events, filtered by job.
struct JobEvents {
    rx: broadcast::Receiver<Arc<pb::JobEvent>>,
    ids: Vec<u64>,
}

impl Source<pb::JobEvent> for JobEvents {
    async fn next(&mut self) -> Next<pb::JobEvent> {
        match self.rx.recv().await {
            Ok(e) if self.ids.is_empty() || self.ids.contains(&e.job_id) => {
                Next::Item((*e).clone())
            }
            Ok(_) => Next::Skip,
            Err(broadcast::error::RecvError::Lagged(n)) => Next::End(Some(lagging(n))),
            Err(broadcast::error::RecvError::Closed) => Next::End(None),
        }
    }
}

impl Source<pb::Assignment> for NodeWatch {
    async fn next(&mut self) -> Next<pb::Assignment> {
        match self.rx.recv().await {
            Some(a) => Next::Item(a),
            None if self.lagged() => Next::End(Some(lagging(WATCH_BACKLOG as u64))),
            None => Next::End(None),
        }
    }
}

fn lagging(n: u64) -> Status {
    Status::resource_exhausted(format!(
        "this watcher fell {n} events behind; re-read the state and watch again"
    ))
}

#[tonic::async_trait]
impl JobService for Api {
    async fn submit(
        &self,
        req: Request<pb::SubmitRequest>,
    ) -> Result<Response<pb::SubmitResponse>, Status> {
        let spec = req.into_inner().spec;
        let id = self
            .core
            .mutate(|inner| inner.submit(spec.as_ref(), now_us()))
            .await?;
        Ok(Response::new(pb::SubmitResponse {
            job: Some(self.job(id)?),
        }))
    }

    async fn cancel(
        &self,
        req: Request<pb::CancelRequest>,
    ) -> Result<Response<pb::CancelResponse>, Status> {
        let req = req.into_inner();
        let id = job_id("job_id", req.job_id)?.0;
        convert::reason("reason", &req.reason)?;
        self.core
            .mutate(|inner| inner.cancel(id, &req.reason, now_us()))
            .await?;
        Ok(Response::new(pb::CancelResponse {
            job: Some(self.job(id)?),
        }))
    }

    async fn get(
        &self,
        req: Request<pb::GetJobRequest>,
    ) -> Result<Response<pb::GetJobResponse>, Status> {
        let id = job_id("job_id", req.into_inner().job_id)?.0;
        Ok(Response::new(pb::GetJobResponse {
            job: Some(self.job(id)?),
        }))
    }

    async fn list(
        &self,
        req: Request<pb::ListJobsRequest>,
    ) -> Result<Response<pb::ListJobsResponse>, Status> {
        let req = req.into_inner();
        let limit = match req.limit {
            0 => 1000,
            n if n > MAX_LIST => {
                return Err(
                    ServiceError::invalid("limit", format!("{n}; at most {MAX_LIST}")).into(),
                );
            }
            n => n,
        } as usize;
        let states = req
            .states
            .iter()
            .enumerate()
            .map(|(i, &s)| state_from_pb(&format!("states[{i}]"), s))
            .collect::<Result<Vec<_>, _>>()?;
        let after = u32::try_from(req.after_id).unwrap_or(u32::MAX);
        let inner = self.core.lock();
        let mut jobs = Vec::new();
        let mut next = 0;
        for (id, r) in inner.jobs.range(after.saturating_add(1)..) {
            if (!states.is_empty() && !states.contains(&r.state))
                || (!req.tenant.is_empty() && r.job.tenant != req.tenant)
            {
                continue;
            }
            if jobs.len() == limit {
                next = *id as u64 - 1;
                break;
            }
            jobs.push(job_to_pb(r, &inner.topo));
        }
        Ok(Response::new(pb::ListJobsResponse {
            jobs,
            next_after_id: next,
        }))
    }

    type WatchEventsStream = Stream_<pb::JobEvent>;

    async fn watch_events(
        &self,
        req: Request<pb::WatchEventsRequest>,
    ) -> Result<Response<Self::WatchEventsStream>, Status> {
        let ids = req.into_inner().job_ids;
        let rx = self.core.events.subscribe();
        Ok(Response::new(self.forward(
            "jobs",
            vec![],
            JobEvents { rx, ids },
        )))
    }
}

#[tonic::async_trait]
impl NodeService for Api {
    async fn register(
        &self,
        req: Request<pb::RegisterNodeRequest>,
    ) -> Result<Response<pb::RegisterNodeResponse>, Status> {
        BoundNode::check(
            &req,
            req.get_ref().node.as_ref().map_or("", |n| n.name.as_str()),
        )?;
        let req = req.into_inner();
        let name = req.node.as_ref().map_or("", |n| n.name.as_str());
        let reg = match self
            .core
            .mutate(|inner| inner.register(&req, now_us()))
            .await
        {
            Ok(reg) => reg,
            Err(e) => {
                // Told only with a refusal: any other error leaves the node as it was.
                let requeue_in = matches!(e, ServiceError::FailedPrecondition(_))
                    .then(|| self.core.lock().requeue_in_us(name, now_us()))
                    .flatten();
                let mut status = Status::from(e);
                if let Some(us) = requeue_in
                    && let Ok(v) = (us / 1000).to_string().parse()
                {
                    status.metadata_mut().insert(REQUEUE_IN_METADATA, v);
                }
                return Err(status);
            }
        };
        let inner = self.core.lock();
        tracing::info!(node = %name, "registered");
        Ok(Response::new(pb::RegisterNodeResponse {
            status: Some(inner.node_status(reg.node)),
            stop: reg.stop,
            node_timeout_ms: (inner.node_timeout_us / 1000) as u64,
            node_grace_ms: (inner.node_grace_us / 1000) as u64,
        }))
    }

    async fn stream_telemetry(
        &self,
        req: Request<Streaming<pb::TelemetrySample>>,
    ) -> Result<Response<pb::TelemetryAck>, Status> {
        let bound = req.extensions().get::<BoundNode>().cloned();
        let mut stream = req.into_inner();
        let mut ack = pb::TelemetryAck::default();
        while let Some(sample) = stream.message().await? {
            let result = match &bound {
                Some(BoundNode(own)) if *own != sample.node => Err(format!(
                    "sample of node {}: this caller is bound to node {own}",
                    sample.node
                )),
                _ => self.core.lock().telemetry(&sample, now_us()),
            };
            match result {
                Ok(changed) => {
                    ack.accepted += 1;
                    if changed {
                        self.core.wake();
                    }
                }
                Err(why) => {
                    ack.rejected += 1;
                    if ack.first_error.is_empty() {
                        ack.first_error = why;
                    }
                }
            }
        }
        let m = &self.core.metrics;
        m.telemetry
            .get_or_create(&vec![("outcome", "accepted")])
            .inc_by(ack.accepted);
        m.telemetry
            .get_or_create(&vec![("outcome", "rejected")])
            .inc_by(ack.rejected);
        Ok(Response::new(ack))
    }

    type WatchAssignmentsStream = Stream_<pb::Assignment>;

    async fn watch_assignments(
        &self,
        req: Request<pb::WatchAssignmentsRequest>,
    ) -> Result<Response<Self::WatchAssignmentsStream>, Status> {
        BoundNode::check(&req, &req.get_ref().node)?;
        let name = req.into_inner().node;
        // Snapshot and subscription under one lock: every later change arrives as an
        // event, every earlier one is in the snapshot (some may come twice; agents
        // apply assignments idempotently).
        let (first, watch, epoch) = {
            let mut inner = self.core.lock();
            let node = inner.node_id("node", &name)?;
            if !inner.nodes[node.0 as usize].registered {
                return Err(ServiceError::FailedPrecondition(format!(
                    "node {name} has not registered; call Register first"
                ))
                .into());
            }
            inner.heard_from(node, now_us());
            let mut first = inner.node_assignments(node);
            first.push(pb::Assignment {
                action: pb::AssignmentAction::Synced as i32,
                ..Default::default()
            });
            (
                first,
                self.core.watchers.subscribe(node),
                self.core.current_epoch_locked(&inner),
            )
        };
        // The snapshot may hold changes not yet durable: send it only once they are.
        self.core.wake();
        self.core.wait_durable(epoch).await?;
        Ok(Response::new(self.forward("assignments", first, watch)))
    }

    async fn report_job(
        &self,
        req: Request<pb::ReportJobRequest>,
    ) -> Result<Response<pb::ReportJobResponse>, Status> {
        BoundNode::check(&req, &req.get_ref().node)?;
        let mut req = req.into_inner();
        req.message = convert::report_message(&req.message);
        let id = self
            .core
            .mutate(|inner| inner.report(&req, now_us()))
            .await?;
        Ok(Response::new(pb::ReportJobResponse {
            job: Some(self.job(id)?),
        }))
    }

    async fn report_stopped(
        &self,
        req: Request<pb::ReportStoppedRequest>,
    ) -> Result<Response<pb::ReportStoppedResponse>, Status> {
        BoundNode::check(&req, &req.get_ref().node)?;
        let req = req.into_inner();
        let awaited = self
            .core
            .mutate(|inner| inner.stop_confirmed(&req, now_us()))
            .await?;
        Ok(Response::new(pb::ReportStoppedResponse { awaited }))
    }

    async fn heartbeat(
        &self,
        req: Request<pb::HeartbeatRequest>,
    ) -> Result<Response<pb::NodeStatus>, Status> {
        BoundNode::check(&req, &req.get_ref().node)?;
        let req = req.into_inner();
        let mut inner = self.core.lock();
        let (n, back) = inner.heartbeat(&req.node, now_us())?;
        let status = inner.node_status(n);
        drop(inner);
        if back {
            self.core.wake();
        }
        Ok(Response::new(status))
    }

    async fn drain(
        &self,
        req: Request<pb::DrainRequest>,
    ) -> Result<Response<pb::NodeStatus>, Status> {
        BoundNode::check(&req, &req.get_ref().node)?;
        let req = req.into_inner();
        convert::reason("reason", &req.reason)?;
        let n = self
            .core
            .mutate(|inner| inner.drain(&req.node, &req.reason, now_us()))
            .await?;
        Ok(Response::new(self.core.lock().node_status(n)))
    }

    async fn cordon(
        &self,
        req: Request<pb::CordonRequest>,
    ) -> Result<Response<pb::NodeStatus>, Status> {
        BoundNode::check(&req, &req.get_ref().node)?;
        let req = req.into_inner();
        convert::reason("reason", &req.reason)?;
        let n = self
            .core
            .mutate(|inner| inner.cordon(&req.node, req.cordon, &req.reason))
            .await?;
        Ok(Response::new(self.core.lock().node_status(n)))
    }

    async fn list_nodes(
        &self,
        _req: Request<pb::ListNodesRequest>,
    ) -> Result<Response<pb::ListNodesResponse>, Status> {
        let inner = self.core.lock();
        let jobs = inner.jobs_by_node();
        Ok(Response::new(pb::ListNodesResponse {
            nodes: inner
                .topo
                .node_ids()
                .map(|n| inner.node_status_with(n, jobs[n.0 as usize].len()))
                .collect(),
        }))
    }
}

#[tonic::async_trait]
impl AdvisorService for Api {
    async fn advise(
        &self,
        req: Request<pb::AdviseRequest>,
    ) -> Result<Response<pb::AdviseResponse>, Status> {
        let req = req.into_inner();
        let core = &self.core;
        let (name, mut recs, mut records) = crate::service::advisor::advise_off_thread(
            req,
            &core.policy_name,
            core.model.as_ref(),
            &core.advise,
            &core.advise_slots,
        )
        .await?;
        self.core
            .mutate(|inner| {
                for (rec, record) in recs.iter_mut().zip(records.iter_mut()) {
                    record.id = inner.next_decision;
                    rec.decision_id = record.id;
                    inner.next_decision += 1;
                }
                inner.dirty.meta = true;
                inner.dirty.decisions.append(&mut records);
                Ok(())
            })
            .await?;
        Ok(Response::new(pb::AdviseResponse {
            recommendations: recs,
            policy: name,
        }))
    }

    async fn explain(
        &self,
        req: Request<pb::ExplainRequest>,
    ) -> Result<Response<pb::Explanation>, Status> {
        let id = req.into_inner().decision_id;
        if id == 0 {
            return Err(ServiceError::invalid("decision_id", "missing (ids start at 1)").into());
        }
        let store = self.core.store.clone();
        let record = tokio::task::spawn_blocking(move || store.decision(id))
            .await
            .map_err(|e| Status::internal(format!("explain task: {e}")))?
            .map_err(|e| Status::internal(e.to_string()))?
            .ok_or_else(|| Status::not_found(format!("decision {id} does not exist")))?;
        let catalog = self.core.lock().topo.catalog.clone();
        Ok(Response::new(record.to_pb(&catalog)))
    }
}

#[tonic::async_trait]
impl AdminService for Api {
    async fn reload_model(
        &self,
        req: Request<pb::ReloadModelRequest>,
    ) -> Result<Response<pb::ModelInfo>, Status> {
        let path = req.into_inner().path;
        let path = (!path.is_empty()).then(|| std::path::PathBuf::from(path));
        let (model, policy) = (self.core.model.clone(), self.core.policy_name.clone());
        // Reading and checking an artifact is file I/O: keep it off the I/O threads.
        let status = tokio::task::spawn_blocking(move || model.reload(path.as_deref(), &policy))
            .await
            .map_err(|e| Status::internal(format!("reload task: {e}")))?
            .map_err(|e| match e {
                crate::service::model::ModelError::Unsupported(m) => Status::failed_precondition(m),
                e @ crate::service::model::ModelError::Rejected { .. } => {
                    Status::invalid_argument(e.to_string())
                }
                e @ crate::service::model::ModelError::Unpromoted { .. } => {
                    Status::failed_precondition(e.to_string())
                }
                e @ crate::service::model::ModelError::Forbidden { .. } => {
                    Status::permission_denied(e.to_string())
                }
                e @ crate::service::model::ModelError::Unsettled { .. } => {
                    Status::unavailable(e.to_string())
                }
            })?;
        Ok(Response::new(self.model_info(status)))
    }

    async fn model_info(
        &self,
        _req: Request<pb::ModelInfoRequest>,
    ) -> Result<Response<pb::ModelInfo>, Status> {
        let status = self.core.model.status(&self.core.policy_name);
        Ok(Response::new(self.model_info(status)))
    }
}

impl Api {
    fn model_info(&self, s: crate::service::model::ModelStatus) -> pb::ModelInfo {
        let m = &self.core.metrics;
        let count = |path| m.decisions.get_or_create(&vec![("path", path)]).get();
        pb::ModelInfo {
            loaded: s.loaded,
            name: s.name,
            version: s.version,
            path: s.path,
            policy: self.core.policy_name.clone(),
            detail: s.detail,
            decisions: count("heuristic") + count("learned") + count("fallback"),
            fallback_decisions: count("fallback"),
            fallback: s.fallback,
            reloads: s.reloads,
            rejected_reloads: s.rejected_reloads,
            last_error: s.last_error,
        }
    }
}

#[cfg(test)]
mod tests {
    use tokio_stream::StreamExt;

    use super::*;
    use crate::service::config::ServiceConfig;
    use crate::service::core::EVENT_BUFFER;
    use crate::service::testkit::TestCore;

    /// A job watcher that reads nothing while more events than the buffers hold go out
    /// is cut off with RESOURCE_EXHAUSTED, and counted.
    #[tokio::test]
    async fn a_watcher_that_falls_behind_is_cut_off_and_counted() {
        let (core, _dir) = TestCore::new(ServiceConfig::default()).shared();
        let (_stop, shutdown) = tokio::sync::watch::channel(false);
        let api = Api {
            core: core.clone(),
            shutdown,
        };
        let rx = core.events.subscribe();
        let mut stream = api.forward("jobs", vec![], JobEvents { rx, ids: vec![] });
        let sent = EVENT_BUFFER as u64 + 2048;
        for job_id in 0..sent {
            let _ = core.events.send(Arc::new(pb::JobEvent {
                job_id,
                ..Default::default()
            }));
        }
        let mut items = 0;
        let last = loop {
            match stream.next().await {
                Some(Ok(_)) => items += 1,
                Some(Err(status)) => break status,
                None => panic!("the stream ended without a status after {items} events"),
            }
        };
        assert_eq!(last.code(), tonic::Code::ResourceExhausted, "{last:?}");
        assert!(items < sent, "{items}");
        let cut = |watch| {
            core.metrics
                .watchers_cut_off
                .get_or_create(&vec![("watch", watch)])
                .get()
        };
        assert_eq!(cut("jobs"), 1);
        assert_eq!(cut("assignments"), 0);
    }
}
