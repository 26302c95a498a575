//! GPU nodes played by the Go harness that embeds the kubelet's device manager, and the tiny test
//! device plugin that registers with it.

use crate::child::ChildGuard;
use crate::{BedError, Cluster, wait_until};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

/// One harness node: a Node object kept Ready, a kubelet device manager on its plugin directory,
/// allocations for pods bound to it, and the PodResources API.
#[derive(Debug)]
pub struct HarnessNode {
    pub name: String,
    dir: PathBuf,
    kubeconfig: PathBuf,
    bin: PathBuf,
    process: ChildGuard,
}

/// What the device manager allocated to one pod, as the harness recorded it.
#[derive(Debug, Clone)]
pub struct Allocation(pub serde_json::Value);

impl Allocation {
    /// Device ids of `resource` given to any container of the pod.
    pub fn devices(&self, resource: &str) -> Vec<String> {
        self.containers()
            .iter()
            .flat_map(|c| {
                c["devices"][resource]
                    .as_array()
                    .map(|ids| {
                        ids.iter()
                            .filter_map(|i| i.as_str().map(str::to_string))
                            .collect::<Vec<_>>()
                    })
                    .unwrap_or_default()
            })
            .collect()
    }

    /// The value of an environment variable set for the first container that has it.
    pub fn env(&self, name: &str) -> Option<String> {
        self.containers()
            .iter()
            .find_map(|c| c["envs"][name].as_str().map(str::to_string))
    }

    fn containers(&self) -> Vec<serde_json::Value> {
        match &self.0 {
            serde_json::Value::Array(list) => list.clone(),
            serde_json::Value::Object(map) => match map.get("containers") {
                Some(serde_json::Value::Array(list)) => list.clone(),
                _ => vec![self.0.clone()],
            },
            _ => Vec::new(),
        }
    }
}

impl HarnessNode {
    /// Starts a harness node and waits until its Node is Ready.
    pub fn start(cluster: &Cluster, name: &str) -> Result<HarnessNode, BedError> {
        let bin = crate::binaries(&["gpu-node-harness", "test-device-plugin"])?;
        let dir = cluster.dir().join("nodes").join(name);
        for sub in ["device-plugins", "state"] {
            std::fs::create_dir_all(dir.join(sub))
                .map_err(|e| BedError::io(format!("creating {}", dir.join(sub).display()), e))?;
        }
        let process = spawn(&bin, &cluster.kubeconfig(), name, &dir, "harness.log")?;
        let mut node = HarnessNode {
            name: name.to_string(),
            dir,
            kubeconfig: cluster.kubeconfig(),
            bin,
            process,
        };
        node.wait_ready(cluster)?;
        Ok(node)
    }

    /// The node's device plugin directory (where kubelet.sock is).
    pub fn plugin_dir(&self) -> PathBuf {
        self.dir.join("device-plugins")
    }

    /// The PodResources API socket.
    pub fn pod_resources_socket(&self) -> PathBuf {
        self.dir.join("pod-resources.sock")
    }

    /// Where the harness records allocations.
    pub fn state_dir(&self) -> PathBuf {
        self.dir.join("state")
    }

    /// The allocation recorded for a pod, once there is one.
    pub fn allocation(&self, namespace: &str, pod: &str) -> Option<Allocation> {
        let path = self
            .state_dir()
            .join("allocations")
            .join(format!("{namespace}_{pod}.json"));
        let text = std::fs::read_to_string(path).ok()?;
        serde_json::from_str(&text).ok().map(Allocation)
    }

    /// Restarts like a kubelet does: stop, then start again (the device manager deletes the
    /// plugin sockets, so plugins must re-register).
    pub fn restart(&mut self, cluster: &Cluster, crash: bool) -> Result<(), BedError> {
        if crash {
            self.process.kill();
        } else {
            self.process.stop();
        }
        self.process = spawn(
            &self.bin,
            &self.kubeconfig,
            &self.name,
            &self.dir,
            "harness-restarted.log",
        )?;
        self.wait_ready(cluster)
    }

    fn wait_ready(&mut self, cluster: &Cluster) -> Result<(), BedError> {
        let name = self.name.clone();
        let mut died = None;
        let ready = wait_until(
            &format!("node {name} Ready"),
            Duration::from_secs(60),
            || {
                if let Err(e) = self.process.check_alive() {
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
        match died {
            Some(e) => Err(e),
            None => ready,
        }
    }

    /// Starts a test device plugin on this node.
    pub fn plugin(&self, resource: &str, count: u32) -> Result<TestPlugin, BedError> {
        let mut cmd = Command::new(self.bin.join("test-device-plugin"));
        cmd.arg(format!("--plugin-dir={}", self.plugin_dir().display()))
            .arg(format!("--resource={resource}"))
            .arg(format!("--count={count}"));
        let log = self
            .dir
            .join(format!("plugin-{}.log", resource.replace('/', "_")));
        Ok(TestPlugin {
            process: ChildGuard::spawn("test-device-plugin", cmd, &log)?,
        })
    }

    /// The harness process id.
    pub fn pid(&self) -> Option<u32> {
        self.process.pid()
    }
}

fn spawn(
    bin: &Path,
    kubeconfig: &Path,
    name: &str,
    dir: &Path,
    log: &str,
) -> Result<ChildGuard, BedError> {
    let mut cmd = Command::new(bin.join("gpu-node-harness"));
    cmd.arg(format!("--kubeconfig={}", kubeconfig.display()))
        .arg(format!("--node-name={name}"))
        .arg(format!(
            "--plugin-dir={}",
            dir.join("device-plugins").display()
        ))
        .arg(format!(
            "--pod-resources-socket={}",
            dir.join("pod-resources.sock").display()
        ))
        .arg(format!("--state-dir={}", dir.join("state").display()));
    ChildGuard::spawn(&format!("gpu-node-harness {name}"), cmd, &dir.join(log))
}

/// A running test device plugin; stopped when dropped.
#[derive(Debug)]
pub struct TestPlugin {
    process: ChildGuard,
}

impl TestPlugin {
    pub fn pid(&self) -> Option<u32> {
        self.process.pid()
    }

    /// Checks the plugin is still running.
    pub fn check_alive(&mut self) -> Result<(), BedError> {
        self.process.check_alive()
    }
}
