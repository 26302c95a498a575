//! The runtime: reflectors feed one level-triggered loop that, while this replica holds the
//! Lease, builds the snapshot, decides, acts, records events and publishes the status. Nothing
//! the loop waits on delays `/healthz`, `/readyz` or shutdown: the HTTP server runs on its own.

use crate::act;
use crate::error::ControllerError;
use crate::metrics::Metrics;
use crate::snapshot::{self, Objects};
use crate::status::{self, Status};
use futures::StreamExt;
use gpuops_autoscale::{Decision, Event as AEvent, State, Target};
use k8s_openapi::api::core::v1::{ConfigMap, Node, ObjectReference, Pod};
use k8s_openapi::api::policy::v1::PodDisruptionBudget;
use kube::api::{Api, DynamicObject, Patch, PatchParams};
use kube::runtime::events::{Event, EventType, Recorder, Reporter};
use kube::runtime::reflector::{self, Store};
use kube::runtime::{WatchStreamExt, watcher};
use serde_json::Value;
use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::{Duration, SystemTime, UNIX_EPOCH};
use tokio::sync::{Notify, watch};

/// How the controller runs.
#[derive(Debug, Clone)]
pub struct ControllerConfig {
    pub client: gpuops_kube::ClientOptions,
    /// Where the status ConfigMap (and by default the Lease) lives.
    pub namespace: String,
    /// This replica's name (the pod name), for the Lease and the status.
    pub identity: String,
    /// `None`: no leader election (one replica only).
    pub lease: Option<gpuops_kube::LeaseOptions>,
    /// A decision also runs this often without any change.
    pub resync: Duration,
    pub decision: gpuops_autoscale::Config,
    /// `/metrics`, `/healthz`, `/readyz`.
    pub metrics_address: SocketAddr,
    /// Decide and publish the status, change nothing.
    pub dry_run: bool,
    /// Prometheus base URL for measured GPU utilization (`None`: only the pod-based rule).
    pub prometheus_url: Option<String>,
    /// The MIG demand reconciler (`None`: off, MIG pods are left to the node-pool decision).
    pub mig: Option<crate::mig::MigOptions>,
}

fn now_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
}

/// Starts a reflector for `api` that wakes `notify` on every change.
fn reflect<K>(api: Api<K>, notify: Arc<Notify>) -> Store<K>
where
    K: kube::Resource
        + Clone
        + std::fmt::Debug
        + serde::de::DeserializeOwned
        + Send
        + Sync
        + 'static,
    K::DynamicType: Default + Eq + std::hash::Hash + Clone + Send + Sync,
{
    let (store, writer) = reflector::store();
    let stream = reflector::reflector(
        writer,
        watcher(api, watcher::Config::default()).default_backoff(),
    )
    .touched_objects();
    tokio::spawn(async move {
        stream
            .for_each(|event| {
                if let Err(e) = event {
                    tracing::warn!(error = %e, "watch failed; retrying with backoff");
                }
                notify.notify_one();
                futures::future::ready(())
            })
            .await;
    });
    store
}

fn reflect_dynamic(
    api: Api<DynamicObject>,
    ar: kube::api::ApiResource,
    notify: Arc<Notify>,
) -> Store<DynamicObject> {
    let writer = reflector::store::Writer::new(ar);
    let store = writer.as_reader();
    let stream = reflector::reflector(
        writer,
        watcher(api, watcher::Config::default()).default_backoff(),
    )
    .touched_objects();
    tokio::spawn(async move {
        stream
            .for_each(|event| {
                if let Err(e) = event {
                    tracing::warn!(error = %e, "watch of Cluster API objects failed; retrying with backoff");
                }
                notify.notify_one();
                futures::future::ready(())
            })
            .await;
    });
    store
}

struct Ctx {
    client: kube::Client,
    cfg: ControllerConfig,
    recorder: Recorder,
    metrics: Arc<Metrics>,
    nodes: Store<Node>,
    pods: Store<Pod>,
    pdbs: Store<PodDisruptionBudget>,
    mds: Store<DynamicObject>,
    machines: Store<DynamicObject>,
    gpu_util: Option<Arc<crate::prom::Feed>>,
    mig: Option<crate::mig::Mig>,
}

/// Runs until `shutdown` turns true.
///
/// # Errors
/// When the client cannot be built or the metrics address cannot be bound; failures while
/// running are retried.
pub async fn run(
    cfg: ControllerConfig,
    mut shutdown: watch::Receiver<bool>,
) -> Result<(), ControllerError> {
    let client = cfg.client.client().await?;
    let metrics = Arc::new(Metrics::default());
    let probes = gpuops_serve::Probes::new();
    let listener = gpuops_serve::bind(cfg.metrics_address, "metrics", "--metrics-address")?;
    {
        let metrics = metrics.clone();
        let probes = probes.clone();
        let shutdown = shutdown.clone();
        tokio::spawn(async move {
            let result = gpuops_serve::serve(
                listener,
                probes,
                gpuops_serve::Options::default(),
                move |req| {
                    let metrics = metrics.clone();
                    async move {
                        if req.uri().path() == "/metrics" {
                            gpuops_serve::reply(
                                http_ok(),
                                "text/plain; version=0.0.4",
                                metrics.render(),
                            )
                        } else {
                            gpuops_serve::reply(http_not_found(), "text/plain", "not found\n")
                        }
                    }
                },
                shutdown,
            )
            .await;
            if let Err(e) = result {
                tracing::error!(error = %e, "metrics server stopped");
            }
        });
    }

    let gpu_util = match &cfg.prometheus_url {
        Some(url) => {
            let feed = Arc::new(crate::prom::Feed::default());
            crate::prom::spawn(
                url.clone(),
                cfg.decision.scale_down_idle,
                feed.clone(),
                shutdown.clone(),
            )?;
            Some(feed)
        }
        None => None,
    };
    let notify = Arc::new(Notify::new());
    let md_ar = act::capi("MachineDeployment");
    let machine_ar = act::capi("Machine");
    let ctx = Ctx {
        recorder: Recorder::new(
            client.clone(),
            Reporter {
                controller: act::MANAGER.into(),
                instance: Some(cfg.identity.clone()),
            },
        ),
        nodes: reflect(Api::<Node>::all(client.clone()), notify.clone()),
        pods: reflect(Api::<Pod>::all(client.clone()), notify.clone()),
        pdbs: reflect(
            Api::<PodDisruptionBudget>::all(client.clone()),
            notify.clone(),
        ),
        mds: reflect_dynamic(Api::all_with(client.clone(), &md_ar), md_ar, notify.clone()),
        machines: reflect_dynamic(
            Api::all_with(client.clone(), &machine_ar),
            machine_ar,
            notify.clone(),
        ),
        client: client.clone(),
        metrics: metrics.clone(),
        cfg: cfg.clone(),
        gpu_util,
        mig: cfg.mig.clone().map(crate::mig::Mig::new),
    };

    // Ready once every cache has its first list; a missing CRD keeps the controller unready
    // (and says so in the log) instead of deciding on half a picture.
    {
        let (n, p, b, d, m) = (
            ctx.nodes.clone(),
            ctx.pods.clone(),
            ctx.pdbs.clone(),
            ctx.mds.clone(),
            ctx.machines.clone(),
        );
        let probes = probes.clone();
        tokio::spawn(async move {
            let ok = n.wait_until_ready().await.is_ok()
                && p.wait_until_ready().await.is_ok()
                && b.wait_until_ready().await.is_ok()
                && d.wait_until_ready().await.is_ok()
                && m.wait_until_ready().await.is_ok();
            probes.set_ready(ok);
        });
    }

    let mut leader = match &cfg.lease {
        Some(lease) => gpuops_kube::elect(client.clone(), lease).await?,
        None => watch::channel(true).1,
    };
    let mut state = State::default();
    let mut previous: Option<Status> = None;
    let mut backoff = Duration::ZERO;
    loop {
        let wait = if backoff.is_zero() {
            cfg.resync
        } else {
            backoff.min(cfg.resync)
        };
        tokio::select! {
            _ = shutdown.wait_for(|s| *s) => break,
            _ = notify.notified() => {}
            _ = tokio::time::sleep(wait) => {}
            _ = leader.changed() => {}
        }
        let is_leader = *leader.borrow();
        metrics
            .is_leader
            .store(u64::from(is_leader), Ordering::Relaxed);
        if !is_leader || !probes.is_ready() {
            continue;
        }
        match pass(&ctx, &mut state, previous.as_ref()).await {
            Ok(s) => {
                previous = Some(s);
                backoff = Duration::ZERO;
            }
            Err(e) => {
                metrics.action_errors.fetch_add(1, Ordering::Relaxed);
                // Exponential with jitter from the clock's sub-second digits: replicas and
                // pools that fail together do not retry in lock-step.
                let jitter = 0.8
                    + 0.4
                        * f64::from(
                            SystemTime::now()
                                .duration_since(UNIX_EPOCH)
                                .map_or(0, |d| d.subsec_millis()),
                        )
                        / 1000.0;
                backoff = (backoff.max(Duration::from_millis(500)) * 2)
                    .min(Duration::from_secs(60))
                    .mul_f64(jitter);
                tracing::warn!(error = %e, retry_in = ?backoff, "autoscaler pass failed");
            }
        }
    }
    probes.set_ready(false);
    Ok(())
}

fn http_ok() -> http::StatusCode {
    http::StatusCode::OK
}

fn http_not_found() -> http::StatusCode {
    http::StatusCode::NOT_FOUND
}

fn values(store: &Store<DynamicObject>) -> Vec<Value> {
    store
        .state()
        .iter()
        .filter_map(|o| serde_json::to_value(o.as_ref()).ok())
        .collect()
}

async fn pass(
    ctx: &Ctx,
    state: &mut State,
    previous: Option<&Status>,
) -> Result<Status, ControllerError> {
    let now = now_ms();
    let mds = values(&ctx.mds);
    let machines = values(&ctx.machines);
    let nodes: Vec<Node> = ctx.nodes.state().iter().map(|n| (**n).clone()).collect();
    let pods: Vec<Pod> = ctx.pods.state().iter().map(|p| (**p).clone()).collect();
    let pdbs: Vec<PodDisruptionBudget> = ctx.pdbs.state().iter().map(|p| (**p).clone()).collect();
    let util = match &ctx.gpu_util {
        Some(feed) => {
            let now = std::time::Instant::now();
            let age = feed.age(now).map_or(-1.0, |a| a.as_secs_f64());
            if let Ok(mut a) = ctx.metrics.gpu_util_age.lock() {
                *a = Some(age);
            }
            feed.fresh(now, crate::prom::STALE_AFTER)
        }
        None => HashMap::new(),
    };
    let (mut snap, errors) = snapshot::build(
        &Objects {
            machine_deployments: &mds,
            machines: &machines,
            nodes: &nodes,
            pods: &pods,
            pdbs: &pdbs,
            gpu_util: &util,
        },
        now,
    );
    let mut mig = match &ctx.mig {
        Some(m) => {
            let (client, ns) = (&ctx.client, &ctx.cfg.namespace);
            Some(
                m.pass(client, ns, &nodes, &mut snap, now, ctx.cfg.dry_run)
                    .await,
            )
        }
        None => None,
    };
    let started = std::time::Instant::now();
    let d = gpuops_autoscale::decide(&snap, state, now, &ctx.cfg.decision);
    let us = u64::try_from(started.elapsed().as_micros()).unwrap_or(u64::MAX);
    let m = &ctx.metrics;
    m.decisions.fetch_add(1, Ordering::Relaxed);
    m.decision_us_last.store(us, Ordering::Relaxed);
    m.decision_us_sum.fetch_add(us, Ordering::Relaxed);
    m.pool_errors.store(errors.len() as u64, Ordering::Relaxed);
    m.pending_pods
        .store(snap.pending.len() as u64, Ordering::Relaxed);
    if let Ok(mut f) = m.in_flight.lock() {
        *f = d
            .in_flight
            .iter()
            .map(|x| {
                (
                    x.pool.clone(),
                    x.stage.map_or("requested", |s| s.as_str()).to_string(),
                    x.count,
                )
            })
            .collect();
    }
    let error_texts: Vec<String> = errors.iter().map(ToString::to_string).collect();
    for e in &errors {
        tracing::warn!(error = %e, "pool skipped");
    }
    let by_name: HashMap<String, &Value> = mds
        .iter()
        .map(|v| (gpuops_autoscale::pool::pool_name(v), v))
        .collect();
    let mut first_error = None;
    if !ctx.cfg.dry_run {
        apply(ctx, &d, &by_name, &mut first_error).await;
    }
    if let Some(mp) = &mut mig {
        let extra = Decision {
            scale_ups: std::mem::take(&mut mp.scale_ups),
            ..Decision::default()
        };
        if !ctx.cfg.dry_run {
            apply(ctx, &extra, &by_name, &mut first_error).await;
        }
        for e in &mp.events {
            if let Err(err) = record(ctx, e, &by_name).await {
                tracing::debug!(error = %err, "event not recorded");
            }
        }
        if let Some(e) = mp.error.take() {
            tracing::warn!(error = %e, "MIG action failed; retried next pass");
            first_error.get_or_insert(e);
        }
    }
    for e in &d.events {
        if let Err(err) = record(ctx, e, &by_name).await {
            tracing::debug!(error = %err, "event not recorded");
        }
    }
    for e in &errors {
        let ev = AEvent {
            target: Target::Pool(e.pool().to_string()),
            reason: "InvalidPool".into(),
            message: e.to_string(),
            warning: true,
        };
        let _ = record(ctx, &ev, &by_name).await;
    }
    let mut st = status::build(&snap, &error_texts, &d, now, &ctx.cfg.identity, previous);
    if let Some(mp) = &mig {
        status::add_mig(&mut st, mp);
    }
    write_status(ctx, &st).await?;
    match first_error {
        Some(e) => Err(e),
        None => Ok(st),
    }
}

async fn apply(
    ctx: &Ctx,
    d: &Decision,
    mds: &HashMap<String, &Value>,
    first_error: &mut Option<ControllerError>,
) {
    let m = &ctx.metrics;
    let mut keep = |r: Result<(), ControllerError>| {
        if let Err(e) = r {
            m.action_errors.fetch_add(1, Ordering::Relaxed);
            tracing::warn!(error = %e, "action failed; retried next pass");
            first_error.get_or_insert(e);
        }
    };
    for su in &d.scale_ups {
        let Some(md) = mds.get(&su.pool) else {
            continue;
        };
        let r = act::scale_up(&ctx.client, su, md).await;
        if r.is_ok() {
            m.scale_ups.fetch_add(1, Ordering::Relaxed);
            m.nodes_bought
                .fetch_add(u64::from(su.to - su.from), Ordering::Relaxed);
            tracing::info!(pool = %su.pool, from = su.from, to = su.to, "{}", su.message);
        }
        keep(r);
    }
    for t in &d.timed_out {
        let Some(md) = mds.get(&t.pool) else { continue };
        let r = act::time_out(&ctx.client, t, md).await;
        if r.is_ok() {
            m.timed_out.fetch_add(1, Ordering::Relaxed);
        }
        keep(r);
    }
    for r in &d.removals {
        let Some(md) = mds.get(&r.pool) else { continue };
        match act::remove_node(&ctx.client, r, &r.evict, md).await {
            Ok(act::Drain::Removed) => {
                m.removals.fetch_add(1, Ordering::Relaxed);
            }
            Ok(act::Drain::InProgress) => {}
            Err(e) => keep(Err(e)),
        }
    }
}

async fn record(ctx: &Ctx, e: &AEvent, mds: &HashMap<String, &Value>) -> Result<(), kube::Error> {
    let split = |k: &str| {
        let (ns, n) = k.split_once('/').unwrap_or(("default", k));
        (ns.to_string(), n.to_string())
    };
    let reference = match &e.target {
        Target::Pod(k) => {
            let (ns, n) = split(k);
            ObjectReference {
                api_version: Some("v1".into()),
                kind: Some("Pod".into()),
                namespace: Some(ns),
                name: Some(n),
                ..ObjectReference::default()
            }
        }
        Target::Pool(k) => {
            let (ns, n) = split(k);
            ObjectReference {
                api_version: Some(format!("{}/{}", act::CAPI_GROUP, act::CAPI_VERSION)),
                kind: Some("MachineDeployment".into()),
                namespace: Some(ns),
                name: Some(n),
                uid: mds
                    .get(k)
                    .and_then(|v| v["metadata"]["uid"].as_str())
                    .map(str::to_string),
                ..ObjectReference::default()
            }
        }
        Target::Node(n) => ObjectReference {
            api_version: Some("v1".into()),
            kind: Some("Node".into()),
            name: Some(n.clone()),
            namespace: Some("default".into()),
            ..ObjectReference::default()
        },
    };
    let event = Event {
        type_: if e.warning {
            EventType::Warning
        } else {
            EventType::Normal
        },
        reason: e.reason.clone(),
        note: Some(e.message.chars().take(1000).collect()),
        action: "Autoscale".into(),
        secondary: None,
    };
    ctx.recorder.publish(&event, &reference).await
}

async fn write_status(ctx: &Ctx, st: &Status) -> Result<(), ControllerError> {
    let text = serde_json::to_string_pretty(st).map_err(|e| ControllerError::Status {
        name: status::CONFIGMAP.into(),
        message: e.to_string(),
    })?;
    let cm = serde_json::json!({
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {"name": status::CONFIGMAP, "namespace": ctx.cfg.namespace},
        "data": {status::KEY: text},
    });
    let api: Api<ConfigMap> = Api::namespaced(ctx.client.clone(), &ctx.cfg.namespace);
    api.patch(
        status::CONFIGMAP,
        &PatchParams::apply(act::MANAGER).force(),
        &Patch::Apply(&cm),
    )
    .await
    .map_err(|source| ControllerError::Api {
        what: format!(
            "writing ConfigMap {}/{}",
            ctx.cfg.namespace,
            status::CONFIGMAP
        ),
        source,
    })?;
    Ok(())
}

/// Reads the status the controller published.
///
/// # Errors
/// When the ConfigMap cannot be read or does not hold a status.
pub async fn read_status(
    client: &kube::Client,
    namespace: &str,
) -> Result<Status, ControllerError> {
    let api: Api<ConfigMap> = Api::namespaced(client.clone(), namespace);
    let cm = api
        .get(status::CONFIGMAP)
        .await
        .map_err(|source| ControllerError::Api {
            what: format!("reading ConfigMap {namespace}/{}", status::CONFIGMAP),
            source,
        })?;
    let text = cm
        .data
        .as_ref()
        .and_then(|d| d.get(status::KEY))
        .ok_or_else(|| ControllerError::Status {
            name: format!("{namespace}/{}", status::CONFIGMAP),
            message: format!("has no key {}", status::KEY),
        })?;
    serde_json::from_str(text).map_err(|e| ControllerError::Status {
        name: format!("{namespace}/{}", status::CONFIGMAP),
        message: format!("key {}: {e}", status::KEY),
    })
}
