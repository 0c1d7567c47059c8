//! `k8s.KubeletPKIController` (ours; upstream's `KubeletServiceController.writePKI`): the
//! kubelet's bootstrap kubeconfig and the Kubernetes CAs it trusts, written on every node from
//! `secrets/KubeletSecrets` where upstream writes them (`/etc/kubernetes/bootstrap-kubeconfig`,
//! 0600, and `/etc/kubernetes/pki/ca.crt`, 0400; the image links `/etc/kubernetes` to
//! `/system/kubernetes`, k8sd's 0700 directory), rewritten atomically when they change. No
//! kubelet reads them yet: upstream's service controller also starts the kubelet here.

use std::path::PathBuf;

use base64::Engine as _;
use cosi::runtime::{Action, Context, Controller, Input, Output, ReconcileError};
use machinery::resources::secrets::{KubeletSpec as KubeletSecretsSpec, NAMESPACE as SECRETS};

use crate::etcd::pki::write_file_mode;

/// The kubelet's bootstrap kubeconfig (upstream's template, byte for byte).
pub fn bootstrap_kubeconfig(s: &KubeletSecretsSpec) -> String {
    format!(
        "apiVersion: v1\nkind: Config\nclusters:\n- name: local\n  cluster:\n    server: {}\n    certificate-authority-data: {}\nusers:\n- name: kubelet\n  user:\n    token: {}.{}\ncontexts:\n- context:\n    cluster: local\n    user: kubelet\n",
        s.endpoint,
        base64::engine::general_purpose::STANDARD.encode(accepted_cas(s)),
        s.bootstrap_token_id,
        s.bootstrap_token_secret
    )
}

/// Every accepted CA's certificate, concatenated.
fn accepted_cas(s: &KubeletSecretsSpec) -> String {
    s.accepted_cas.iter().map(|c| c.crt.as_str()).collect()
}

/// `k8s.KubeletPKIController`.
pub struct KubeletPkiController {
    dir: PathBuf,
}

impl KubeletPkiController {
    /// Writes into `dir` (`/system/kubernetes`).
    pub fn new(dir: PathBuf) -> Self {
        Self { dir }
    }
}

impl Controller for KubeletPkiController {
    fn name(&self) -> &'static str {
        "k8s.KubeletPKIController"
    }

    fn inputs(&self) -> Vec<Input> {
        vec![Input::weak::<KubeletSecretsSpec>(SECRETS).with_id("kubelet")]
    }

    fn outputs(&self) -> Vec<Output> {
        vec![]
    }

    async fn reconcile(&mut self, ctx: &mut Context) -> Result<Action, ReconcileError> {
        let Some(secrets) = ctx.get::<KubeletSecretsSpec>(SECRETS, "kubelet").await? else {
            return Ok(Action::AwaitChange);
        };
        let write = || -> std::io::Result<bool> {
            // init makes both directories (the manifest's `dirs`): k8sd's seccomp has no mkdir.
            let pki = self.dir.join("pki");
            let a = write_file_mode(
                &self.dir,
                "bootstrap-kubeconfig",
                &bootstrap_kubeconfig(&secrets.spec),
                0o600,
            )?;
            let b = write_file_mode(&pki, "ca.crt", &accepted_cas(&secrets.spec), 0o400)?;
            Ok(a || b)
        };
        match write() {
            Ok(true) => {
                tracing::info!(dir = %self.dir.display(), "kubelet bootstrap kubeconfig and CA written")
            }
            Ok(false) => {}
            Err(e) => {
                return Err(ReconcileError::failed(
                    format!("write the kubelet's files in {}", self.dir.display()),
                    e,
                ))
            }
        }
        Ok(Action::AwaitChange)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use machinery::resources::secrets::CertificatePem;

    #[test]
    fn the_bootstrap_kubeconfig_is_upstreams_template() {
        let s = KubeletSecretsSpec {
            endpoint: "https://10.5.0.2:6443".into(),
            accepted_cas: vec![
                CertificatePem { crt: "A\n".into() },
                CertificatePem { crt: "B\n".into() },
            ],
            bootstrap_token_id: "25p8ak".into(),
            bootstrap_token_secret: "vshybadgp2mhtvm7".into(),
        };
        let text = bootstrap_kubeconfig(&s);
        let v: serde_json::Value = serde_yaml_ng::from_str(&text).unwrap();
        assert_eq!(
            v["clusters"][0]["cluster"]["server"],
            "https://10.5.0.2:6443"
        );
        assert_eq!(
            v["clusters"][0]["cluster"]["certificate-authority-data"],
            base64::engine::general_purpose::STANDARD.encode("A\nB\n")
        );
        assert_eq!(v["users"][0]["user"]["token"], "25p8ak.vshybadgp2mhtvm7");
        assert_eq!(v["contexts"][0]["context"]["user"], "kubelet");
    }
}
