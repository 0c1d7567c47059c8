//! `Config::redact`: upstream's secret fields and talos-rs's further ones become `******`
//! when set; nothing else changes.
#![allow(clippy::unwrap_used)] // tests: a failed unwrap is a failed test

use machinery::config::{Config, REDACTED};

const CONFIG: &str = "\
version: v1alpha1
machine:
  type: controlplane
  token: abcdef.0123456789abcdef
  ca: {crt: Y3J0, key: a2V5}
  registries:
    config:
      reg.example.com:
        auth: {username: me, password: hunter2, auth: bWU6aHVudGVyMg==, identityToken: tok}
        tls: {clientIdentity: {crt: Y2xpZW50, key: Y2xpZW50a2V5}}
  systemDiskEncryption:
    state:
      provider: luks2
      keys: [{static: {passphrase: sesame}, slot: 0}]
  env:
    https_proxy: http://me:proxypass@proxy:3128
  files:
    - {content: filesecret, path: /var/f, permissions: 0o600, op: create}
  network:
    interfaces:
      - interface: wg0
        wireguard: {privateKey: d2dwcml2, listenPort: 51820}
      - interface: eth0
        vip: {ip: 10.0.0.9, hcloud: {apiToken: hctoken}}
cluster:
  id: Y2x1c3Rlcmlk
  secret: c2VjcmV0
  token: ghijkl.0123456789abcdef
  secretboxEncryptionSecret: c2VjcmV0Ym94
  ca: {crt: a3Nj, key: azhza2V5}
  aggregatorCA: {crt: YWdn, key: YWdna2V5}
  serviceAccount: {key: c2FrZXk=}
  etcd: {ca: {crt: ZXRjZA==, key: ZXRjZGtleQ==}}
  extraManifestHeaders: {Authorization: Bearer headersecret}
  inlineManifests:
    - {name: creds, contents: 'kind: Secret'}
---
apiVersion: v1alpha1
kind: WireguardConfig
name: wg1
privateKey: d2cxcHJpdg==
peers:
  - publicKey: cHVi
    presharedKey: cHNr
---
apiVersion: v1alpha1
kind: HostnameConfig
hostname: node-1
";

#[test]
fn every_secret_is_redacted_and_nothing_else_changes() {
    let config = Config::from_yaml(CONFIG).unwrap();
    let redacted = config.redacted();
    let text = redacted.to_yaml().unwrap();
    for secret in [
        "abcdef.0123456789abcdef",
        "a2V5",
        "hunter2",
        "bWU6aHVudGVyMg==",
        "identityToken: tok",
        "Y2xpZW50a2V5",
        "sesame",
        "d2dwcml2",
        "hctoken",
        "c2VjcmV0",
        "ghijkl.0123456789abcdef",
        "c2VjcmV0Ym94",
        "azhza2V5",
        "YWdna2V5",
        "c2FrZXk=",
        "ZXRjZGtleQ==",
        "d2cxcHJpdg==",
        "cHNr",
        "proxypass",
        "filesecret",
        "headersecret",
        "kind: Secret",
    ] {
        assert!(CONFIG.contains(secret));
        assert!(!text.contains(secret), "{secret} is in\n{text}");
    }
    // What is no secret stays: certificates, ids, names, public keys, other documents.
    for kept in [
        "Y3J0",
        "Y2x1c3Rlcmlk",
        "username: me",
        "Y2xpZW50\n",
        "a3Nj",
        "ZXRjZA==",
        "cHVi",
        "hostname: node-1",
        "10.0.0.9",
        "listenPort: 51820",
    ] {
        assert!(text.contains(kept), "{kept:?} is gone from\n{text}");
    }
    assert_eq!(text.matches(REDACTED).count(), 22, "{text}");
    // It decodes and is idempotent.
    let again = Config::from_yaml(&text)
        .unwrap()
        .redacted()
        .to_yaml()
        .unwrap();
    assert_eq!(again, text);
    // Unset secrets stay unset (a worker's config has no CA key to redact).
    let worker =
        Config::from_yaml("version: v1alpha1\nmachine:\n  type: worker\n  ca: {crt: Y3J0}\n")
            .unwrap();
    let text = worker.redacted().to_yaml().unwrap();
    assert!(!text.contains(REDACTED), "{text}");
}
