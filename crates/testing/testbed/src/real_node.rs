//! A real node: containerd 2.x and a kubelet (both built by tests/k8s/build.sh) with Debian's runc
//! and CNI plugins, running real pods from images imported without a registry.
//!
//! Both run in a private mount namespace where temporary directories are bind-mounted on
//! `/var/lib/kubelet`, `/run/containerd` and `/var/log`: the chart's default host paths work
//! unchanged and the host's own directories are never written. What cannot be namespaced is put
//! back when the node is dropped (also when a test panics): the sysctls the kubelet and the bridge
//! plugin change, the bridge link, the `kubepods` cgroups, and every process (by pid: the kubelet,
//! containerd, its shims and the containers). The facts behind each setting are in
//! reference/real-node.md.

use crate::child::{ChildGuard, record};
use crate::{BedError, Cluster, binaries, free_port, wait_until};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

/// The kubelet's own changes to the host that no namespace isolates (plus ip_forward, which the
/// bridge plugin's isGateway sets): saved before it starts and written back afterwards.
const SYSCTLS: [&str; 4] = [
    "vm/overcommit_memory",
    "kernel/panic",
    "kernel/panic_on_oops",
    "net/ipv4/ip_forward",
];

/// Host directories that are replaced by test directories inside the node's mount namespace.
/// (`/var/lib/kubelet`: the device-plugin socket is always there whatever --root-dir says;
/// `/var/run/cdi`: a CDI spec the chart's agent writes there reaches this node's containerd
/// only, never the host's.)
const PRIVATE_DIRS: [(&str, &str); 4] = [
    ("/var/lib/kubelet", "kubelet"),
    ("/run/containerd", "run-containerd"),
    ("/var/log", "log"),
    ("/var/run/cdi", "run-cdi"),
];

/// How a real node is started.
#[derive(Debug, Clone)]
pub struct RealNodeOptions {
    /// Labels the kubelet registers the node with, e.g. `nvidia.com/gpu.present=true`.
    pub labels: Vec<(String, String)>,
    /// More image archives to import (docker-archive or OCI), e.g. scripts/image's.
    pub images: Vec<PathBuf>,
    /// The kubelet's `nodeStatusUpdateFrequency`: how soon device-plugin resources reach the Node.
    pub status_update: Duration,
    /// Feature gates turned on in the kubelet's configuration, e.g. [`crate::DRA_FEATURE_GATES`]
    /// (the control plane takes the same through [`crate::ClusterOptions::feature_gates`]).
    pub feature_gates: Vec<String>,
}

impl RealNodeOptions {
    /// These options with the DRA gates ([`crate::DRA_FEATURE_GATES`]) on in the kubelet.
    pub fn with_dra(mut self) -> RealNodeOptions {
        self.feature_gates
            .extend(crate::DRA_FEATURE_GATES.iter().map(|g| (*g).to_string()));
        self
    }
}

impl Default for RealNodeOptions {
    fn default() -> Self {
        RealNodeOptions {
            labels: Vec::new(),
            images: Vec::new(),
            status_update: Duration::from_secs(2),
            feature_gates: Vec::new(),
        }
    }
}

/// The images every real node has (tests/k8s/node-images.sh).
#[derive(Debug, Clone)]
pub struct NodeImages {
    pub pause: PathBuf,
    pub pause_ref: String,
    pub busybox: PathBuf,
    /// A small image with a shell and the usual tools, for test pods.
    pub busybox_ref: String,
}

/// A running real node. Dropping it stops everything and restores the host.
#[derive(Debug)]
pub struct RealNode {
    /// The Node's name: the host name, which the apiserver resolves to reach the kubelet.
    pub name: String,
    kubelet: Option<ChildGuard>,
    containerd: Option<ChildGuard>,
    ctr: PathBuf,
    socket: PathBuf,
    mount_ns: Option<String>,
    sysctls: Vec<(String, String)>,
    created_dirs: Vec<PathBuf>,
    bridge: String,
    images: NodeImages,
    record: Option<PathBuf>,
    kubelet_bin: PathBuf,
    kubelet_args: Vec<String>,
    restarts: u32,
    dir: tempfile::TempDir,
}

impl RealNode {
    /// Starts containerd and the kubelet for `cluster` and waits until the Node is Ready.
    pub fn start(cluster: &Cluster, options: RealNodeOptions) -> Result<RealNode, BedError> {
        let bin = binaries(&["kubelet", "containerd", "containerd-shim-runc-v2", "ctr"])?;
        check_host()?;
        let images = node_images()?;
        let dir = tempfile::Builder::new()
            .prefix("gpuops-node-")
            .tempdir()
            .map_err(|e| BedError::io("creating the real node's directory", e))?;
        let root = dir.path().to_path_buf();
        let name = host_name()?;
        let tag = format!("{:06x}", std::process::id() & 0xff_ffff);
        let mut node = RealNode {
            name,
            kubelet: None,
            containerd: None,
            ctr: bin.join("ctr"),
            socket: root.join("containerd.sock"),
            mount_ns: None,
            sysctls: save_sysctls(),
            created_dirs: Vec::new(),
            bridge: format!("gpo{tag}"),
            images,
            record: None,
            kubelet_bin: bin.join("kubelet"),
            kubelet_args: Vec::new(),
            restarts: 0,
            dir,
        };
        // From here on Drop restores the host, whatever fails next.
        node.record = record_node(&node);
        for (host, _) in PRIVATE_DIRS {
            let host = Path::new(host);
            if !host.exists() {
                std::fs::create_dir_all(host)
                    .map_err(|e| BedError::io(format!("creating {}", host.display()), e))?;
                node.created_dirs.push(host.to_path_buf());
            }
        }
        node.write_configs(&root)?;
        node.start_containerd(&bin, &root)?;
        // Now with the mount namespace, whose processes (the shims) scripts/test would stop.
        node.record = record_node(&node);
        let mut archives = vec![node.images.pause.clone(), node.images.busybox.clone()];
        archives.extend(options.images.iter().cloned());
        for archive in &archives {
            node.import(archive)?;
        }
        node.kubelet_args = node.kubelet_args(cluster, &root, &options)?;
        node.spawn_kubelet("kubelet.log")?;
        node.wait_ready(cluster)?;
        Ok(node)
    }

    /// The node's directory (configs, logs, containerd's state).
    pub fn dir(&self) -> &Path {
        self.dir.path()
    }

    /// What is `/var/run/cdi` inside the node (a CDI spec directory containerd reads).
    pub fn cdi_spec_dir(&self) -> PathBuf {
        self.dir.path().join("run-cdi")
    }

    /// The kubelet's log file (of its latest start).
    pub fn kubelet_log(&self) -> PathBuf {
        self.kubelet
            .as_ref()
            .map(|k| k.log_path().to_path_buf())
            .unwrap_or_else(|| self.dir().join("kubelet.log"))
    }

    /// containerd's log file.
    pub fn containerd_log(&self) -> PathBuf {
        self.dir().join("containerd.log")
    }

    /// The images every real node has.
    pub fn images(&self) -> &NodeImages {
        &self.images
    }

    /// Imports an image archive into containerd's `k8s.io` namespace (the kubelet's).
    pub fn import(&self, archive: &Path) -> Result<(), BedError> {
        let path = archive.to_string_lossy();
        self.ctr(&["images", "import", "--all-platforms", &path])
            .map(drop)
    }

    /// `ctr -n k8s.io ARGS` against this node's containerd; stdout.
    pub fn ctr(&self, args: &[&str]) -> Result<String, BedError> {
        let out = Command::new(&self.ctr)
            // An absolute socket path: a relative one fails with "invalid (non-empty) authority".
            .arg("--address")
            .arg(&self.socket)
            .args(["--namespace", "k8s.io"])
            .args(args)
            .stdin(Stdio::null())
            .output()
            .map_err(|source| BedError::Spawn {
                what: "ctr".into(),
                source,
            })?;
        if out.status.success() {
            Ok(String::from_utf8_lossy(&out.stdout).into_owned())
        } else {
            Err(BedError::Kubectl {
                args: format!("(ctr) {}", args.join(" ")),
                message: String::from_utf8_lossy(&out.stderr).trim().to_string(),
            })
        }
    }

    /// The host pid of a container's first process, found through containerd by the labels the
    /// kubelet puts on it (pod uid and container name).
    pub fn container_pid(&self, pod_uid: &str, container: &str) -> Result<Option<u32>, BedError> {
        let filter = format!(
            "labels.\"io.kubernetes.pod.uid\"=={pod_uid},labels.\"io.kubernetes.container.name\"=={container}"
        );
        let ids = self.ctr(&["containers", "ls", "--quiet", &filter])?;
        let ids: Vec<&str> = ids.split_whitespace().collect();
        let tasks = self.ctr(&["tasks", "ls"])?;
        // TASK PID STATUS; a restarted container has a new id, and only one runs.
        Ok(tasks.lines().skip(1).find_map(|line| {
            let mut cols = line.split_whitespace();
            let (id, pid, status) = (cols.next()?, cols.next()?, cols.next()?);
            (ids.contains(&id) && status == "RUNNING")
                .then(|| pid.parse().ok())
                .flatten()
        }))
    }

    /// How many times the kubelet logged `needle` (in every log of this node's kubelets).
    pub fn kubelet_log_count(&self, needle: &str) -> usize {
        (0..=self.restarts)
            .map(|i| self.dir().join(kubelet_log_name(i)))
            .filter_map(|p| std::fs::read_to_string(p).ok())
            .map(|text| text.matches(needle).count())
            .sum()
    }

    /// Restarts the kubelet (SIGTERM, or SIGKILL with `crash`); pods keep running, as on a real
    /// node, and plugins must register again.
    pub fn restart_kubelet(&mut self, cluster: &Cluster, crash: bool) -> Result<(), BedError> {
        if let Some(mut k) = self.kubelet.take() {
            if crash {
                k.kill();
            } else {
                k.stop();
            }
        }
        self.restarts += 1;
        self.spawn_kubelet(&kubelet_log_name(self.restarts))?;
        self.wait_ready(cluster)
    }

    /// Process ids of the kubelet and containerd.
    pub fn pids(&self) -> Vec<u32> {
        [self.kubelet.as_ref(), self.containerd.as_ref()]
            .into_iter()
            .flatten()
            .filter_map(ChildGuard::pid)
            .collect()
    }

    /// Checks the kubelet and containerd are still running.
    pub fn check_alive(&mut self) -> Result<(), BedError> {
        for p in [self.kubelet.as_mut(), self.containerd.as_mut()]
            .into_iter()
            .flatten()
        {
            p.check_alive()?;
        }
        Ok(())
    }

    fn write_configs(&self, root: &Path) -> Result<(), BedError> {
        for sub in [
            "cni/net.d",
            "cni/ipam",
            "cdi",
            "opt",
            "containerd/root",
            "containerd/state",
        ] {
            mkdir(&root.join(sub))?;
        }
        for (_, sub) in PRIVATE_DIRS {
            mkdir(&root.join(sub))?;
        }
        let r = root.display();
        // One /24 per node from the pid, so two test processes never share a subnet.
        let subnet = format!("10.233.{}.0/24", std::process::id() % 250);
        let cni = format!(
            r#"{{"cniVersion":"1.0.0","name":"gpuops-test","plugins":[{{"type":"bridge","bridge":"{}","isGateway":true,"ipMasq":false,"hairpinMode":true,"ipam":{{"type":"host-local","ranges":[[{{"subnet":"{subnet}"}}]],"routes":[{{"dst":"0.0.0.0/0"}}],"dataDir":"{r}/cni/ipam"}}}}]}}"#,
            self.bridge
        );
        write(&root.join("cni/net.d/10-gpuops-test.conflist"), &cni)?;
        let config = format!(
            r#"version = 3
root = "{r}/containerd/root"
state = "{r}/containerd/state"
# The defaults read /etc/containerd/conf.d: nothing of the host's.
imports = []

[grpc]
  address = "{r}/containerd.sock"
[ttrpc]
  address = "{r}/containerd.sock.ttrpc"
[debug]
  address = ""
[metrics]
  address = ""

[plugins."io.containerd.internal.v1.opt"]
  path = "{r}/opt"
[plugins."io.containerd.nri.v1.nri"]
  disable = true
  socket_path = "{r}/nri.sock"

[plugins."io.containerd.cri.v1.images"]
  snapshotter = "overlayfs"
  [plugins."io.containerd.cri.v1.images".pinned_images]
    sandbox = "{pause}"

[plugins."io.containerd.cri.v1.runtime"]
  # Root lacks CAP_SYS_RESOURCE on this kind of VM: runc cannot set a negative oom_score_adj.
  restrict_oom_score_adj = true
  disable_apparmor = true
  tolerate_missing_hugetlb_controller = true
  disable_hugetlb_controller = true
  netns_mounts_under_state_dir = true
  enable_cdi = true
  cdi_spec_dirs = ["{r}/cdi", "/var/run/cdi"]
  [plugins."io.containerd.cri.v1.runtime".containerd]
    default_runtime_name = "runc"
    [plugins."io.containerd.cri.v1.runtime".containerd.runtimes.runc]
      runtime_type = "io.containerd.runc.v2"
      [plugins."io.containerd.cri.v1.runtime".containerd.runtimes.runc.options]
        SystemdCgroup = false
  [plugins."io.containerd.cri.v1.runtime".cni]
    bin_dirs = ["/usr/lib/cni"]
    conf_dir = "{r}/cni/net.d"

[plugins."io.containerd.grpc.v1.cri"]
  stream_server_address = "127.0.0.1"
  stream_server_port = "0"
"#,
            pause = self.images.pause_ref
        );
        write(&root.join("containerd.toml"), &config)
    }

    fn start_containerd(&mut self, bin: &Path, root: &Path) -> Result<(), BedError> {
        // unshare and sh exec in place, so the guard's pid is containerd's.
        let mut script = String::from("set -e\n");
        for (host, sub) in PRIVATE_DIRS {
            script.push_str(&format!(
                "mount --bind '{}' '{host}'\n",
                root.join(sub).display()
            ));
        }
        script.push_str("exec \"$0\" --config \"$1\"\n");
        let mut cmd = Command::new("unshare");
        cmd.args(["--mount", "--propagation", "private", "--", "sh", "-c"])
            .arg(script)
            .arg(bin.join("containerd"))
            .arg(root.join("containerd.toml"))
            // Its own shim must come first; runc is Debian's.
            .env("PATH", path_with(bin));
        self.containerd = Some(ChildGuard::spawn(
            "containerd",
            cmd,
            &root.join("containerd.log"),
        )?);
        let deadline = Instant::now() + Duration::from_secs(60);
        loop {
            if let Some(c) = self.containerd.as_mut() {
                c.check_alive()?;
            }
            if self.socket.exists() && self.ctr(&["version"]).is_ok() {
                break;
            }
            if Instant::now() >= deadline {
                return Err(self.not_ready("containerd", 60));
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        let pid = self.containerd.as_ref().and_then(ChildGuard::pid);
        self.mount_ns = pid
            .and_then(|p| std::fs::read_link(format!("/proc/{p}/ns/mnt")).ok())
            .map(|l| l.to_string_lossy().into_owned());
        let host_ns = std::fs::read_link("/proc/self/ns/mnt")
            .ok()
            .map(|l| l.to_string_lossy().into_owned());
        if self.mount_ns.is_none() || self.mount_ns == host_ns {
            return Err(BedError::io(
                "checking containerd's mount namespace",
                std::io::Error::other("containerd is not in a private mount namespace"),
            ));
        }
        Ok(())
    }

    fn kubelet_args(
        &self,
        cluster: &Cluster,
        root: &Path,
        options: &RealNodeOptions,
    ) -> Result<Vec<String>, BedError> {
        let r = root.display();
        let port = free_port()?;
        let healthz = free_port()?;
        let mut config = format!(
            r#"apiVersion: kubelet.config.k8s.io/v1beta1
kind: KubeletConfiguration
# Only cgroup v1 hierarchies are mounted here; kubelet 1.35 refuses v1 unless told.
failCgroupV1: false
cgroupDriver: cgroupfs
failSwapOn: false
# Otherwise the kubelet adds KUBE-* iptables chains to the host.
makeIPTablesUtilChains: false
containerRuntimeEndpoint: unix://{r}/containerd.sock
imageServiceEndpoint: unix://{r}/containerd.sock
address: 127.0.0.1
port: {port}
readOnlyPort: 0
healthzBindAddress: 127.0.0.1
healthzPort: {healthz}
authentication:
  anonymous:
    enabled: true
  webhook:
    enabled: false
authorization:
  mode: AlwaysAllow
nodeStatusUpdateFrequency: {status}s
nodeStatusReportFrequency: {status}s
syncFrequency: 5s
volumePluginDir: {r}/volume-plugins
resolvConf: ""
# The host's disk is shared and often fuller than the default thresholds; never evict or
# garbage-collect the imported images (they cannot be pulled again).
evictionHard:
  memory.available: "1Mi"
  nodefs.available: "1%"
  imagefs.available: "1%"
  nodefs.inodesFree: "1%"
imageGCHighThresholdPercent: 100
imageGCLowThresholdPercent: 99
serializeImagePulls: false
"#,
            status = options.status_update.as_secs().max(1),
        );
        config.push_str(&kubelet_feature_gates(&options.feature_gates));
        write(&root.join("kubelet.yaml"), &config)?;
        let mut args = vec![
            format!("--config={r}/kubelet.yaml"),
            format!("--kubeconfig={}", cluster.kubeconfig().display()),
        ];
        if !options.labels.is_empty() {
            let labels: Vec<String> = options
                .labels
                .iter()
                .map(|(k, v)| format!("{k}={v}"))
                .collect();
            args.push(format!("--node-labels={}", labels.join(",")));
        }
        Ok(args)
    }

    fn spawn_kubelet(&mut self, log: &str) -> Result<(), BedError> {
        let pid = self
            .containerd
            .as_ref()
            .and_then(ChildGuard::pid)
            .ok_or_else(|| {
                BedError::io(
                    "starting the kubelet",
                    std::io::Error::other("containerd is not running"),
                )
            })?;
        // In containerd's mount namespace, so that both see the same /var/lib/kubelet (nsenter
        // execs in place for a mount namespace: the guard's pid is the kubelet's).
        let mut cmd = Command::new("nsenter");
        cmd.arg(format!("--mount=/proc/{pid}/ns/mnt"))
            .arg("--")
            .arg(&self.kubelet_bin)
            .args(&self.kubelet_args)
            .env(
                "PATH",
                path_with(self.kubelet_bin.parent().unwrap_or(Path::new("/"))),
            );
        self.kubelet = Some(ChildGuard::spawn("kubelet", cmd, &self.dir().join(log))?);
        Ok(())
    }

    fn wait_ready(&mut self, cluster: &Cluster) -> Result<(), BedError> {
        let name = self.name.clone();
        let mut died = None;
        let ready = wait_until(
            &format!("real node {name} Ready"),
            Duration::from_secs(90),
            || {
                if let Err(e) = self.check_alive() {
                    died = Some(e);
                    return true;
                }
                cluster
                    .kubectl(&[
                        "get",
                        "node",
                        &name,
                        "-o",
                        "jsonpath={.status.conditions[?(@.type==\"Ready\")].status}",
                    ])
                    .is_ok_and(|s| s.trim() == "True")
            },
        );
        match (died, ready) {
            (Some(e), _) => Err(e),
            (None, Ok(())) => Ok(()),
            (None, Err(_)) => Err(self.not_ready("kubelet", 90)),
        }
    }

    fn not_ready(&self, what: &str, seconds: u64) -> BedError {
        let process = match what {
            "kubelet" => self.kubelet.as_ref(),
            _ => self.containerd.as_ref(),
        };
        BedError::NotReady {
            what: what.to_string(),
            seconds,
            log: process
                .map(|p| p.log_path().to_path_buf())
                .unwrap_or_default(),
            tail: process.map(|p| p.last_lines(30)).unwrap_or_default(),
        }
    }

    /// Everything the node started, by pid: kubelet first (so it restarts nothing), then the
    /// containers (the kubepods cgroups), the shims (containerd's mount namespace), containerd.
    fn teardown(&mut self) {
        if let Some(mut k) = self.kubelet.take() {
            k.stop();
        }
        let deadline = Instant::now() + Duration::from_secs(20);
        let mut killed = Vec::new();
        loop {
            let pods = kubepods_pids();
            let shims = self.namespace_pids();
            // Gone from its cgroup is not yet gone: wait until whoever inherited them reaped them.
            killed.retain(|pid| Path::new(&format!("/proc/{pid}")).exists());
            if pods.is_empty() && shims.is_empty() && killed.is_empty() {
                break;
            }
            for pid in pods.iter().chain(&shims) {
                kill(*pid);
                killed.push(*pid);
            }
            if Instant::now() >= deadline {
                eprintln!("real node: processes still running after 20 s: {pods:?} {shims:?}");
                break;
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        if let Some(mut c) = self.containerd.take() {
            c.stop();
        }
        // The namespace (and with it every mount made inside) is gone with its last process.
        let _ = Command::new("ip")
            .args(["link", "delete", &self.bridge])
            .stderr(Stdio::null())
            .status();
        remove_kubepods_cgroups();
        restore_sysctls(&self.sysctls);
        for dir in self.created_dirs.drain(..).rev() {
            let _ = std::fs::remove_dir(dir);
        }
        if let Some(file) = self.record.take() {
            let _ = std::fs::remove_file(file);
        }
    }

    /// Processes (other than the kubelet and containerd) in the node's mount namespace: the shims.
    fn namespace_pids(&self) -> Vec<u32> {
        let Some(ns) = &self.mount_ns else {
            return Vec::new();
        };
        let own = self.pids();
        proc_pids()
            .into_iter()
            .filter(|pid| !own.contains(pid))
            .filter(|pid| {
                std::fs::read_link(format!("/proc/{pid}/ns/mnt"))
                    .is_ok_and(|l| l.to_string_lossy() == ns.as_str())
            })
            .collect()
    }
}

impl Drop for RealNode {
    fn drop(&mut self) {
        self.teardown();
    }
}

/// The KubeletConfiguration's `featureGates:` map for `gates`, nothing when there are none.
fn kubelet_feature_gates(gates: &[String]) -> String {
    if gates.is_empty() {
        return String::new();
    }
    let mut text = String::from("featureGates:\n");
    for gate in gates {
        text.push_str(&format!("  {gate}: true\n"));
    }
    text
}

fn kubelet_log_name(restart: u32) -> String {
    if restart == 0 {
        "kubelet.log".into()
    } else {
        format!("kubelet-{restart}.log")
    }
}

/// The images of tests/k8s/node-images.sh (built once, cached).
pub fn node_images() -> Result<NodeImages, BedError> {
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../../tests/k8s/node-images.sh");
    let out = Command::new(&script)
        .stdin(Stdio::null())
        .output()
        .map_err(|source| BedError::Spawn {
            what: script.display().to_string(),
            source,
        })?;
    let text = String::from_utf8_lossy(&out.stdout);
    let get = |key: &str| {
        text.lines()
            .find_map(|l| l.strip_prefix(&format!("{key}=")))
            .map(str::to_string)
    };
    match (
        out.status.success(),
        get("GPUOPS_PAUSE_IMAGE"),
        get("GPUOPS_PAUSE_REF"),
        get("GPUOPS_BUSYBOX_IMAGE"),
        get("GPUOPS_BUSYBOX_REF"),
    ) {
        (true, Some(pause), Some(pause_ref), Some(busybox), Some(busybox_ref)) => Ok(NodeImages {
            pause: pause.into(),
            pause_ref,
            busybox: busybox.into(),
            busybox_ref,
        }),
        _ => Err(BedError::io(
            format!("building the node images ({})", script.display()),
            std::io::Error::other(String::from_utf8_lossy(&out.stderr).into_owned()),
        )),
    }
}

/// What the host must have: root, runc and the CNI plugins (Debian: runc,
/// containernetworking-plugins), unshare and nsenter (util-linux).
fn check_host() -> Result<(), BedError> {
    let missing = |what: &str, hint: &str| {
        BedError::io(
            "checking the host for a real node",
            std::io::Error::other(format!("{what} is missing: {hint}")),
        )
    };
    let uid = std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines()
                .find_map(|l| l.strip_prefix("Uid:"))
                .and_then(|l| l.split_whitespace().next().map(str::to_string))
        });
    if uid.as_deref() != Some("0") {
        return Err(missing(
            "root",
            "a real node (kubelet, containerd, runc) needs root",
        ));
    }
    if !Path::new("/usr/sbin/runc").exists() && !Path::new("/usr/bin/runc").exists() {
        return Err(missing("runc", "apt-get install runc"));
    }
    for plugin in ["bridge", "host-local", "loopback"] {
        if !Path::new("/usr/lib/cni").join(plugin).exists() {
            return Err(missing(
                &format!("/usr/lib/cni/{plugin}"),
                "apt-get install containernetworking-plugins",
            ));
        }
    }
    Ok(())
}

fn host_name() -> Result<String, BedError> {
    let name = std::fs::read_to_string("/proc/sys/kernel/hostname")
        .map_err(|e| BedError::io("reading the host name", e))?;
    // The kubelet lowercases it for the Node name.
    Ok(name.trim().to_lowercase())
}

fn path_with(bin: &Path) -> String {
    format!(
        "{}:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
        bin.display()
    )
}

fn mkdir(path: &Path) -> Result<(), BedError> {
    std::fs::create_dir_all(path)
        .map_err(|e| BedError::io(format!("creating {}", path.display()), e))
}

fn write(path: &Path, text: &str) -> Result<(), BedError> {
    std::fs::write(path, text).map_err(|e| BedError::io(format!("writing {}", path.display()), e))
}

fn save_sysctls() -> Vec<(String, String)> {
    SYSCTLS
        .iter()
        .filter_map(|k| {
            let v = std::fs::read_to_string(format!("/proc/sys/{k}")).ok()?;
            Some((k.to_string(), v.trim().to_string()))
        })
        .collect()
}

fn restore_sysctls(saved: &[(String, String)]) {
    for (k, v) in saved {
        let path = format!("/proc/sys/{k}");
        if std::fs::read_to_string(&path).is_ok_and(|now| now.trim() != v)
            && let Err(e) = std::fs::write(&path, v)
        {
            eprintln!("real node: could not restore {k}={v}: {e}");
        }
    }
}

/// A record for scripts/test: if this process dies without dropping the node, the script kills
/// what runs in its mount namespace and its kubepods cgroups, restores the sysctls, deletes the
/// bridge and the mount points it created (see child::record).
fn record_node(node: &RealNode) -> Option<PathBuf> {
    let file = record(std::process::id(), "real node")?;
    let mut text = format!("bridge {}\n", node.bridge);
    if let Some(ns) = &node.mount_ns {
        text.push_str(&format!("mntns {ns}\n"));
    }
    for dir in &node.created_dirs {
        text.push_str(&format!("dir {}\n", dir.display()));
    }
    // containerd's content and snapshots: hundreds of MB once images are imported.
    text.push_str(&format!("tree {}\n", node.dir.path().display()));
    for (k, v) in &node.sysctls {
        text.push_str(&format!("sysctl {} {v}\n", k.replace('/', ".")));
    }
    let node_file = file.with_file_name(format!("node-{}", std::process::id()));
    let _ = std::fs::remove_file(&file);
    std::fs::write(&node_file, text).ok()?;
    Some(node_file)
}

fn proc_pids() -> Vec<u32> {
    std::fs::read_dir("/proc")
        .map(|entries| {
            entries
                .filter_map(|e| e.ok()?.file_name().to_str()?.parse().ok())
                .collect()
        })
        .unwrap_or_default()
}

fn kill(pid: u32) {
    let _ = Command::new("kill")
        .args(["-KILL", &pid.to_string()])
        .stderr(Stdio::null())
        .status();
}

/// Every cgroup v1 hierarchy's `kubepods` tree (the kubelet's, with cgroupfs and the default
/// cgroup root), and the unified one on a cgroup v2 host.
fn kubepods_roots() -> Vec<PathBuf> {
    let base = Path::new("/sys/fs/cgroup");
    let mut roots = vec![base.join("kubepods")];
    if let Ok(entries) = std::fs::read_dir(base) {
        roots.extend(entries.filter_map(|e| Some(e.ok()?.path().join("kubepods"))));
    }
    roots.into_iter().filter(|p| p.is_dir()).collect()
}

fn cgroup_dirs(root: &Path, out: &mut Vec<PathBuf>) {
    if let Ok(entries) = std::fs::read_dir(root) {
        for e in entries.flatten() {
            let p = e.path();
            if p.is_dir() {
                cgroup_dirs(&p, out);
            }
        }
    }
    out.push(root.to_path_buf());
}

fn kubepods_pids() -> Vec<u32> {
    let mut dirs = Vec::new();
    for root in kubepods_roots() {
        cgroup_dirs(&root, &mut dirs);
    }
    let mut pids: Vec<u32> = dirs
        .iter()
        .filter_map(|d| std::fs::read_to_string(d.join("cgroup.procs")).ok())
        .flat_map(|t| {
            t.split_whitespace()
                .filter_map(|p| p.parse().ok())
                .collect::<Vec<u32>>()
        })
        .collect();
    pids.sort_unstable();
    pids.dedup();
    pids
}

/// Removes the kubepods trees, deepest first (rmdir of an empty cgroup; files need not go).
fn remove_kubepods_cgroups() {
    for root in kubepods_roots() {
        let mut dirs = Vec::new();
        cgroup_dirs(&root, &mut dirs); // children before parents
        for d in dirs {
            if let Err(e) = std::fs::remove_dir(&d) {
                eprintln!("real node: could not remove cgroup {}: {e}", d.display());
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn kubelet_gates_are_a_config_map_and_absent_by_default() {
        assert_eq!(
            kubelet_feature_gates(&RealNodeOptions::default().feature_gates),
            ""
        );
        let options = RealNodeOptions::default().with_dra();
        assert_eq!(
            kubelet_feature_gates(&options.feature_gates),
            "featureGates:\n  DRAPartitionableDevices: true\n  DRADeviceTaints: true\n  DRAExtendedResource: true\n"
        );
    }
}
