//! Flags shared by the commands that read a cluster or metrics, and the library options they build.

use anyhow::{Context, Result};
use gpuops_kube::ClientOptions;
use gpuops_observe::{HttpOptions, MetricSources};
use std::path::PathBuf;

/// Which cluster to talk to, as kubectl takes it.
#[derive(Debug, Clone, Default, clap::Args)]
pub struct KubeArgs {
    /// Path to the kubeconfig file (default: $KUBECONFIG, ~/.kube/config, else in-cluster).
    #[arg(long, value_name = "FILE")]
    pub kubeconfig: Option<PathBuf>,
    /// The kubeconfig context to use (default: its current-context).
    #[arg(long, value_name = "NAME")]
    pub context: Option<String>,
}

impl KubeArgs {
    /// The shared client builder's options for these flags.
    pub fn options(&self) -> ClientOptions {
        ClientOptions {
            kubeconfig: self.kubeconfig.clone(),
            context: self.context.clone(),
            ..ClientOptions::default()
        }
    }

    /// The flag to blame when the client cannot be built.
    pub fn blame(&self) -> String {
        flag_blame(self.kubeconfig.as_deref(), self.context.as_deref())
    }

    /// The client for `doctor` and `top`; an error names the flag that is wrong.
    pub async fn client(&self) -> Result<kube::Client> {
        gpuops_observe::client(&self.options())
            .await
            .with_context(|| self.blame())
    }
}

/// `--kubeconfig FILE`, `--context NAME` or where the configuration was looked for.
pub fn flag_blame(kubeconfig: Option<&std::path::Path>, context: Option<&str>) -> String {
    match (kubeconfig, context) {
        (Some(path), Some(ctx)) => format!("--kubeconfig {} --context {ctx}", path.display()),
        (Some(path), None) => format!("--kubeconfig {}", path.display()),
        (None, Some(ctx)) => format!("--context {ctx}"),
        (None, None) => "finding the cluster (KUBECONFIG, ~/.kube/config or in-cluster)".into(),
    }
}

/// How to authenticate to Prometheus (and to the `--metrics` URLs, which share the flags).
#[derive(Debug, Clone, Default, clap::Args)]
pub struct HttpArgs {
    /// Bearer token for --prometheus (e.g. a service account token behind an auth proxy).
    #[arg(
        long,
        value_name = "TOKEN",
        env = "GPUOPS_PROMETHEUS_TOKEN",
        hide_env_values = true
    )]
    pub prometheus_token: Option<String>,
    /// File holding the bearer token (re-read each run; what a mounted secret gives).
    #[arg(long, value_name = "FILE", conflicts_with = "prometheus_token")]
    pub prometheus_token_file: Option<PathBuf>,
    /// Basic auth for --prometheus as USER:PASSWORD (or put user:password@ in the URL).
    #[arg(
        long,
        value_name = "USER:PASSWORD",
        env = "GPUOPS_PROMETHEUS_BASIC_AUTH",
        hide_env_values = true
    )]
    pub prometheus_basic_auth: Option<String>,
    /// Extra CA certificate (PEM) to trust for https:// URLs.
    #[arg(long, value_name = "FILE")]
    pub prometheus_ca: Option<PathBuf>,
}

/// Metric source flags, shared by `doctor` and `top`.
#[derive(Debug, Clone, clap::Args)]
pub struct MetricsArgs {
    /// Prometheus base URL (http://HOST:9090 or https://...) to read GPU metrics from.
    #[arg(long, value_name = "URL", env = "GPUOPS_PROMETHEUS")]
    pub prometheus: Option<String>,
    #[command(flatten)]
    pub http: HttpArgs,
    /// An agent's metrics URL (http://NODE:9400/metrics); repeatable.
    #[arg(long = "metrics", value_name = "URL")]
    pub metrics: Vec<String>,
    /// Scrape every gpuops agent pod through the API server's pod proxy.
    #[arg(long, value_enum, value_name = "FROM")]
    pub metrics_from: Option<MetricsFrom>,
    /// Label selector of the agent pods for --metrics-from agents.
    #[arg(
        long,
        default_value = "app.kubernetes.io/name=gpuops",
        value_name = "SELECTOR"
    )]
    pub agent_selector: String,
    /// The agents' metrics port for --metrics-from agents.
    #[arg(long, default_value_t = 9400, value_name = "PORT")]
    pub agent_port: u16,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum MetricsFrom {
    /// The agent pods' /metrics, through the API server.
    Agents,
}

impl MetricsArgs {
    pub fn any(&self) -> bool {
        self.prometheus.is_some() || !self.metrics.is_empty() || self.metrics_from.is_some()
    }

    /// The sources these flags name.
    pub fn sources(&self) -> MetricSources {
        let h = &self.http;
        MetricSources {
            prometheus: self.prometheus.clone(),
            http: HttpOptions {
                prometheus_token: h.prometheus_token.clone(),
                prometheus_token_file: h.prometheus_token_file.clone(),
                prometheus_basic_auth: h.prometheus_basic_auth.clone(),
                prometheus_ca: h.prometheus_ca.clone(),
            },
            metrics: self.metrics.clone(),
            from_agents: self.metrics_from == Some(MetricsFrom::Agents),
            agent_selector: self.agent_selector.clone(),
            agent_port: self.agent_port,
        }
    }
}
