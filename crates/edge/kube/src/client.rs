//! The one client builder: every gpuops command that reads a cluster fills [`ClientOptions`].

use crate::error::KubeError;
use kube::config::{KubeConfigOptions, Kubeconfig};
use std::path::PathBuf;
use std::time::Duration;

/// How long one request (not a watch) may take by default.
pub const DEFAULT_REQUEST_TIMEOUT: Duration = Duration::from_secs(15);

/// Which cluster to talk to and how patiently; the binary fills it from its flags (no clap here).
#[derive(Debug, Clone)]
pub struct ClientOptions {
    /// A kubeconfig file; `None`: KUBECONFIG, ~/.kube/config, then the in-cluster service account.
    pub kubeconfig: Option<PathBuf>,
    /// A context of that kubeconfig; `None`: its current context.
    pub context: Option<String>,
    /// Deadline of every request this crate sends, and of connecting.
    pub request_timeout: Duration,
    /// `User-Agent` of every request (the apiserver's audit log and metrics show it).
    pub user_agent: String,
}

impl Default for ClientOptions {
    fn default() -> Self {
        ClientOptions {
            kubeconfig: None,
            context: None,
            request_timeout: DEFAULT_REQUEST_TIMEOUT,
            user_agent: format!("gpuops/{}", env!("CARGO_PKG_VERSION")),
        }
    }
}

impl ClientOptions {
    /// The client configuration these options name.
    pub async fn config(&self) -> Result<kube::Config, KubeError> {
        let options = KubeConfigOptions {
            context: self.context.clone(),
            ..KubeConfigOptions::default()
        };
        let mut config = match &self.kubeconfig {
            Some(path) => {
                let kubeconfig =
                    Kubeconfig::read_from(path).map_err(|e| KubeError::Kubeconfig {
                        path: path.display().to_string(),
                        message: e.to_string(),
                    })?;
                kube::Config::from_custom_kubeconfig(kubeconfig, &options)
                    .await
                    .map_err(|e| KubeError::Kubeconfig {
                        path: path.display().to_string(),
                        message: e.to_string(),
                    })?
            }
            None if self.context.is_some() => kube::Config::from_kubeconfig(&options)
                .await
                .map_err(|e| KubeError::Kubeconfig {
                    path: std::env::var("KUBECONFIG").unwrap_or_else(|_| "~/.kube/config".into()),
                    message: e.to_string(),
                })?,
            None => kube::Config::infer().await.map_err(|e| KubeError::Config {
                source: Box::new(e),
            })?,
        };
        config.connect_timeout = Some(self.request_timeout);
        config.write_timeout = Some(self.request_timeout);
        // No read timeout on the connection: watches stay open for minutes without a byte.
        // Requests get their deadline from the writer instead.
        config.read_timeout = None;
        if let Ok(agent) = http::HeaderValue::from_str(&self.user_agent) {
            config.headers.push((http::header::USER_AGENT, agent));
        }
        Ok(config)
    }

    /// A client for these options.
    pub async fn client(&self) -> Result<kube::Client, KubeError> {
        let config = self.config().await?;
        kube::Client::try_from(config).map_err(|source| KubeError::Api {
            what: "building the Kubernetes client".into(),
            source,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_missing_kubeconfig_or_context_is_named() {
        let missing = ClientOptions {
            kubeconfig: Some("/nonexistent/kubeconfig".into()),
            ..ClientOptions::default()
        };
        let err = missing.config().await.unwrap_err().to_string();
        assert!(err.contains("/nonexistent/kubeconfig"), "{err}");

        let dir = std::env::temp_dir().join(format!("gpuops-kube-test-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let file = dir.join("config");
        std::fs::write(
            &file,
            "apiVersion: v1\nkind: Config\nclusters:\n- name: c\n  cluster:\n    server: http://127.0.0.1:1\ncontexts:\n- name: here\n  context:\n    cluster: c\n    user: u\nusers:\n- name: u\n  user: {}\ncurrent-context: here\n",
        )
        .unwrap();
        let ok = ClientOptions {
            kubeconfig: Some(file.clone()),
            request_timeout: Duration::from_secs(3),
            ..ClientOptions::default()
        };
        let config = ok.config().await.unwrap();
        assert_eq!(config.cluster_url.to_string(), "http://127.0.0.1:1/");
        assert_eq!(config.connect_timeout, Some(Duration::from_secs(3)));
        assert!(
            config
                .headers
                .iter()
                .any(|(k, v)| k == http::header::USER_AGENT
                    && v.to_str().unwrap().starts_with("gpuops/"))
        );
        let wrong_context = ClientOptions {
            kubeconfig: Some(file),
            context: Some("elsewhere".into()),
            ..ClientOptions::default()
        };
        let err = wrong_context.config().await.unwrap_err().to_string();
        assert!(err.contains("elsewhere"), "{err}");
        let _ = std::fs::remove_dir_all(dir);
    }
}
