//! The DRA service, once for both API versions: per-claim answers, idempotence, and
//! cancellation at shutdown; thin adapters turn it into the v1 and v1beta1 gRPC services.

use crate::error::DraPluginError;
use crate::locks::ClaimLocks;
use crate::preparer::{Claim, ClaimPreparer, PreparedDevice};
use gpuops_kubelet_api::dra::{v1, v1beta1};
use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::future::Future;
use std::sync::{Arc, Mutex, PoisonError};
use tokio::sync::watch;
use tonic::{Request, Response, Status};

/// Per claim UID: its devices or why it failed (sent to the kubelet as the answer's text).
type Answers<T> = BTreeMap<String, Result<T, DraPluginError>>;

/// The version-independent DRA service over a [`ClaimPreparer`].
pub struct DraService<P> {
    preparer: Arc<P>,
    /// Claims prepared by this process and not unprepared since, with the devices answered.
    prepared: Mutex<HashMap<String, Vec<PreparedDevice>>>,
    locks: ClaimLocks,
    /// Turns true when shutdown gives up waiting: in-flight calls end with UNAVAILABLE.
    cancel: watch::Receiver<bool>,
}

impl<P: ClaimPreparer> DraService<P> {
    /// A service whose calls are cancelled once `cancel` turns true.
    pub fn new(preparer: Arc<P>, cancel: watch::Receiver<bool>) -> DraService<P> {
        DraService {
            preparer,
            prepared: Mutex::default(),
            locks: ClaimLocks::default(),
            cancel,
        }
    }

    /// Prepares `claims`: those prepared before are answered from memory, the rest go to the
    /// preparer in one call.
    pub async fn prepare(
        &self,
        claims: Vec<Claim>,
    ) -> Result<Answers<Vec<PreparedDevice>>, Status> {
        self.cancellable(async {
            let (mut answers, claims) = identified(claims);
            let uids: BTreeSet<String> = claims.iter().map(|c| c.uid.clone()).collect();
            let _guards = self.locks.lock(&uids).await;
            let mut todo = Vec::new();
            {
                let prepared = self.prepared.lock().unwrap_or_else(PoisonError::into_inner);
                for claim in claims {
                    match prepared.get(&claim.uid) {
                        Some(devices) => {
                            tracing::debug!(claim = %claim, "already prepared: same devices");
                            answers.insert(claim.uid, Ok(devices.clone()));
                        }
                        None => todo.push(claim),
                    }
                }
            }
            if todo.is_empty() {
                return answers;
            }
            let mut got = self.preparer.prepare(todo.clone()).await;
            let mut prepared = self.prepared.lock().unwrap_or_else(PoisonError::into_inner);
            for claim in todo {
                let answer = match got.remove(&claim.uid) {
                    Some(Ok(devices)) => {
                        tracing::info!(claim = %claim, devices = devices.len(), "prepared");
                        prepared.insert(claim.uid.clone(), devices.clone());
                        Ok(devices)
                    }
                    Some(Err(e)) => {
                        tracing::warn!(claim = %claim, "prepare failed: {e}");
                        Err(DraPluginError::ClaimFailed(e.to_string()))
                    }
                    None => Err(DraPluginError::NoAnswer(claim.to_string())),
                };
                answers.insert(claim.uid, answer);
            }
            answers
        })
        .await
    }

    /// Unprepares `claims`, every one through the preparer: only it knows, from its
    /// checkpoint, what a claim prepared before a restart or half-prepared at a crash holds.
    pub async fn unprepare(&self, claims: Vec<Claim>) -> Result<Answers<()>, Status> {
        self.cancellable(async {
            let (mut answers, claims) = identified(claims);
            if claims.is_empty() {
                return answers;
            }
            let uids: BTreeSet<String> = claims.iter().map(|c| c.uid.clone()).collect();
            let _guards = self.locks.lock(&uids).await;
            let mut got = self.preparer.unprepare(claims.clone()).await;
            let mut prepared = self.prepared.lock().unwrap_or_else(PoisonError::into_inner);
            for claim in claims {
                let answer = match got.remove(&claim.uid) {
                    Some(Ok(())) => {
                        tracing::info!(claim = %claim, "unprepared");
                        prepared.remove(&claim.uid);
                        Ok(())
                    }
                    Some(Err(e)) => {
                        tracing::warn!(claim = %claim, "unprepare failed: {e}");
                        Err(DraPluginError::ClaimFailed(e.to_string()))
                    }
                    None => Err(DraPluginError::NoAnswer(claim.to_string())),
                };
                answers.insert(claim.uid, answer);
            }
            answers
        })
        .await
    }

    async fn cancellable<T>(&self, work: impl Future<Output = T>) -> Result<T, Status> {
        let mut cancel = self.cancel.clone();
        tokio::select! {
            done = work => Ok(done),
            () = cancelled(&mut cancel) => {
                Err(Status::unavailable("the DRA plugin is shutting down; call again"))
            }
        }
    }
}

/// Resolves once `cancel` is true; never if its sender is gone without setting it.
async fn cancelled(cancel: &mut watch::Receiver<bool>) {
    if cancel.wait_for(|c| *c).await.is_err() {
        std::future::pending::<()>().await;
    }
}

/// Splits off claims the driver cannot act on (no UID) with their answers, and folds claims
/// repeated in one request into one.
fn identified<T>(claims: Vec<Claim>) -> (Answers<T>, Vec<Claim>) {
    let mut answers = Answers::new();
    let mut seen = BTreeSet::new();
    let mut rest = Vec::new();
    for claim in claims {
        if claim.uid.is_empty() {
            answers.insert(
                String::new(),
                Err(DraPluginError::NoUid {
                    namespace: claim.namespace,
                    name: claim.name,
                }),
            );
        } else if seen.insert(claim.uid.clone()) {
            rest.push(claim);
        }
    }
    (answers, rest)
}

/// The v1 gRPC service (`k8s.io.kubelet.pkg.apis.dra.v1.DRAPlugin`).
pub(crate) struct DraV1<P>(pub(crate) Arc<DraService<P>>);

/// The v1beta1 gRPC service, for 1.34 kubelets.
pub(crate) struct DraV1beta1<P>(pub(crate) Arc<DraService<P>>);

#[tonic::async_trait]
impl<P: ClaimPreparer> v1::dra_plugin_server::DraPlugin for DraV1<P> {
    async fn node_prepare_resources(
        &self,
        request: Request<v1::NodePrepareResourcesRequest>,
    ) -> Result<Response<v1::NodePrepareResourcesResponse>, Status> {
        let claims = request.into_inner().claims.into_iter().map(from_v1);
        let answers = self.0.prepare(claims.collect()).await?;
        let claims = answers
            .into_iter()
            .map(|(uid, answer)| {
                let answer = match answer {
                    Ok(devices) => v1::NodePrepareResourceResponse {
                        devices: devices.into_iter().map(to_v1).collect(),
                        error: String::new(),
                    },
                    Err(error) => v1::NodePrepareResourceResponse {
                        devices: Vec::new(),
                        error: error.to_string(),
                    },
                };
                (uid, answer)
            })
            .collect();
        Ok(Response::new(v1::NodePrepareResourcesResponse { claims }))
    }

    async fn node_unprepare_resources(
        &self,
        request: Request<v1::NodeUnprepareResourcesRequest>,
    ) -> Result<Response<v1::NodeUnprepareResourcesResponse>, Status> {
        let claims = request.into_inner().claims.into_iter().map(from_v1);
        let answers = self.0.unprepare(claims.collect()).await?;
        let claims = answers
            .into_iter()
            .map(|(uid, answer)| {
                let error = answer.err().map(|e| e.to_string()).unwrap_or_default();
                (uid, v1::NodeUnprepareResourceResponse { error })
            })
            .collect();
        Ok(Response::new(v1::NodeUnprepareResourcesResponse { claims }))
    }
}

#[tonic::async_trait]
impl<P: ClaimPreparer> v1beta1::dra_plugin_server::DraPlugin for DraV1beta1<P> {
    async fn node_prepare_resources(
        &self,
        request: Request<v1beta1::NodePrepareResourcesRequest>,
    ) -> Result<Response<v1beta1::NodePrepareResourcesResponse>, Status> {
        let claims = request.into_inner().claims.into_iter().map(from_v1beta1);
        let answers = self.0.prepare(claims.collect()).await?;
        let claims = answers
            .into_iter()
            .map(|(uid, answer)| {
                let answer = match answer {
                    Ok(devices) => v1beta1::NodePrepareResourceResponse {
                        devices: devices.into_iter().map(to_v1beta1).collect(),
                        error: String::new(),
                    },
                    Err(error) => v1beta1::NodePrepareResourceResponse {
                        devices: Vec::new(),
                        error: error.to_string(),
                    },
                };
                (uid, answer)
            })
            .collect();
        Ok(Response::new(v1beta1::NodePrepareResourcesResponse {
            claims,
        }))
    }

    async fn node_unprepare_resources(
        &self,
        request: Request<v1beta1::NodeUnprepareResourcesRequest>,
    ) -> Result<Response<v1beta1::NodeUnprepareResourcesResponse>, Status> {
        let claims = request.into_inner().claims.into_iter().map(from_v1beta1);
        let answers = self.0.unprepare(claims.collect()).await?;
        let claims = answers
            .into_iter()
            .map(|(uid, answer)| {
                let error = answer.err().map(|e| e.to_string()).unwrap_or_default();
                (uid, v1beta1::NodeUnprepareResourceResponse { error })
            })
            .collect();
        Ok(Response::new(v1beta1::NodeUnprepareResourcesResponse {
            claims,
        }))
    }
}

fn from_v1(c: v1::Claim) -> Claim {
    Claim {
        namespace: c.namespace,
        uid: c.uid,
        name: c.name,
    }
}

fn from_v1beta1(c: v1beta1::Claim) -> Claim {
    Claim {
        namespace: c.namespace,
        uid: c.uid,
        name: c.name,
    }
}

fn to_v1(d: PreparedDevice) -> v1::Device {
    v1::Device {
        request_names: d.request_names,
        pool_name: d.pool_name,
        device_name: d.device_name,
        cdi_device_ids: d.cdi_device_ids,
        share_id: d.share_id,
    }
}

/// v1beta1 has no share ID; kubelets that speak only v1beta1 cannot allocate shares.
fn to_v1beta1(d: PreparedDevice) -> v1beta1::Device {
    v1beta1::Device {
        request_names: d.request_names,
        pool_name: d.pool_name,
        device_name: d.device_name,
        cdi_device_ids: d.cdi_device_ids,
    }
}
