//! The machine configuration without its secrets, for the daemons that must not see them
//! (DESIGN §2: the MachineConfig ordinary daemons read carries no private key or token).
//!
//! [`Config::redact`] replaces every secret value that is set with [`REDACTED`], as upstream's
//! `Redact("******")` does, and goes further than upstream where it stops short: upstream
//! redacts the tokens, cluster secrets and CA keys of the v1alpha1 document; talos-rs also
//! redacts registry credentials and client keys, static disk encryption passphrases, VIP API
//! tokens and WireGuard private keys, of the v1alpha1 document and of the typed documents
//! (`WireguardConfig`, `RegistryAuthConfig`, `RegistryTLSConfig`, the volume encryption keys),
//! and what users put secrets into: inline manifest contents (Kubernetes Secrets), the
//! headers extra manifests are fetched with, the contents of `machine.files` and the values
//! of `machine.env` (proxy URLs with credentials).

use serde_yaml_ng::{Mapping, Value};

use super::v1alpha1::{CertificateAndKey, Device, EncryptionConfig, PrivateKey};
use super::Config;

/// What a redacted value reads.
pub const REDACTED: &str = "******";

fn redact(value: &mut Option<String>) {
    if value.as_deref().is_some_and(|v| !v.is_empty()) {
        *value = Some(REDACTED.to_string());
    }
}

fn redact_string(value: &mut String) {
    if !value.is_empty() {
        *value = REDACTED.to_string();
    }
}

fn redact_key(pair: &mut Option<CertificateAndKey>) {
    if let Some(p) = pair {
        redact(&mut p.key);
    }
}

fn redact_private(key: &mut Option<PrivateKey>) {
    if let Some(k) = key {
        redact(&mut k.key);
    }
}

fn redact_encryption(e: &mut Option<EncryptionConfig>) {
    for key in e.iter_mut().flat_map(|e| e.keys.iter_mut()) {
        if let Some(s) = &mut key.static_key {
            redact(&mut s.passphrase);
        }
    }
}

fn redact_device(d: &mut Device) {
    if let Some(w) = &mut d.wireguard {
        redact(&mut w.private_key);
    }
    let vips = std::iter::once(&mut d.vip)
        .chain(d.vlans.iter_mut().map(|v| &mut v.vip))
        .flatten();
    for vip in vips {
        for token in [&mut vip.equinix_metal, &mut vip.hcloud]
            .into_iter()
            .flatten()
        {
            redact(&mut token.api_token);
        }
    }
}

/// Keys of typed documents that hold secrets, by kind: a key anywhere in such a document
/// (in nested mappings and lists too) is redacted.
const SECRET_DOCUMENT_KEYS: &[(&str, &[&str])] = &[
    ("WireguardConfig", &["privateKey", "presharedKey"]),
    ("RegistryAuthConfig", &["password", "auth", "identityToken"]),
    ("RegistryTLSConfig", &["key"]),
    ("VolumeConfig", &["passphrase"]),
    ("UserVolumeConfig", &["passphrase"]),
    ("RawVolumeConfig", &["passphrase"]),
    ("SwapVolumeConfig", &["passphrase"]),
];

fn redact_value(value: &mut Value, keys: &[&str]) {
    match value {
        Value::Mapping(m) => redact_mapping(m, keys),
        Value::Sequence(s) => s.iter_mut().for_each(|v| redact_value(v, keys)),
        _ => {}
    }
}

fn redact_mapping(m: &mut Mapping, keys: &[&str]) {
    for (k, v) in m.iter_mut() {
        let secret = k.as_str().is_some_and(|k| keys.contains(&k));
        match v {
            Value::String(s) if secret && !s.is_empty() => *s = REDACTED.to_string(),
            // A key that holds a mapping (`tls: {key: ...}`) is searched, not replaced whole.
            _ => redact_value(v, keys),
        }
    }
}

impl Config {
    /// Replaces every secret value that is set with [`REDACTED`] (see the module docs).
    pub fn redact(&mut self) {
        if let Some(v) = &mut self.v1alpha1 {
            if let Some(m) = &mut v.machine {
                redact(&mut m.token);
                redact_key(&mut m.ca);
                if let Some(r) = &mut m.registries {
                    for c in r.config.values_mut().flatten() {
                        if let Some(a) = &mut c.auth {
                            redact(&mut a.password);
                            redact(&mut a.auth);
                            redact(&mut a.identity_token);
                        }
                        if let Some(t) = &mut c.tls {
                            redact_key(&mut t.client_identity);
                        }
                    }
                }
                if let Some(e) = &mut m.system_disk_encryption {
                    redact_encryption(&mut e.state);
                    redact_encryption(&mut e.ephemeral);
                }
                if let Some(n) = &mut m.network {
                    n.interfaces.iter_mut().for_each(redact_device);
                }
                for f in &mut m.files {
                    redact(&mut f.content);
                }
                for v in m.env.values_mut() {
                    redact_string(v);
                }
            }
            if let Some(c) = &mut v.cluster {
                redact(&mut c.secret);
                redact(&mut c.token);
                redact(&mut c.aescbc_encryption_secret);
                redact(&mut c.secretbox_encryption_secret);
                redact_private(&mut c.service_account);
                redact_key(&mut c.ca);
                redact_key(&mut c.aggregator_ca);
                if let Some(e) = &mut c.etcd {
                    redact_key(&mut e.ca);
                }
                for m in &mut c.inline_manifests {
                    redact(&mut m.contents);
                }
                for v in c.extra_manifest_headers.values_mut() {
                    redact_string(v);
                }
            }
        }
        for doc in &mut self.documents {
            if let Some((_, keys)) = SECRET_DOCUMENT_KEYS.iter().find(|(k, _)| *k == doc.kind) {
                redact_mapping(&mut doc.value, keys);
            }
        }
    }

    /// A copy with every secret redacted.
    pub fn redacted(&self) -> Config {
        let mut c = self.clone();
        c.redact();
        c
    }
}
