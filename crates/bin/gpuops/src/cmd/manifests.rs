//! `gpuops manifests`: deploy/gpuops.yaml, the Helm chart rendered by Helm with its defaults,
//! compiled in so that the chart stays the one source (scripts/render-manifests writes the file).

use anyhow::{Result, bail};
use std::io::Write;
use std::process::ExitCode;

/// deploy/gpuops.yaml as it was when this binary was built.
pub const MANIFEST: &str = include_str!("../../../../../deploy/gpuops.yaml");

/// Print the Kubernetes objects of the gpuops node agent: the Helm chart rendered with its
/// default values (deploy/gpuops.yaml).
///
/// The Namespace `gpuops`, then what `helm template gpuops deploy/helm/gpuops --namespace gpuops`
/// renders: ServiceAccount, ClusterRole and ClusterRoleBinding (least privilege: nodes get/list/
/// watch/patch, nodes/status patch, events create/patch), the MIG config ConfigMap, the metrics
/// Service and the DaemonSet (MIG managed, MIG devices advertised with the mixed strategy).
/// For other values (image, namespace, MIG default config, ServiceMonitor, ...) render the chart
/// with Helm and its --set/-f, as docs/install.md shows.
///
/// Examples:
///   gpuops manifests | kubectl apply -f -
///   kubectl apply -f deploy/gpuops.yaml                 the same objects, from a checkout
///   helm template gpuops deploy/helm/gpuops --namespace gpu-system --set migStrategy=single
#[derive(Debug, clap::Args)]
#[command(verbatim_doc_comment)]
pub struct Args {
    /// Options this command had before it printed the rendered chart: refused with a pointer to
    /// Helm.
    #[arg(hide = true, trailing_var_arg = true, allow_hyphen_values = true)]
    rest: Vec<String>,
}

pub fn run(args: Args) -> Result<ExitCode> {
    if !args.rest.is_empty() {
        bail!(
            "gpuops manifests takes no options: it prints the chart rendered with its default \
             values (deploy/gpuops.yaml). For other values render the chart with Helm: \
             helm template gpuops deploy/helm/gpuops --namespace gpuops {}",
            args.rest.join(" ")
        );
    }
    let mut out = std::io::stdout().lock();
    // A closed pipe (`| head`) is not an error worth a message.
    match out
        .write_all(MANIFEST.as_bytes())
        .and_then(|()| out.flush())
    {
        Ok(()) => Ok(ExitCode::SUCCESS),
        Err(e) if e.kind() == std::io::ErrorKind::BrokenPipe => Ok(ExitCode::SUCCESS),
        Err(e) => Err(e.into()),
    }
}
