//! The runtime: reflectors feed one level-triggered loop that, while this replica holds the
//! Lease, builds the snapshot, decides, acts, records events and publishes the status. Nothing
//! the loop waits on delays `/healthz`, `/readyz` or shutdown: the HTTP server runs on its own.

use crate::act;
use crate::error::ControllerError;
use crate::metrics::Metrics;
use crate::status::{self, Status};
use futures::StreamExt;
use gpuops_autoscale::snapshot::{self, Objects};
use gpuops_autoscale::{Decision, Event as AEvent, State, Target};
use gpuops_kube::runtime::Action;
use k8s_openapi::api::core::v1::{ConfigMap, Node, ObjectReference, Pod};
use k8s_openapi::api::policy::v1::PodDisruptionBudget;
use k8s_openapi::api::resource::v1::{DeviceClass, ResourceClaim, ResourceClaimTemplate};
use kube::api::{Api, DynamicObject, Patch, PatchParams};
use kube::runtime::events::{Event, EventType, Recorder, Reporter};
use kube::runtime::reflector::{self, Store};
use kube::runtime::watcher;
use serde_json::Value;
use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Duration;
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
    /// Prometheus for measured GPU utilization (`None`: only the pod-based rule).
    pub prometheus: Option<crate::prom::Source>,
    /// The MIG demand reconciler (`None`: off, MIG pods are left to the node-pool decision).
    pub mig: Option<crate::mig::MigOptions>,
}

/// Events published at once per pass.
const EVENTS_IN_PARALLEL: usize = 16;

/// Starts the shared watch cache of `api` (see [`gpuops_kube::runtime::reflect`]), waking the
/// loop through `notify` on every change.
fn reflect<K>(
    api: Api<K>,
    dyntype: K::DynamicType,
    what: &'static str,
    notify: &Arc<Notify>,
) -> Store<K>
where
    K: kube::Resource + Clone + std::fmt::Debug + serde::de::DeserializeOwned + Send + Sync,
    K: 'static,
    K::DynamicType: Eq + std::hash::Hash + Clone + Send + Sync,
{
    let notify = Arc::clone(notify);
    gpuops_kube::runtime::reflect(api, dyntype, watcher::Config::default(), what, move || {
        notify.notify_one();
    })
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
    /// DRA objects: pending pods' claims are demand too. Not part of readiness, so a cluster
    /// without DRA still gets whole-GPU autoscaling (the watch logs its errors and retries).
    claims: Store<ResourceClaim>,
    claim_templates: Store<ResourceClaimTemplate>,
    device_classes: Store<DeviceClass>,
    gpu_util: Option<Arc<crate::prom::Feed>>,
    mig: Option<crate::mig::Mig>,
    /// Failed passes in a row, for the error policy's backoff; a pass that succeeds clears it.
    failures: AtomicU32,
}

/// What the loop keeps from one pass to the next (the context is shared and read-only).
#[derive(Default)]
struct Memory {
    state: State,
    clock: crate::clock::Clock,
    /// When each pending pod was first seen.
    seen: HashMap<String, u64>,
    previous: Option<Status>,
    /// Whether this replica has read back what the last leader published since it took the
    /// Lease: the memory of a replica that lost it is stale (a node idle then busy then idle
    /// again would go at once), and a new one's is empty.
    recalled: bool,
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
    serve_metrics(listener, probes.clone(), metrics.clone(), shutdown.clone());
    let gpu_util = match &cfg.prometheus {
        Some(source) => {
            let feed = Arc::new(crate::prom::Feed::default());
            crate::prom::spawn(
                source.clone(),
                cfg.decision.scale_down_idle,
                feed.clone(),
                shutdown.clone(),
            )?;
            Some(feed)
        }
        None => None,
    };
    let notify = Arc::new(Notify::new());
    let ctx = Arc::new(watch_all(&client, &cfg, gpu_util, &metrics, &notify));
    spawn_readiness(&ctx, &probes);

    let mut leader = match &cfg.lease {
        // Creating or reading the Lease awaits the API server, which may not answer.
        Some(lease) => {
            match gpuops_kube::runtime::until_stopped(
                gpuops_kube::elect(client.clone(), lease),
                &shutdown,
            )
            .await
            {
                Some(elected) => elected?,
                None => return Ok(()),
            }
        }
        None => watch::channel(true).1,
    };
    let mut memory = Memory::default();
    // After a failed pass nothing runs before this, whatever wakes the loop: with the apiserver
    // gone every watcher's retry is a wake-up, and passes on each would hammer it when it returns.
    let mut retry_at: Option<tokio::time::Instant> = None;
    // When the scale-up batch window closes, if pods wait for it: nothing else wakes the loop
    // then (a burst followed by silence waited a whole resync, 10 s by default, and a poll
    // every second still lost up to a second against Karpenter's batcher).
    let mut batch_closes: Option<tokio::time::Instant> = None;
    loop {
        let wait = match (retry_at, batch_closes) {
            (Some(at), _) => at.saturating_duration_since(tokio::time::Instant::now()),
            (None, Some(at)) => cfg
                .resync
                .min(at.saturating_duration_since(tokio::time::Instant::now())),
            (None, None) => cfg.resync,
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
        if !is_leader {
            memory.recalled = false;
        }
        if !is_leader || !probes.is_ready() {
            continue;
        }
        if retry_at.is_some_and(|at| tokio::time::Instant::now() < at) {
            continue;
        }
        retry_at = None;
        // A pass awaits the API server; shutdown must not wait for it. A stopped pass is
        // half-done the same way a failed one is, and the next leader's pass starts over.
        // The controller reconciles the cluster as one object: the step's object is `()`.
        let mem = &mut memory;
        let step = gpuops_kube::runtime::reconcile_step(
            Arc::new(()),
            Arc::clone(&ctx),
            move |_, ctx| reconcile(ctx, mem),
            |_, e, ctx| {
                let failures = ctx
                    .failures
                    .fetch_add(1, Ordering::Relaxed)
                    .saturating_add(1);
                error_policy(e, failures, &ctx.metrics)
            },
        );
        let Some(action) = gpuops_kube::runtime::until_stopped(step, &shutdown).await else {
            break;
        };
        let at = action
            .requeue_after()
            .map(|wait| tokio::time::Instant::now() + wait);
        if ctx.failures.load(Ordering::Relaxed) > 0 {
            retry_at = at;
        } else {
            batch_closes = at;
        }
    }
    probes.set_ready(false);
    Ok(())
}

/// The metrics endpoint and the probes, until `shutdown`.
fn serve_metrics(
    listener: gpuops_serve::Listener,
    probes: Arc<gpuops_serve::Probes>,
    metrics: Arc<Metrics>,
    shutdown: watch::Receiver<bool>,
) {
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

/// The watch caches of everything a pass reads, each waking the loop through `notify`.
fn watch_all(
    client: &kube::Client,
    cfg: &ControllerConfig,
    gpu_util: Option<Arc<crate::prom::Feed>>,
    metrics: &Arc<Metrics>,
    notify: &Arc<Notify>,
) -> Ctx {
    let md_ar = act::capi("MachineDeployment");
    let machine_ar = act::capi("Machine");
    Ctx {
        recorder: Recorder::new(
            client.clone(),
            Reporter {
                controller: act::MANAGER.into(),
                instance: Some(cfg.identity.clone()),
            },
        ),
        nodes: reflect(Api::<Node>::all(client.clone()), (), "nodes", notify),
        pods: reflect(Api::<Pod>::all(client.clone()), (), "pods", notify),
        pdbs: reflect(
            Api::<PodDisruptionBudget>::all(client.clone()),
            (),
            "PodDisruptionBudgets",
            notify,
        ),
        mds: reflect(
            Api::all_with(client.clone(), &md_ar),
            md_ar,
            "Cluster API MachineDeployments",
            notify,
        ),
        machines: reflect(
            Api::all_with(client.clone(), &machine_ar),
            machine_ar,
            "Cluster API Machines",
            notify,
        ),
        claims: reflect(
            Api::<ResourceClaim>::all(client.clone()),
            (),
            "ResourceClaims",
            notify,
        ),
        claim_templates: reflect(
            Api::<ResourceClaimTemplate>::all(client.clone()),
            (),
            "ResourceClaimTemplates",
            notify,
        ),
        device_classes: reflect(
            Api::<DeviceClass>::all(client.clone()),
            (),
            "DeviceClasses",
            notify,
        ),
        client: client.clone(),
        metrics: metrics.clone(),
        cfg: cfg.clone(),
        gpu_util,
        mig: cfg.mig.clone().map(crate::mig::Mig::new),
        failures: AtomicU32::new(0),
    }
}

/// Ready once every cache has its first list; a missing CRD keeps the controller unready
/// (and says so in the log) instead of deciding on half a picture.
fn spawn_readiness(ctx: &Ctx, probes: &Arc<gpuops_serve::Probes>) {
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

/// The wait before retrying a failed pass: 1 s, doubling to 30 s, each up to a fifth longer at
/// random, so that replicas and pools that fail together do not retry in lock-step.
const PASS_BACKOFF: gpuops_backoff::Policy =
    gpuops_backoff::Policy::new(Duration::from_secs(1), Duration::from_secs(30)).jitter(0.2);

/// What a failed pass does, the `failures`-th in a row: counted in `action_errors`, logged, and
/// retried after [`PASS_BACKOFF`]'s wait for that many failures.
fn error_policy(e: &ControllerError, failures: u32, metrics: &Metrics) -> Action {
    metrics.action_errors.fetch_add(1, Ordering::Relaxed);
    let action = gpuops_kube::runtime::backoff_action(&PASS_BACKOFF, failures);
    tracing::warn!(error = %e, failures, retry_in = ?action.requeue_after(), "autoscaler pass failed");
    action
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

/// How long after the batch window's computed close the next pass runs, so it sees it closed.
const BATCH_CLOSE_MARGIN_MS: u64 = 5;

/// One pass, in the shared loop shape: what runs next is a pass at the close of the scale-up
/// batch window, if pods wait for it, else one on the next change or resync.
async fn reconcile(ctx: Arc<Ctx>, memory: &mut Memory) -> Result<Action, ControllerError> {
    if !memory.recalled {
        recall(&ctx, memory).await?;
    }
    let (status, closes_in) = pass(
        &ctx,
        &mut memory.state,
        &mut memory.clock,
        &mut memory.seen,
        memory.previous.as_ref(),
    )
    .await?;
    memory.previous = Some(status);
    ctx.failures.store(0, Ordering::Relaxed);
    Ok(after_pass(closes_in))
}

/// Takes up the memory the last leader published with its status (see
/// [`gpuops_autoscale::memory`]): the decision's, the MIG reconciler's, the decision history.
/// No status yet, or one that does not parse, starts empty; one that cannot be read fails the
/// pass, retried: deciding without it and publishing would overwrite it.
async fn recall(ctx: &Ctx, memory: &mut Memory) -> Result<(), ControllerError> {
    let api: Api<ConfigMap> = Api::namespaced(ctx.client.clone(), &ctx.cfg.namespace);
    let cm = api
        .get_opt(status::CONFIGMAP)
        .await
        .map_err(|source| ControllerError::Api {
            what: format!(
                "reading ConfigMap {}/{} for the last leader's memory",
                ctx.cfg.namespace,
                status::CONFIGMAP
            ),
            source,
        })?;
    let text = cm.as_ref().and_then(|c| c.data.as_ref()?.get(status::KEY));
    let previous: Option<Status> = match text.map(|t| serde_json::from_str(t)) {
        None => None,
        Some(Ok(s)) => Some(s),
        Some(Err(e)) => {
            tracing::warn!(
                error = %e,
                "the status ConfigMap does not parse: starting with no memory"
            );
            None
        }
    };
    let (remembered, pending) = previous.as_ref().map_or_else(Default::default, |s| {
        (s.memory.clone().unwrap_or_default(), s.pending.as_slice())
    });
    let r = remembered.restore(gpuops_autoscale::status::explained(pending));
    tracing::info!(
        unneeded = r.state.unneeded_since.len(),
        backed_off = r.state.backoff.len(),
        sightings = r.seen.len(),
        from = previous.as_ref().map_or("", |s| s.leader.as_str()),
        "took up the last leader's memory"
    );
    memory.state = r.state;
    memory.seen = r.seen;
    if let Some(m) = &ctx.mig {
        m.restore(r.mig);
    }
    memory.previous = previous;
    memory.recalled = true;
    Ok(())
}

/// The action after a pass that succeeded, `closes_in` being how long until the scale-up batch
/// window closes (`None`: no pod waits for one). A few milliseconds past the close: the window
/// is open while strictly younger.
fn after_pass(closes_in: Option<Duration>) -> Action {
    match closes_in {
        Some(d) => Action::requeue(d + Duration::from_millis(BATCH_CLOSE_MARGIN_MS)),
        None => Action::await_change(),
    }
}

// Long on purpose: observe (caches, clock, utilisation), decide and act for one pass, in the
// order the status reports them; each step is a call, the length is their wiring.
async fn pass(
    ctx: &Ctx,
    state: &mut State,
    clock: &mut crate::clock::Clock,
    seen: &mut HashMap<String, u64>,
    previous: Option<&Status>,
) -> Result<(Status, Option<Duration>), ControllerError> {
    let (now, jumped) = clock.read();
    if let Some(delta_ms) = jumped {
        state.shift(delta_ms);
        if let Some(m) = &ctx.mig {
            m.shift(delta_ms);
        }
        tracing::warn!(
            delta_ms,
            "the wall clock jumped: idle timers and back-offs keep the time they had left"
        );
    }
    let mds = values(&ctx.mds);
    let machines = values(&ctx.machines);
    // The caches' own objects: with 10,000 pods a copy per pass doubled the memory.
    let nodes: Vec<Arc<Node>> = ctx.nodes.state();
    let pods: Vec<Arc<Pod>> = ctx.pods.state();
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
    gpuops_autoscale::memory::first_seen(&mut snap.pending, seen, now);
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
    let mut d = gpuops_autoscale::decide(&snap, state, now, &ctx.cfg.decision);
    let claim_events = claim_demand(ctx, &pods, &snap, &mut d);
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
        if let Some(e) = mp.error.take() {
            tracing::warn!(error = %e, "MIG action failed; retried next pass");
            first_error.get_or_insert(e);
        }
    }
    let invalid: Vec<AEvent> = errors
        .iter()
        .map(|e| AEvent {
            target: Target::Pool(e.pool().unwrap_or_default().to_string()),
            reason: "InvalidPool".into(),
            message: e.to_string(),
            warning: true,
        })
        .collect();
    // Several at a time: 10,000 new pending pods are 10,000 events, one by one most of a
    // minute before the status is written.
    let mig_events: &[AEvent] = mig.as_ref().map_or(&[], |mp| mp.events.as_slice());
    futures::stream::iter(
        d.events
            .iter()
            .chain(&invalid)
            .chain(mig_events)
            .chain(&claim_events),
    )
    .for_each_concurrent(EVENTS_IN_PARALLEL, |e| {
        let by_name = &by_name;
        async move {
            if let Err(err) = record(ctx, e, by_name).await {
                tracing::debug!(error = %err, "event not recorded");
            }
        }
    })
    .await;
    let mut st = status::build(&snap, &error_texts, &d, now, &ctx.cfg.identity, previous);
    if let Some(mp) = &mig {
        status::add_mig(&mut st, &mp.decision, &mp.status, &mp.owed);
    }
    let mig_memory = ctx.mig.as_ref().map(crate::mig::Mig::memory);
    st.memory = Some(gpuops_autoscale::memory::Remembered::of(
        state,
        seen,
        mig_memory.as_ref(),
    ));
    write_status(ctx, &st).await?;
    match first_error {
        Some(e) => Err(e),
        None => Ok((st, d.batch_closes_in)),
    }
}

/// Whether the scheduler has tried `p` and found no node: only then are its unallocated
/// claims demand (a pod it has not looked at yet may fit a node that exists).
fn unschedulable(p: &Pod) -> bool {
    p.spec.as_ref().is_some_and(|s| s.node_name.is_none())
        && p.metadata.deletion_timestamp.is_none()
        && p.status.as_ref().is_some_and(|s| {
            s.conditions.iter().flatten().any(|c| {
                c.type_ == "PodScheduled"
                    && c.status == "False"
                    && c.reason.as_deref() == Some("Unschedulable")
            })
        })
}

/// Pending pods' unallocated ResourceClaims as demand: their scale-ups join the decision's
/// (one patch per pool), and what is bought or refused for each pod comes back as events.
fn claim_demand(
    ctx: &Ctx,
    pods: &[Arc<Pod>],
    snap: &gpuops_autoscale::model::Snapshot,
    d: &mut Decision,
) -> Vec<AEvent> {
    let with_claims: Vec<&Pod> = pods
        .iter()
        .map(AsRef::as_ref)
        .filter(|p| {
            p.spec
                .as_ref()
                .is_some_and(|s| s.resource_claims.as_ref().is_some_and(|c| !c.is_empty()))
                && unschedulable(p)
        })
        .collect();
    if with_claims.is_empty() {
        return Vec::new();
    }
    let by_name = |objs: Vec<Arc<ResourceClaim>>| -> gpuops_claims::k8s::ByName<ResourceClaim> {
        objs.iter()
            .map(|c| {
                (
                    (
                        c.metadata.namespace.clone().unwrap_or_default(),
                        c.metadata.name.clone().unwrap_or_default(),
                    ),
                    (**c).clone(),
                )
            })
            .collect()
    };
    let claims = by_name(ctx.claims.state());
    let templates: gpuops_claims::k8s::ByName<ResourceClaimTemplate> = ctx
        .claim_templates
        .state()
        .iter()
        .map(|t| {
            (
                (
                    t.metadata.namespace.clone().unwrap_or_default(),
                    t.metadata.name.clone().unwrap_or_default(),
                ),
                (**t).clone(),
            )
        })
        .collect();
    let classes: Vec<DeviceClass> = ctx
        .device_classes
        .state()
        .iter()
        .map(|c| (**c).clone())
        .collect();
    let classes = gpuops_claims::k8s::classes(&classes);
    let mut demand = Vec::new();
    let mut events = Vec::new();
    for p in with_claims {
        let key = format!(
            "{}/{}",
            p.metadata.namespace.as_deref().unwrap_or_default(),
            p.metadata.name.as_deref().unwrap_or_default()
        );
        match gpuops_claims::k8s::pending_claims(p, &claims, &templates) {
            Ok(c) if c.is_empty() => {}
            Ok(c) => demand.push(gpuops_claims::PodClaims {
                pod: key,
                claims: c,
            }),
            Err(e) => events.push(AEvent {
                target: Target::Pod(key),
                reason: "NotTriggerScaleUp".into(),
                message: e.to_string(),
                warning: true,
            }),
        }
    }
    let allocated = gpuops_claims::k8s::allocated_devices(&claims);
    let cd = gpuops_claims::demand::decide(
        snap,
        &d.in_flight,
        &d.scale_ups,
        &demand,
        &classes,
        &allocated,
    );
    for (pod, outcome) in &cd.plan.outcomes {
        tracing::debug!(pod, ?outcome, "ResourceClaim demand");
    }
    gpuops_claims::demand::merge(&mut d.scale_ups, cd.scale_ups);
    events.extend(cd.events);
    events
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
    // All pools at once: each is its own MachineDeployment, and a mixed burst that buys from
    // three pools waited for three round trips one after the other (bench-autoscale (c)).
    let scaled = futures::future::join_all(d.scale_ups.iter().filter_map(|su| {
        let md = mds.get(&su.pool)?;
        Some(async move { (su, act::scale_up(&ctx.client, su, md).await) })
    }))
    .await;
    for (su, r) in scaled {
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
    let uid = match &e.target {
        Target::Pod(k) => {
            let (ns, n) = k.split_once('/').unwrap_or(("", k));
            ctx.pods
                .get(&reflector::ObjectRef::new(n).within(ns))
                .and_then(|p| p.metadata.uid.clone())
        }
        Target::Pool(k) => mds
            .get(k)
            .and_then(|v| v["metadata"]["uid"].as_str())
            .map(str::to_string),
        Target::Node(n) => ctx
            .nodes
            .get(&reflector::ObjectRef::new(n))
            .and_then(|n| n.metadata.uid.clone()),
    };
    let reference = reference(&e.target, uid);
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

/// What an event is about. A Node is cluster-scoped: its reference has no namespace, and the
/// Recorder then files the event in `default`, as client-go does for cluster-scoped objects
/// (`kubectl describe node` finds it there by the Node's uid).
fn reference(target: &Target, uid: Option<String>) -> ObjectReference {
    let split = |k: &str| {
        let (ns, n) = k.split_once('/').unwrap_or(("default", k));
        (Some(ns.to_string()), Some(n.to_string()))
    };
    let (api_version, kind, (namespace, name)) = match target {
        Target::Pod(k) => ("v1".to_string(), "Pod", split(k)),
        Target::Pool(k) => (
            format!("{}/{}", act::CAPI_GROUP, act::CAPI_VERSION),
            "MachineDeployment",
            split(k),
        ),
        Target::Node(n) => ("v1".to_string(), "Node", (None, Some(n.clone()))),
    };
    ObjectReference {
        api_version: Some(api_version),
        kind: Some(kind.into()),
        namespace,
        name,
        uid,
        ..ObjectReference::default()
    }
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

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[test]
    fn a_failed_pass_backs_off_doubling_to_30_s_with_jitter() {
        assert_eq!(PASS_BACKOFF.base(1), Duration::from_secs(1));
        assert_eq!(PASS_BACKOFF.base(4), Duration::from_secs(8));
        assert_eq!(PASS_BACKOFF.base(7), Duration::from_secs(30));
        assert_eq!(PASS_BACKOFF.base(u32::MAX), Duration::from_secs(30));
        assert_eq!(
            PASS_BACKOFF.jittered(Duration::from_secs(1), 0.0),
            Duration::from_secs(1)
        );
        assert_eq!(
            PASS_BACKOFF.jittered(Duration::from_secs(1), 0.998),
            Duration::from_micros(1_199_600)
        );
    }

    #[test]
    fn the_error_policy_counts_the_failure_and_backs_off_by_failures_in_a_row() {
        let metrics = Metrics::default();
        let e = ControllerError::Status {
            name: "gpuops-status".into(),
            message: "conflict".into(),
        };
        for (failures, base) in [(1, 1), (2, 2), (4, 8), (6, 30), (50, 30)] {
            let base = Duration::from_secs(base);
            let wait = error_policy(&e, failures, &metrics)
                .requeue_after()
                .unwrap();
            assert!(
                wait >= base && wait <= base.mul_f64(1.2),
                "{failures} failures: {wait:?}"
            );
        }
        assert_eq!(metrics.action_errors.load(Ordering::Relaxed), 5);
    }

    #[test]
    fn a_pass_with_pods_waiting_for_the_batch_window_runs_again_just_after_it_closes() {
        assert_eq!(
            after_pass(Some(Duration::from_secs(2))),
            Action::Requeue(Duration::from_millis(2_000 + BATCH_CLOSE_MARGIN_MS))
        );
        assert_eq!(after_pass(None), Action::AwaitChange);
    }

    #[tokio::test]
    async fn an_api_server_that_never_answers_the_lease_does_not_hold_shutdown_up() {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let address = listener.local_addr().unwrap();
        let (accepted_tx, mut accepted) = tokio::sync::mpsc::unbounded_channel();
        let server = tokio::spawn(async move {
            let mut held = Vec::new();
            while let Ok((stream, _)) = listener.accept().await {
                held.push(stream);
                let _ = accepted_tx.send(());
            }
        });
        let dir = tempfile::tempdir().unwrap();
        let kubeconfig = dir.path().join("kubeconfig");
        std::fs::write(
            &kubeconfig,
            format!(
                "apiVersion: v1\nkind: Config\nclusters:\n- name: c\n  cluster:\n    server: http://{address}\ncontexts:\n- name: here\n  context:\n    cluster: c\n    user: u\nusers:\n- name: u\n  user: {{}}\ncurrent-context: here\n"
            ),
        )
        .unwrap();
        let cfg = ControllerConfig {
            client: gpuops_kube::ClientOptions {
                kubeconfig: Some(kubeconfig),
                request_timeout: Duration::from_secs(300),
                ..gpuops_kube::ClientOptions::default()
            },
            namespace: "default".into(),
            identity: "solo".into(),
            lease: Some(gpuops_kube::LeaseOptions {
                namespace: "default".into(),
                name: "gpuops-controller".into(),
                identity: "solo".into(),
                duration: Duration::from_secs(15),
                grace: Duration::from_secs(5),
            }),
            resync: Duration::from_secs(10),
            decision: gpuops_autoscale::Config::default(),
            metrics_address: "127.0.0.1:0".parse().unwrap(),
            dry_run: true,
            prometheus: None,
            mig: None,
        };
        let (stop_tx, stop_rx) = watch::channel(false);
        let controller = tokio::spawn(run(cfg, stop_rx));
        // The five watch caches' lists and the Lease's read: six requests, none answered.
        for _ in 0..6 {
            tokio::time::timeout(Duration::from_secs(60), accepted.recv())
                .await
                .expect("six connections to the API server")
                .unwrap();
        }
        stop_tx.send(true).unwrap();
        tokio::time::timeout(Duration::from_secs(1), controller)
            .await
            .expect("the controller stops while the Lease is unanswered")
            .unwrap()
            .unwrap();
        server.abort();
    }

    #[test]
    fn cached_objects_lose_managed_fields_and_the_last_applied_copy_only() {
        let mut pod: Pod = serde_json::from_value(serde_json::json!({
            "metadata": {"name": "p", "annotations": {
                "kubectl.kubernetes.io/last-applied-configuration": "{...}",
                "gpuops.io/do-not-disrupt": "true"},
                "managedFields": [{"manager": "kubectl", "operation": "Apply"}]}}))
        .unwrap();
        gpuops_kube::runtime::slim(&mut pod);
        assert!(pod.metadata.managed_fields.is_none());
        let a = pod.metadata.annotations.unwrap();
        assert_eq!(a.len(), 1);
        assert_eq!(a["gpuops.io/do-not-disrupt"], "true");
    }

    #[test]
    fn events_name_the_namespace_of_what_they_are_about_and_none_for_a_node() {
        let pod = reference(&Target::Pod("ml/trainer".into()), Some("u1".into()));
        assert_eq!(pod.namespace.as_deref(), Some("ml"));
        assert_eq!(pod.name.as_deref(), Some("trainer"));
        assert_eq!(pod.uid.as_deref(), Some("u1"));
        let pool = reference(&Target::Pool("capi-system/h100".into()), None);
        assert_eq!(pool.namespace.as_deref(), Some("capi-system"));
        assert_eq!(pool.kind.as_deref(), Some("MachineDeployment"));
        assert_eq!(
            pool.api_version.as_deref(),
            Some("cluster.x-k8s.io/v1beta2")
        );
        let node = reference(&Target::Node("gpu-1".into()), Some("u2".into()));
        assert_eq!(node.namespace, None, "a Node is cluster-scoped");
        assert_eq!(node.kind.as_deref(), Some("Node"));
        assert_eq!(node.uid.as_deref(), Some("u2"));
    }
}
