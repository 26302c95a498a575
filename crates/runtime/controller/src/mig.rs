//! The MIG demand reconciler's runtime: one pass observes the agents' mig-parted ConfigMap (and
//! what pools owe their booting nodes, kept in its annotation), hands it with the Nodes and the
//! snapshot to the pure half in `gpuops-autoscale` (`mig_view`, `mig_owed`, `mig_plan`,
//! `mig_demand`), and acts: writes configs before any label names them, labels nodes, and
//! returns the scale-ups for the runtime to perform.

use crate::error::ControllerError;
use gpuops_autoscale::mig_demand::{
    MigConfig, MigDecision, MigMemory, NamedConfigYaml, decide_mig,
};
use gpuops_autoscale::mig_owed::{
    CHANGED_ANNOTATION, CONFIG_LABEL, ConfigMapText, MigChangeStatus, OwedMap, OwedStatus,
    boot_layouts, config_patch, owed_status, parse_owed,
};
use gpuops_autoscale::mig_plan::{self, Buy};
use gpuops_autoscale::mig_view::{
    Boot, is_mig_pod, needs_configmap, plan_boot, referenced_by_nodes, relabel_local,
    revert_failed, under_way, view,
};
use gpuops_autoscale::{Event as AEvent, Millis, ScaleUp, Snapshot};
use k8s_openapi::api::core::v1::{ConfigMap, Node};
use kube::api::{Api, Patch, PatchParams};
use serde_json::json;
use std::sync::Arc;

/// How the MIG demand reconciler runs.
#[derive(Debug, Clone)]
pub struct MigOptions {
    /// The agents' mig-parted ConfigMap, in the controller's namespace.
    pub configmap: String,
    pub decision: MigConfig,
}

/// The reconciler: its options and what it remembers between passes.
#[derive(Debug)]
pub struct Mig {
    pub opts: MigOptions,
    memory: std::sync::Mutex<MigMemory>,
}

/// What one pass did, for the runtime to record and publish.
#[derive(Debug, Default)]
pub struct MigPass {
    pub events: Vec<AEvent>,
    pub status: Vec<MigChangeStatus>,
    /// Scale-ups for new MIG nodes the pool's own config serves (the runtime scales the pool).
    pub scale_ups: Vec<ScaleUp>,
    pub decision: MigDecision,
    pub error: Option<ControllerError>,
    /// What MIG pools owe their booting nodes.
    pub owed: Vec<OwedStatus>,
}

/// What a pass knows of the agents' ConfigMap: as it last read or wrote it, and what the pools
/// owe (as this pass leaves it).
#[derive(Debug, Default)]
struct Observed {
    cm: Option<ConfigMapText>,
    owed: OwedMap,
    /// Why the owed configs cannot be read (then no generated layout is bought).
    owed_broken: Option<String>,
}

/// The API calls of one pass, and its time.
struct Io<'a> {
    client: &'a kube::Client,
    namespace: &'a str,
    configmap: &'a str,
    /// `ConfigMap NAMESPACE/NAME`, for messages.
    origin: String,
    now: Millis,
    dry_run: bool,
}

impl Mig {
    pub fn new(opts: MigOptions) -> Mig {
        Mig {
            opts,
            memory: std::sync::Mutex::new(MigMemory::default()),
        }
    }

    /// Moves the remembered change and failure times with a wall-clock jump.
    pub fn shift(&self, delta_ms: i64) {
        if let Ok(mut m) = self.memory.lock() {
            m.shift(delta_ms);
        }
    }

    /// What it remembers now, to publish for the next leader.
    pub fn memory(&self) -> MigMemory {
        match self.memory.lock() {
            Ok(m) => m.clone(),
            Err(p) => p.into_inner().clone(),
        }
    }

    /// Takes up what the last leader published.
    pub fn restore(&self, m: MigMemory) {
        match self.memory.lock() {
            Ok(mut g) => *g = m,
            Err(p) => *p.into_inner() = m,
        }
    }

    /// One pass: label new nodes with the configs their pools owe them, decide on `nodes`
    /// and `snap`, write configs and labels (unless `dry_run`), record what a scale-up with a
    /// generated config owes its pool, and take the MIG pods out of `snap.pending` so the
    /// node-pool decision leaves them to it.
    pub async fn pass(
        &self,
        client: &kube::Client,
        namespace: &str,
        nodes: &[Arc<Node>],
        snap: &mut Snapshot,
        now: Millis,
        dry_run: bool,
    ) -> MigPass {
        let io = Io {
            client,
            namespace,
            configmap: &self.opts.configmap,
            origin: format!("ConfigMap {namespace}/{}", self.opts.configmap),
            now,
            dry_run,
        };
        let mut out = MigPass::default();
        // Observe.
        let mut obs = io.observe(nodes, snap, &mut out).await;
        // Nodes as this pass leaves them: one labelled at boot counts with its new label at
        // once (the cache has the old one), so its config is neither bought again nor pruned.
        let mut local: Vec<Arc<Node>> = nodes.to_vec();
        label_booting(&io, &mut local, snap, &mut obs, &mut out).await;
        // Decide.
        let mut mem = match self.memory.lock() {
            Ok(m) => m.clone(),
            Err(p) => p.into_inner().clone(),
        };
        let d = self.decide(&io, &local, snap, &obs, &mut mem, &mut out);
        // Act.
        if !dry_run {
            self.repartition(&io, &local, &mut obs, &d, &mut mem, &mut out)
                .await;
        }
        buy(&io, &local, snap, &mut obs, &d, &mut out).await;
        match self.memory.lock() {
            Ok(mut m) => *m = mem,
            Err(p) => *p.into_inner() = mem,
        }
        out.decision = d;
        out
    }

    /// The decision on the nodes as this pass leaves them (pure but for the log); the MIG pods
    /// leave `snap.pending`. Also without pending pods: failures are remembered for the
    /// back-off.
    fn decide(
        &self,
        io: &Io<'_>,
        nodes: &[Arc<Node>],
        snap: &mut Snapshot,
        obs: &Observed,
        mem: &mut MigMemory,
        out: &mut MigPass,
    ) -> MigDecision {
        let cm_text = obs.cm.as_ref().map(|c| c.text.as_str());
        let (layouts, broken) = boot_layouts(&obs.owed, cm_text, &io.origin, snap);
        if let Some(e) = broken {
            tracing::warn!("{e}");
        }
        out.owed = owed_status(&obs.owed);
        let boot = Boot {
            owed: obs.owed.clone(),
            layouts,
        };
        let (mig_nodes, pods, pools, problems) = view(nodes, snap, &boot);
        snap.pending.retain(|p| !is_mig_pod(p));
        for p in problems {
            tracing::warn!("{p}");
        }
        out.status = under_way(nodes);
        decide_mig(&mig_nodes, &pods, &pools, mem, io.now, &self.opts.decision)
    }

    /// Failed changes go back to what their nodes last applied; the decision's changes are
    /// written (configs, then labels). A change not written is forgotten, so its node may be
    /// chosen again next pass.
    async fn repartition(
        &self,
        io: &Io<'_>,
        nodes: &[Arc<Node>],
        obs: &mut Observed,
        d: &MigDecision,
        mem: &mut MigMemory,
        out: &mut MigPass,
    ) {
        for n in nodes {
            if let Some(r) = revert_failed(n, self.opts.decision.failed_backoff) {
                match io.label(&r.node, &r.to).await {
                    Ok(()) => out.events.push(r.event),
                    Err(e) => {
                        out.error.get_or_insert(e);
                    }
                }
            }
        }
        if d.changes.is_empty() {
            return;
        }
        let add: Vec<&NamedConfigYaml> = d.changes.iter().map(|c| &c.config).collect();
        let owed_now = obs.owed_broken.is_none().then_some(&obs.owed);
        let mut r = io.write_configs(nodes, &mut obs.cm, &add, owed_now).await;
        if r.is_ok() {
            for c in &d.changes {
                r = io.label(&c.node, &c.config_name).await;
                if r.is_err() {
                    break;
                }
            }
        }
        match r {
            Ok(()) => out.events.extend(mig_plan::change_events(&d.changes)),
            Err(e) => {
                for c in &d.changes {
                    mem.last_change.remove(&c.node);
                }
                out.error.get_or_insert(e);
            }
        }
    }
}

/// The new nodes take what their pools owe: the owed configs are rewritten first (a crash
/// then leaves a node with the pool's default, re-partitioned later, never a second node with
/// one entry's config), then the nodes labelled.
async fn label_booting(
    io: &Io<'_>,
    local: &mut [Arc<Node>],
    snap: &Snapshot,
    obs: &mut Observed,
    out: &mut MigPass,
) {
    let plan = plan_boot(&obs.owed, local, snap, io.now);
    if !plan.changes() {
        return;
    }
    if io.dry_run {
        obs.owed = plan.kept;
        return;
    }
    // The configs about to be labelled count as referenced: not pruned.
    let mut after = local.to_vec();
    for (_, node, o) in &plan.labels {
        relabel_local(&mut after, node, &o.config, gpuops_kube::now_secs());
    }
    if let Err(e) = io
        .write_configs(&after, &mut obs.cm, &[], Some(&plan.kept))
        .await
    {
        out.error.get_or_insert(e);
        return;
    }
    for (pool, o, why) in &plan.dropped {
        out.events.push(mig_plan::not_owed(pool, o, why));
    }
    for (pool, node, o) in &plan.labels {
        match io.label(node, &o.config).await {
            Ok(()) => {
                relabel_local(local, node, &o.config, gpuops_kube::now_secs());
                out.events.push(mig_plan::layout_at_boot(pool, node, o));
            }
            Err(e) => {
                out.error.get_or_insert(e);
            }
        }
    }
    obs.owed = plan.kept;
}

/// Scale-ups: the pool's own config as it is; a generated one written into the ConfigMap
/// together with what the pool is owed, before the runtime scales it.
async fn buy(
    io: &Io<'_>,
    nodes: &[Arc<Node>],
    snap: &Snapshot,
    obs: &mut Observed,
    d: &MigDecision,
    out: &mut MigPass,
) {
    for su in &d.scale_ups {
        let Some(p) = snap.pools.iter().find(|p| p.name == su.pool) else {
            continue;
        };
        let how = mig_plan::buy(su, p);
        if how == Buy::Generated {
            if let Some(why) = &obs.owed_broken {
                out.events.extend(mig_plan::not_bought(su, why));
                continue;
            }
            if !io.dry_run {
                let entries = mig_plan::owed_entries(su, io.now);
                let added = entries.len();
                obs.owed.entry(su.pool.clone()).or_default().extend(entries);
                if let Err(e) = io
                    .write_configs(nodes, &mut obs.cm, &[&su.config], Some(&obs.owed))
                    .await
                {
                    out.error.get_or_insert(e);
                    // Not recorded: not bought; decided again next pass.
                    if let Some(v) = obs.owed.get_mut(&su.pool) {
                        let keep = v.len().saturating_sub(added);
                        v.truncate(keep);
                    }
                    continue;
                }
                out.owed.extend((0..added).map(|_| OwedStatus {
                    pool: su.pool.clone(),
                    config: su.config_name.clone(),
                    at: io.now,
                }));
            }
        }
        let (scale, events) = mig_plan::scale_up(su, p.replicas, how);
        out.scale_ups.push(scale);
        out.events.extend(events);
    }
}

impl Io<'_> {
    /// The agents' ConfigMap and what the pools owe, when a pass needs them. Not fatal to
    /// the pass: without the ConfigMap nothing is owed and no generated layout can be bought
    /// (a pool's own config still can).
    async fn observe(&self, nodes: &[Arc<Node>], snap: &Snapshot, out: &mut MigPass) -> Observed {
        let mut obs = Observed::default();
        if needs_configmap(nodes, snap) {
            match self.read_configmap().await {
                Ok(c) => obs.cm = Some(c),
                Err(e) => {
                    tracing::debug!(error = %e, "MIG ConfigMap not read");
                    obs.owed_broken = Some(e.to_string());
                }
            }
        }
        if let Some(c) = &obs.cm {
            match parse_owed(&self.origin, &c.owed_text) {
                Ok(o) => obs.owed = o,
                Err(e) => {
                    tracing::warn!("{e}");
                    obs.owed_broken = Some(e.to_string());
                    out.error.get_or_insert(e.into());
                }
            }
        }
        obs
    }

    async fn read_configmap(&self) -> Result<ConfigMapText, ControllerError> {
        let api: Api<ConfigMap> = Api::namespaced(self.client.clone(), self.namespace);
        let cm = api
            .get(self.configmap)
            .await
            .map_err(|source| ControllerError::Api {
                what: format!("reading MIG {}", self.origin),
                source,
            })?;
        Ok(ConfigMapText::of(&cm))
    }

    /// Merges `add` into the agents' ConfigMap and, with `owed`, sets the owed configs, in one
    /// patch ([`config_patch`]). Before any label names them: a label naming a config the
    /// ConfigMap lacks would only fail. `cm` is the ConfigMap as last seen (read when `None`),
    /// and is what the API server returned after.
    async fn write_configs(
        &self,
        nodes: &[Arc<Node>],
        cm: &mut Option<ConfigMapText>,
        add: &[&NamedConfigYaml],
        owed: Option<&OwedMap>,
    ) -> Result<(), ControllerError> {
        let current = match cm.take() {
            Some(c) => c,
            None => self.read_configmap().await?,
        };
        let referenced = referenced_by_nodes(nodes);
        let Some(patch) = config_patch(&current, &self.origin, add, referenced, owed)? else {
            *cm = Some(current);
            return Ok(());
        };
        let api: Api<ConfigMap> = Api::namespaced(self.client.clone(), self.namespace);
        let updated = api
            .patch(
                self.configmap,
                &PatchParams::apply(crate::act::MANAGER),
                &Patch::Merge(&patch),
            )
            .await
            .map_err(|source| ControllerError::Api {
                what: format!("writing MIG {}", self.origin),
                source,
            })?;
        *cm = Some(ConfigMapText::of(&updated));
        Ok(())
    }

    /// Labels `node` with `config`, and when (the agent's minimum interval counts from it).
    async fn label(&self, node: &str, config: &str) -> Result<(), ControllerError> {
        let api: Api<Node> = Api::all(self.client.clone());
        let patch = json!({"metadata": {
            "labels": {CONFIG_LABEL: config},
            "annotations": {CHANGED_ANNOTATION: gpuops_kube::rfc3339(gpuops_kube::now_secs())},
        }});
        api.patch(node, &PatchParams::default(), &Patch::Merge(&patch))
            .await
            .map_err(|source| ControllerError::Api {
                what: format!("labelling node {node} {CONFIG_LABEL}={config}"),
                source,
            })?;
        Ok(())
    }
}
