//! The plugin registration service the kubelet's plugin watcher calls on our registration socket.

use gpuops_kubelet_api::pluginregistration::v1::{
    InfoRequest, PluginInfo, RegistrationStatus, RegistrationStatusResponse,
    registration_server::Registration,
};
use gpuops_kubelet_api::{DRA_PLUGIN_TYPE, DRA_V1_SERVICE, DRA_V1BETA1_SERVICE};
use std::path::Path;
use tokio::sync::watch;
use tonic::{Request, Response, Status};

/// What the kubelet said about our registration since the registration socket was last created.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub enum RegistrationState {
    /// No verdict yet: no kubelet has found the socket, or the socket was just recreated.
    #[default]
    Waiting,
    /// The kubelet accepted the driver.
    Registered,
    /// The kubelet refused the driver, with its reason.
    Refused(String),
}

pub(crate) struct RegistrationService {
    info: PluginInfo,
    state: watch::Sender<RegistrationState>,
}

impl RegistrationService {
    pub(crate) fn new(
        driver: &str,
        endpoint: &Path,
        state: watch::Sender<RegistrationState>,
    ) -> RegistrationService {
        RegistrationService {
            info: plugin_info(driver, endpoint),
            state,
        }
    }
}

/// What we tell the kubelet: a DRA plugin serving v1 first (the kubelet takes the first version
/// it supports), v1beta1 for 1.34 kubelets.
pub(crate) fn plugin_info(driver: &str, endpoint: &Path) -> PluginInfo {
    PluginInfo {
        r#type: DRA_PLUGIN_TYPE.to_string(),
        name: driver.to_string(),
        endpoint: endpoint.to_string_lossy().into_owned(),
        supported_versions: vec![DRA_V1_SERVICE.to_string(), DRA_V1BETA1_SERVICE.to_string()],
    }
}

#[tonic::async_trait]
impl Registration for RegistrationService {
    async fn get_info(&self, _: Request<InfoRequest>) -> Result<Response<PluginInfo>, Status> {
        Ok(Response::new(self.info.clone()))
    }

    async fn notify_registration_status(
        &self,
        request: Request<RegistrationStatus>,
    ) -> Result<Response<RegistrationStatusResponse>, Status> {
        let status = request.into_inner();
        let state = if status.plugin_registered {
            tracing::info!(driver = %self.info.name, "registered with the kubelet");
            RegistrationState::Registered
        } else {
            tracing::error!(driver = %self.info.name, error = %status.error, "the kubelet refused the DRA driver");
            RegistrationState::Refused(status.error)
        };
        self.state.send_replace(state);
        Ok(Response::new(RegistrationStatusResponse {}))
    }
}
