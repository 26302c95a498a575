//! The control plane: etcd, kube-apiserver, and on request kube-scheduler, kube-controller-manager
//! and KWOK, all on loopback with tokens for an admin and for least-privilege identities.

use crate::child::ChildGuard;
use crate::{BedError, binaries, free_port, wait_until};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

/// An identity with a bearer token (the apiserver's token file), for RBAC tests.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct User {
    pub name: String,
    pub token: String,
    pub groups: Vec<String>,
}

impl User {
    /// A user in no group: it can do only what RBAC grants it.
    pub fn plain(name: &str) -> User {
        User {
            name: name.to_string(),
            token: format!("{name}-token"),
            groups: Vec::new(),
        }
    }
}

/// Which parts to start.
#[derive(Debug, Clone)]
pub struct ClusterOptions {
    pub scheduler: bool,
    pub controller_manager: bool,
    pub kwok: bool,
    /// Identities besides the admin.
    pub users: Vec<User>,
    /// Extra top-level fields of the scheduler's KubeSchedulerConfiguration (YAML, e.g. an
    /// `extenders:` list). The test bed writes the file (apiVersion, kind, clientConnection,
    /// leaderElection off) and starts kube-scheduler with `--config`.
    pub scheduler_config: Option<String>,
    /// Serve the apiserver on every address, not only loopback: pods of a [`crate::RealNode`]
    /// on the bridge network reach it at the node's address (there is no kube-proxy).
    pub all_addresses: bool,
    /// Extra kube-apiserver flags (e.g. the feature gate and API group that
    /// [`crate::Karpenter`] needs, see [`crate::KarpenterOptions::apiserver_args`]).
    pub apiserver_args: Vec<String>,
    /// Feature gates turned on in the apiserver, the scheduler and the controller-manager (e.g.
    /// [`DRA_FEATURE_GATES`]; a real node takes its own, [`crate::RealNodeOptions::feature_gates`]).
    /// Empty: each component's defaults, as before.
    pub feature_gates: Vec<String>,
}

/// The Kubernetes 1.35 gates that gpuops's DRA driver is tested with (reference/dra.md): device
/// partitions (dynamic MIG), device taints (health) and the `nvidia.com/gpu` extended-resource
/// mapping. They are alpha in 1.35, so off unless a test asks; `DynamicResourceAllocation` and
/// `resource.k8s.io/v1` are GA and on by default.
pub const DRA_FEATURE_GATES: [&str; 3] = [
    "DRAPartitionableDevices",
    "DRADeviceTaints",
    "DRAExtendedResource",
];

/// `--feature-gates=A=true,B=true`, or nothing for no gates. Components merge repeated
/// `--feature-gates` flags, so this may sit beside one in [`ClusterOptions::apiserver_args`].
pub(crate) fn feature_gates_flag(gates: &[String]) -> Option<String> {
    if gates.is_empty() {
        return None;
    }
    let list: Vec<String> = gates.iter().map(|g| format!("{g}=true")).collect();
    Some(format!("--feature-gates={}", list.join(",")))
}

impl ClusterOptions {
    /// These options with the DRA gates ([`DRA_FEATURE_GATES`]) on.
    pub fn with_dra(mut self) -> ClusterOptions {
        self.feature_gates
            .extend(DRA_FEATURE_GATES.iter().map(|g| (*g).to_string()));
        self
    }
}

impl Default for ClusterOptions {
    fn default() -> Self {
        ClusterOptions {
            scheduler: true,
            controller_manager: false,
            kwok: false,
            users: Vec::new(),
            scheduler_config: None,
            all_addresses: false,
            apiserver_args: Vec::new(),
            feature_gates: Vec::new(),
        }
    }
}

/// A running control plane. Dropping it stops every process and removes its directory.
#[derive(Debug)]
pub struct Cluster {
    // Field order matters: processes stop (drop) before the directory goes.
    kwok: Option<ChildGuard>,
    controller_manager: Option<ChildGuard>,
    scheduler: Option<ChildGuard>,
    apiserver: ChildGuard,
    etcd: ChildGuard,
    /// The apiserver's flags, to start it again on the same port after [`Cluster::stop_apiserver`].
    apiserver_args: Vec<String>,
    bin: PathBuf,
    server: String,
    users: Vec<User>,
    dir: tempfile::TempDir,
}

const ADMIN: &str = "admin";
const READY: Duration = Duration::from_secs(90);

impl Cluster {
    /// Starts the control plane and waits until it is ready.
    // Long on purpose: the control plane's start-up in order (certificates, etcd, apiserver, controllers, KWOK), each step waiting for the one before.
    pub fn start(options: ClusterOptions) -> Result<Cluster, BedError> {
        let mut names = vec!["etcd", "kube-apiserver", "kubectl"];
        if options.scheduler {
            names.push("kube-scheduler");
        }
        if options.controller_manager {
            names.push("kube-controller-manager");
        }
        if options.kwok {
            names.push("kwok");
        }
        let bin = binaries(&names)?;
        let dir = tempfile::Builder::new()
            .prefix("gpuops-testbed-")
            .tempdir()
            .map_err(|e| BedError::io("creating the test bed directory", e))?;
        let root = dir.path().to_path_buf();

        let mut users = vec![User {
            name: ADMIN.into(),
            token: "admin-token".into(),
            groups: vec!["system:masters".into()],
        }];
        users.extend(options.users.iter().cloned());
        write_tokens(&root.join("tokens.csv"), &users)?;
        generate_key(&root.join("sa.key"))?;

        let etcd_port = free_port()?;
        let peer_port = free_port()?;
        let mut etcd_cmd = Command::new(bin.join("etcd"));
        etcd_cmd.args([
            "--name=bed",
            &format!("--data-dir={}", root.join("etcd").display()),
            &format!("--listen-client-urls=http://127.0.0.1:{etcd_port}"),
            &format!("--advertise-client-urls=http://127.0.0.1:{etcd_port}"),
            &format!("--listen-peer-urls=http://127.0.0.1:{peer_port}"),
            &format!("--initial-advertise-peer-urls=http://127.0.0.1:{peer_port}"),
            &format!("--initial-cluster=bed=http://127.0.0.1:{peer_port}"),
            "--quota-backend-bytes=4294967296",
            // Test data need not survive a power cut; fsync is most of etcd's latency on a VM.
            "--unsafe-no-fsync",
            "--log-level=warn",
        ]);
        let etcd = ChildGuard::spawn("etcd", etcd_cmd, &root.join("etcd.log"))?;

        let api_port = free_port()?;
        let base: &[&str] = &[
            &format!("--etcd-servers=http://127.0.0.1:{etcd_port}"),
            &format!(
                "--bind-address={}",
                if options.all_addresses {
                    "0.0.0.0"
                } else {
                    "127.0.0.1"
                }
            ),
            &format!("--secure-port={api_port}"),
            // Without these the apiserver advertises the host's address in the kubernetes Service.
            "--advertise-address=127.0.0.1",
            "--endpoint-reconciler-type=none",
            &format!("--cert-dir={}", root.join("pki").display()),
            "--service-cluster-ip-range=10.0.0.0/24",
            "--service-account-issuer=https://kubernetes.default.svc.cluster.local",
            &format!(
                "--service-account-key-file={}",
                root.join("sa.key").display()
            ),
            &format!(
                "--service-account-signing-key-file={}",
                root.join("sa.key").display()
            ),
            &format!("--token-auth-file={}", root.join("tokens.csv").display()),
            "--authorization-mode=RBAC",
            "--disable-admission-plugins=ServiceAccount",
            "--allow-privileged=true",
        ];
        let mut apiserver_args: Vec<String> = base.iter().map(|a| (*a).to_string()).collect();
        let gates = feature_gates_flag(&options.feature_gates);
        apiserver_args.extend(gates.clone());
        apiserver_args.extend(options.apiserver_args.iter().cloned());
        let mut api_cmd = Command::new(bin.join("kube-apiserver"));
        api_cmd.args(&apiserver_args);
        let apiserver =
            ChildGuard::spawn("kube-apiserver", api_cmd, &root.join("kube-apiserver.log"))?;

        let mut cluster = Cluster {
            kwok: None,
            controller_manager: None,
            scheduler: None,
            apiserver,
            etcd,
            apiserver_args,
            bin,
            server: format!("https://127.0.0.1:{api_port}"),
            users,
            dir,
        };
        for user in cluster.users.clone() {
            cluster.write_kubeconfig(&user)?;
        }
        cluster.wait_apiserver()?;

        let admin = cluster.kubeconfig();
        if options.scheduler {
            let port = free_port()?;
            let mut cmd = Command::new(cluster.bin.join("kube-scheduler"));
            cmd.args(component_args(&admin, port));
            cmd.args(gates.clone());
            match &options.scheduler_config {
                Some(extra) => {
                    let file = root.join("kube-scheduler-config.yaml");
                    let text = format!(
                        "apiVersion: kubescheduler.config.k8s.io/v1\nkind: KubeSchedulerConfiguration\nclientConnection:\n  kubeconfig: {}\nleaderElection:\n  leaderElect: false\n{extra}\n",
                        admin.display()
                    );
                    std::fs::write(&file, text)
                        .map_err(|e| BedError::io("writing the scheduler config", e))?;
                    cmd.arg(format!("--config={}", file.display()));
                }
                None => {
                    cmd.arg("--leader-elect=false");
                }
            }
            cluster.scheduler = Some(ChildGuard::spawn(
                "kube-scheduler",
                cmd,
                &root.join("kube-scheduler.log"),
            )?);
            cluster.wait_component("kube-scheduler", port)?;
        }
        if options.controller_manager {
            let port = free_port()?;
            let mut cmd = Command::new(cluster.bin.join("kube-controller-manager"));
            cmd.args(component_args(&admin, port));
            cmd.args(gates.clone());
            cmd.args([
                "--leader-elect=false",
                &format!(
                    "--service-account-private-key-file={}",
                    root.join("sa.key").display()
                ),
                &format!(
                    "--root-ca-file={}",
                    root.join("pki").join("apiserver.crt").display()
                ),
                "--use-service-account-credentials=false",
                // Otherwise it creates /usr/libexec/kubernetes/... on the host.
                &format!(
                    "--flex-volume-plugin-dir={}",
                    root.join("flexvolume").display()
                ),
            ]);
            cluster.controller_manager = Some(ChildGuard::spawn(
                "kube-controller-manager",
                cmd,
                &root.join("kube-controller-manager.log"),
            )?);
            cluster.wait_component("kube-controller-manager", port)?;
        }
        if options.kwok {
            let mut cmd = Command::new(cluster.bin.join("kwok"));
            // kwok reads ~/.kwok/kwok.yaml when it exists: give it an empty home of its own.
            cmd.env("HOME", root.join("kwok-home"));
            cmd.args([
                &format!("--kubeconfig={}", admin.display()),
                &format!("--config={}", kwok_stages().display()),
                "--manage-all-nodes=false",
                "--manage-nodes-with-annotation-selector=kwok.x-k8s.io/node=fake",
                "--node-lease-duration-seconds=40",
            ]);
            let port = free_port()?;
            cmd.arg(format!("--server-address=127.0.0.1:{port}"));
            let mut kwok = ChildGuard::spawn("kwok", cmd, &root.join("kwok.log"))?;
            // Its /healthz answers once it runs; one that exits (a bad flag) is reported at once.
            let up = wait_until("KWOK's /healthz", READY, || {
                kwok.check_alive().is_err() || crate::capi::http_ok(port, "/healthz")
            });
            kwok.check_alive()?;
            up?;
            cluster.kwok = Some(kwok);
        }
        Ok(cluster)
    }

    /// The test bed's directory (logs, kubeconfigs, node directories).
    pub fn dir(&self) -> &Path {
        self.dir.path()
    }

    /// The admin kubeconfig.
    pub fn kubeconfig(&self) -> PathBuf {
        self.kubeconfig_for(ADMIN)
    }

    /// The kubeconfig of a user given in [`ClusterOptions::users`].
    pub fn kubeconfig_for(&self, user: &str) -> PathBuf {
        self.dir.path().join(format!("kubeconfig-{user}"))
    }

    /// The apiserver URL.
    pub fn server(&self) -> &str {
        &self.server
    }

    /// A kubeconfig of `user` for the apiserver at `host` (an address of this machine other than
    /// loopback; needs [`ClusterOptions::all_addresses`]), e.g. for pods on a real node.
    pub fn kubeconfig_at(&self, user: &str, host: &str) -> Result<PathBuf, BedError> {
        let port = self.server.rsplit(':').next().unwrap_or("443");
        let token = self
            .users
            .iter()
            .find(|u| u.name == user)
            .map(|u| u.token.clone())
            .ok_or_else(|| BedError::Kubectl {
                args: format!("kubeconfig for {user}"),
                message: format!("no user {user} in this cluster"),
            })?;
        let path = self.dir.path().join(format!("kubeconfig-{user}-at-{host}"));
        let text = format!(
            "apiVersion: v1\nkind: Config\nclusters:\n- name: bed\n  cluster:\n    server: https://{host}:{port}\n    insecure-skip-tls-verify: true\nusers:\n- name: {user}\n  user:\n    token: {token}\ncontexts:\n- name: bed\n  context:\n    cluster: bed\n    user: {user}\ncurrent-context: bed\n"
        );
        std::fs::write(&path, text)
            .map_err(|e| BedError::io(format!("writing {}", path.display()), e))?;
        Ok(path)
    }

    /// Directory of the built binaries (for harness programs).
    pub fn bin(&self) -> &Path {
        &self.bin
    }

    /// `helm ARGS` against this cluster as the admin, with Helm's cache, config and data under
    /// the bed's directory (the user's own Helm setup is neither read nor changed); stdout on
    /// success, both outputs in the error.
    pub fn helm(&self, args: &[&str]) -> Result<String, BedError> {
        let home = self.dir().join("helm-home");
        let out = std::process::Command::new(self.bin.join("helm"))
            .args(args)
            .arg(format!("--kubeconfig={}", self.kubeconfig().display()))
            .env("HELM_CACHE_HOME", home.join("cache"))
            .env("HELM_CONFIG_HOME", home.join("config"))
            .env("HELM_DATA_HOME", home.join("data"))
            .output()
            .map_err(|e| BedError::Spawn {
                what: "helm".into(),
                source: e,
            })?;
        if !out.status.success() {
            return Err(BedError::Helm {
                args: args.join(" "),
                message: format!(
                    "{}{}",
                    String::from_utf8_lossy(&out.stdout),
                    String::from_utf8_lossy(&out.stderr)
                ),
            });
        }
        Ok(String::from_utf8_lossy(&out.stdout).into_owned())
    }

    /// `kubectl ARGS` as the admin; stdout on success.
    pub fn kubectl(&self, args: &[&str]) -> Result<String, BedError> {
        self.kubectl_as(ADMIN, args)
    }

    /// `kubectl ARGS` as `user`; stdout on success, stderr in the error.
    pub fn kubectl_as(&self, user: &str, args: &[&str]) -> Result<String, BedError> {
        self.kubectl_input(user, args, None)
    }

    /// `kubectl apply -f -` with `yaml` on stdin, as the admin.
    pub fn apply(&self, yaml: &str) -> Result<String, BedError> {
        self.kubectl_input(ADMIN, &["apply", "-f", "-"], Some(yaml))
    }

    fn kubectl_input(
        &self,
        user: &str,
        args: &[&str],
        input: Option<&str>,
    ) -> Result<String, BedError> {
        crate::kubectl::Kubectl::new(&self.bin, &self.kubeconfig_for(user)).run(args, input)
    }

    /// `kubectl get ARGS -o json` as JSON.
    pub fn get_json(&self, args: &[&str]) -> Result<serde_json::Value, BedError> {
        let mut full = vec!["get"];
        full.extend_from_slice(args);
        full.extend_from_slice(&["-o", "json"]);
        let text = self.kubectl(&full)?;
        serde_json::from_str(&text).map_err(|e| BedError::Kubectl {
            args: full.join(" "),
            message: format!("not JSON: {e}"),
        })
    }

    /// Checks no control-plane process died.
    pub fn check_alive(&mut self) -> Result<(), BedError> {
        self.etcd.check_alive()?;
        self.apiserver.check_alive()?;
        for p in [
            &mut self.scheduler,
            &mut self.controller_manager,
            &mut self.kwok,
        ]
        .into_iter()
        .flatten()
        {
            p.check_alive()?;
        }
        Ok(())
    }

    /// Process ids of the control plane, for tests that check nothing is left running.
    pub fn pids(&self) -> Vec<u32> {
        [
            Some(&self.etcd),
            Some(&self.apiserver),
            self.scheduler.as_ref(),
            self.controller_manager.as_ref(),
            self.kwok.as_ref(),
        ]
        .into_iter()
        .flatten()
        .filter_map(|p| p.pid())
        .collect()
    }

    /// Stops the apiserver (to test clients that lose it); `restart_apiserver` brings it back.
    pub fn stop_apiserver(&mut self) {
        self.apiserver.stop();
    }

    /// Starts the apiserver again after [`Cluster::stop_apiserver`], with the same flags (port,
    /// certificates, etcd: clients see the same server come back) and waits until it is ready.
    pub fn restart_apiserver(&mut self) -> Result<(), BedError> {
        self.apiserver.stop();
        let mut cmd = Command::new(self.bin.join("kube-apiserver"));
        cmd.args(&self.apiserver_args);
        // A log of its own: the first run's log stays readable for what happened before.
        let log = self.dir.path().join("kube-apiserver-restarted.log");
        self.apiserver = ChildGuard::spawn("kube-apiserver", cmd, &log)?;
        self.wait_apiserver()
    }

    /// Waits for `/readyz`, failing fast with the log when etcd or the apiserver died.
    fn wait_apiserver(&mut self) -> Result<(), BedError> {
        let deadline = std::time::Instant::now() + READY;
        loop {
            self.etcd.check_alive()?;
            self.apiserver.check_alive()?;
            if cluster_raw_ok(self, "/readyz") {
                return Ok(());
            }
            if std::time::Instant::now() >= deadline {
                return Err(BedError::NotReady {
                    what: "kube-apiserver".into(),
                    seconds: READY.as_secs(),
                    log: self.apiserver.log_path().to_path_buf(),
                    tail: self.apiserver.last_lines(20),
                });
            }
            std::thread::sleep(Duration::from_millis(200));
        }
    }

    fn wait_component(&mut self, what: &str, port: u16) -> Result<(), BedError> {
        let url = format!("https://127.0.0.1:{port}");
        let kubectl = self.bin.join("kubectl");
        let admin = self.kubeconfig();
        let ok = wait_until(what, READY, || {
            Command::new(&kubectl)
                .arg(format!("--kubeconfig={}", admin.display()))
                .args(["--server", &url, "get", "--raw", "/healthz"])
                .output()
                .is_ok_and(|o| {
                    o.status.success() && String::from_utf8_lossy(&o.stdout).trim() == "ok"
                })
        });
        let process = match what {
            "kube-scheduler" => self.scheduler.as_mut(),
            _ => self.controller_manager.as_mut(),
        };
        match (ok, process) {
            (Ok(()), _) => Ok(()),
            (Err(_), Some(p)) => {
                p.check_alive()?;
                Err(BedError::NotReady {
                    what: what.to_string(),
                    seconds: READY.as_secs(),
                    log: p.log_path().to_path_buf(),
                    tail: p.last_lines(20),
                })
            }
            (Err(e), None) => Err(e),
        }
    }

    fn write_kubeconfig(&self, user: &User) -> Result<(), BedError> {
        let text = format!(
            "apiVersion: v1\nkind: Config\nclusters:\n- name: bed\n  cluster:\n    server: {}\n    insecure-skip-tls-verify: true\nusers:\n- name: {}\n  user:\n    token: {}\ncontexts:\n- name: bed\n  context:\n    cluster: bed\n    user: {}\ncurrent-context: bed\n",
            self.server, user.name, user.token, user.name
        );
        let path = self.kubeconfig_for(&user.name);
        std::fs::write(&path, text)
            .map_err(|e| BedError::io(format!("writing {}", path.display()), e))
    }
}

fn cluster_raw_ok(cluster: &Cluster, path: &str) -> bool {
    cluster
        .kubectl(&["get", "--raw", path])
        .is_ok_and(|out| out.trim() == "ok")
}

/// Flags every kube component takes to talk to the apiserver and serve its health endpoint.
fn component_args(kubeconfig: &Path, port: u16) -> Vec<String> {
    let k = kubeconfig.display();
    vec![
        format!("--kubeconfig={k}"),
        format!("--authentication-kubeconfig={k}"),
        format!("--authorization-kubeconfig={k}"),
        // The tokens are static: there is no extension-apiserver-authentication ConfigMap to read.
        "--authentication-skip-lookup".into(),
        "--bind-address=127.0.0.1".into(),
        format!("--secure-port={port}"),
    ]
}

/// KWOK's node and pod stages (kwokctl normally supplies them): `tests/k8s/kwok-stages.yaml`.
fn kwok_stages() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../../tests/k8s/kwok-stages.yaml")
}

/// The apiserver's static token file: `token,user,uid,"group1,group2"`.
fn write_tokens(path: &Path, users: &[User]) -> Result<(), BedError> {
    let text: String = users
        .iter()
        .map(|u| {
            format!(
                "{},{},{},\"{}\"\n",
                u.token,
                u.name,
                u.name,
                u.groups.join(",")
            )
        })
        .collect();
    std::fs::write(path, text).map_err(|e| BedError::io(format!("writing {}", path.display()), e))
}

/// An RSA key for service-account tokens, made by `openssl genrsa`.
fn generate_key(path: &Path) -> Result<(), BedError> {
    let out = Command::new("openssl")
        .args(["genrsa", "-out"])
        .arg(path)
        .arg("2048")
        .output()
        .map_err(|source| BedError::Spawn {
            what: "openssl (needed for the service-account key; apt-get install openssl)".into(),
            source,
        })?;
    if out.status.success() {
        Ok(())
    } else {
        Err(BedError::io(
            "generating the service-account key",
            std::io::Error::other(String::from_utf8_lossy(&out.stderr).into_owned()),
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn gates_become_one_flag_and_none_stays_none() {
        assert_eq!(feature_gates_flag(&[]), None);
        let options = ClusterOptions::default().with_dra();
        assert_eq!(
            feature_gates_flag(&options.feature_gates).as_deref(),
            Some(
                "--feature-gates=DRAPartitionableDevices=true,DRADeviceTaints=true,DRAExtendedResource=true"
            )
        );
    }
}
