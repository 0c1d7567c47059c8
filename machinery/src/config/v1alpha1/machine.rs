//! `machine:` section of the v1alpha1 document.

use std::collections::BTreeMap;
use std::fmt;

use serde::{Deserialize, Serialize};
use serde_yaml_ng::Value;

use super::{Certificate, CertificateAndKey, NetworkConfig};

/// Machine-specific configuration (`machine`).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields, rename_all = "camelCase")]
pub struct MachineConfig {
    /// Role of the machine: `controlplane`, `worker` (legacy `init`).
    #[serde(rename = "type", skip_serializing_if = "Option::is_none")]
    pub machine_type: Option<String>,
    /// Token used to join the PKI of the cluster (trustd).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub token: Option<String>,
    /// Talos API root CA (key only on control plane machines).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub ca: Option<CertificateAndKey>,
    /// CAs accepted in addition to `ca`.
    #[serde(rename = "acceptedCAs", skip_serializing_if = "Vec::is_empty")]
    pub accepted_cas: Vec<Certificate>,
    /// Extra SANs of the machine's API certificate.
    #[serde(rename = "certSANs", skip_serializing_if = "Vec::is_empty")]
    pub cert_sans: Vec<String>,
    /// Machine-level control plane options.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub control_plane: Option<MachineControlPlaneConfig>,
    /// Kubelet options.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub kubelet: Option<KubeletConfig>,
    /// Static pod manifests run by the kubelet.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub pods: Vec<Value>,
    /// Network configuration.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub network: Option<NetworkConfig>,
    /// Deprecated: extra disks to partition and mount.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub disks: Vec<MachineDisk>,
    /// Installation options.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub install: Option<InstallConfig>,
    /// Files to write under `/var`.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub files: Vec<MachineFile>,
    /// Environment variables for PID 1 and every service.
    #[serde(skip_serializing_if = "BTreeMap::is_empty")]
    pub env: BTreeMap<String, String>,
    /// Deprecated: time synchronisation.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub time: Option<TimeConfig>,
    /// Kernel sysctls.
    #[serde(skip_serializing_if = "BTreeMap::is_empty")]
    pub sysctls: BTreeMap<String, String>,
    /// sysfs values.
    #[serde(skip_serializing_if = "BTreeMap::is_empty")]
    pub sysfs: BTreeMap<String, String>,
    /// Deprecated: image registry mirrors and credentials.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub registries: Option<RegistriesConfig>,
    /// Deprecated: system disk encryption.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub system_disk_encryption: Option<SystemDiskEncryptionConfig>,
    /// Feature switches.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub features: Option<FeaturesConfig>,
    /// udev rules.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub udev: Option<UdevConfig>,
    /// Log shipping.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub logging: Option<LoggingConfig>,
    /// Kernel modules.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub kernel: Option<KernelConfig>,
    /// Seccomp profiles made available to pods.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub seccomp_profiles: Vec<MachineSeccompProfile>,
    /// Overrides of the default OCI runtime spec of CRI containers.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub base_runtime_spec_overrides: Option<Value>,
    /// Labels of the Kubernetes node.
    #[serde(skip_serializing_if = "BTreeMap::is_empty")]
    pub node_labels: BTreeMap<String, String>,
    /// Annotations of the Kubernetes node.
    #[serde(skip_serializing_if = "BTreeMap::is_empty")]
    pub node_annotations: BTreeMap<String, String>,
    /// Taints of the Kubernetes node (`key: value:Effect`).
    #[serde(skip_serializing_if = "BTreeMap::is_empty")]
    pub node_taints: BTreeMap<String, String>,
}

/// A seccomp profile (`machine.seccompProfiles[]`).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct MachineSeccompProfile {
    /// File name of the profile.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
    /// The profile itself.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub value: Option<Value>,
}

/// `machine.controlPlane`.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields, rename_all = "camelCase")]
pub struct MachineControlPlaneConfig {
    /// Controller manager on this node.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub controller_manager: Option<DisabledFlag>,
    /// Scheduler on this node.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub scheduler: Option<DisabledFlag>,
}

/// A `{disabled: bool}` switch.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct DisabledFlag {
    /// Disables the component.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub disabled: Option<bool>,
}

/// `machine.kubelet`.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields, rename_all = "camelCase")]
pub struct KubeletConfig {
    /// Kubelet image.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub image: Option<String>,
    /// Cluster DNS server IPs.
    #[serde(rename = "clusterDNS", skip_serializing_if = "Vec::is_empty")]
    pub cluster_dns: Vec<String>,
    /// Extra kubelet flags.
    #[serde(skip_serializing_if = "BTreeMap::is_empty")]
    pub extra_args: BTreeMap<String, String>,
    /// Extra mounts of the kubelet container.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub extra_mounts: Vec<ExtraMount>,
    /// KubeletConfiguration overrides.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub extra_config: Option<Value>,
    /// CredentialProviderConfig.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub credential_provider_config: Option<Value>,
    /// Runtime default seccomp profile.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub default_runtime_seccomp_profile_enabled: Option<bool>,
    /// Register the node with its FQDN.
    #[serde(rename = "registerWithFQDN", skip_serializing_if = "Option::is_none")]
    pub register_with_fqdn: Option<bool>,
    /// Selection of the `--node-ip`.
    #[serde(rename = "nodeIP", skip_serializing_if = "Option::is_none")]
    pub node_ip: Option<KubeletNodeIpConfig>,
    /// Run the kubelet standalone.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub skip_node_registration: Option<bool>,
    /// Do not read static pods from /etc/kubernetes/manifests.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub disable_manifests_directory: Option<bool>,
}

/// `machine.kubelet.nodeIP`.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields, rename_all = "camelCase")]
pub struct KubeletNodeIpConfig {
    /// Subnets to pick the node IP from (`!` excludes).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub valid_subnets: Vec<String>,
}

/// An extra mount of the kubelet container (OCI mount).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields, rename_all = "camelCase")]
pub struct ExtraMount {
    /// Absolute path in the container.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub destination: Option<String>,
    /// Mount type.
    #[serde(rename = "type", skip_serializing_if = "Option::is_none")]
    pub mount_type: Option<String>,
    /// Source path.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub source: Option<String>,
    /// fstab-style options.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub options: Vec<String>,
    /// UID mappings.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub uid_mappings: Vec<IdMapping>,
    /// GID mappings.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub gid_mappings: Vec<IdMapping>,
}

/// A Linux ID mapping.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct IdMapping {
    /// First ID in the container.
    #[serde(rename = "containerID", skip_serializing_if = "Option::is_none")]
    pub container_id: Option<u32>,
    /// First ID on the host.
    #[serde(rename = "hostID", skip_serializing_if = "Option::is_none")]
    pub host_id: Option<u32>,
    /// Number of IDs.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub size: Option<u32>,
}

/// Deprecated `machine.disks[]`.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct MachineDisk {
    /// Disk device name.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub device: Option<String>,
    /// Partitions to create.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub partitions: Vec<DiskPartition>,
}

/// A partition of a deprecated extra disk.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct DiskPartition {
    /// Size: bytes, or human readable (`100 MB`); absent means the rest of the disk.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub size: Option<DiskSize>,
    /// Where to mount it.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub mountpoint: Option<String>,
}

/// A size in bytes, written either as a number or as a human readable string (`4GB`, `100 MiB`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(untagged)]
pub enum DiskSize {
    /// A number of bytes.
    Bytes(u64),
    /// A human readable size.
    Human(String),
}

/// `machine.install`.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields, rename_all = "camelCase")]
pub struct InstallConfig {
    /// Install disk, e.g. `/dev/sda`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub disk: Option<String>,
    /// Install disk lookup by attributes; has priority over `disk`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub disk_selector: Option<InstallDiskSelector>,
    /// Deprecated: extra kernel arguments.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub extra_kernel_args: Vec<String>,
    /// Installer image.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub image: Option<String>,
    /// Deprecated: system extensions.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub extensions: Vec<InstallExtensionConfig>,
    /// Deprecated, never worked.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub bootloader: Option<bool>,
    /// Wipe the disk at installation (default true).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub wipe: Option<bool>,
    /// Mark the MBR partition bootable for legacy BIOS.
    #[serde(rename = "legacyBIOSSupport", skip_serializing_if = "Option::is_none")]
    pub legacy_bios_support: Option<bool>,
    /// GRUB uses the UKI's kernel command line.
    #[serde(rename = "grubUseUKICmdline", skip_serializing_if = "Option::is_none")]
    pub grub_use_uki_cmdline: Option<bool>,
}

/// `machine.install.diskSelector`.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields, rename_all = "camelCase")]
pub struct InstallDiskSelector {
    /// Size condition, e.g. `>= 1TB`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub size: Option<String>,
    /// Disk name.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
    /// Disk model (glob).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub model: Option<String>,
    /// Serial number.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub serial: Option<String>,
    /// modalias.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub modalias: Option<String>,
    /// UUID.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub uuid: Option<String>,
    /// WWID.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub wwid: Option<String>,
    /// Disk type: `ssd`, `hdd`, `nvme`, `sd`.
    #[serde(rename = "type", skip_serializing_if = "Option::is_none")]
    pub disk_type: Option<String>,
    /// Bus path (glob).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub bus_path: Option<String>,
}

impl InstallDiskSelector {
    /// Whether the selector selects `disk`, as upstream's `DiskMatchExpression`: every field
    /// given matches (`size` a condition such as `>= 1TB`; `model`, `serial`, `modalias`,
    /// `uuid`, `wwid` and `busPath` globs, `*` not crossing a `/`; `type` `nvme`, `sd`, `hdd`
    /// or `ssd`), and the disk is writable, not a CD and has a transport (no loop or device
    /// mapper device).
    ///
    /// # Errors
    ///
    /// A field upstream does not support (`name`), or one that does not parse.
    pub fn matches(&self, disk: &crate::resources::block::DiskSpec) -> Result<bool, String> {
        if self.name.as_deref().is_some_and(|n| !n.is_empty()) {
            return Err("selector on name is not supported".into());
        }
        if disk.readonly || disk.cdrom || disk.transport.is_empty() {
            return Ok(false);
        }
        if let Some(size) = self.size.as_deref().filter(|s| !s.trim().is_empty()) {
            let t = size.trim();
            let (op, rest) = ["==", ">=", "<=", ">", "<"]
                .iter()
                .find_map(|op| t.strip_prefix(op).map(|r| (*op, r)))
                .unwrap_or(("==", t));
            let want = super::super::checks::parse_byte_size(rest)
                .map_err(|e| format!("size {size:?}: {e}"))?;
            let ok = match op {
                ">=" => disk.size >= want,
                "<=" => disk.size <= want,
                ">" => disk.size > want,
                "<" => disk.size < want,
                _ => disk.size == want,
            };
            if !ok {
                return Ok(false);
            }
        }
        let options = glob::MatchOptions {
            case_sensitive: true,
            require_literal_separator: true,
            require_literal_leading_dot: false,
        };
        for (what, pattern, value) in [
            ("model", &self.model, disk.model.as_str()),
            ("serial", &self.serial, disk.serial.as_str()),
            ("modalias", &self.modalias, disk.modalias.as_str()),
            ("uuid", &self.uuid, ""),
            ("wwid", &self.wwid, disk.wwid.as_str()),
            ("busPath", &self.bus_path, disk.bus_path.as_str()),
        ] {
            let Some(p) = pattern.as_deref().filter(|p| !p.is_empty()) else {
                continue;
            };
            let p = glob::Pattern::new(p).map_err(|e| format!("{what} {p:?}: {e}"))?;
            if !p.matches_with(value, options) {
                return Ok(false);
            }
        }
        Ok(match self.disk_type.as_deref().unwrap_or_default() {
            "" => true,
            "nvme" => disk.transport == "nvme",
            "sd" => disk.transport == "mmc",
            "hdd" => disk.rotational,
            "ssd" => !disk.rotational,
            other => return Err(format!("unknown disk type {other:?}")),
        })
    }
}

/// A deprecated system extension.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct InstallExtensionConfig {
    /// Extension image.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub image: Option<String>,
}

/// Permissions of a file, written in octal in YAML (`0o644`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(transparent)]
pub struct FileMode(pub u32);

impl fmt::Display for FileMode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "0o{:o}", self.0)
    }
}

/// A file to write (`machine.files[]`).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct MachineFile {
    /// Contents.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub content: Option<String>,
    /// Permissions.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub permissions: Option<FileMode>,
    /// Path.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub path: Option<String>,
    /// `create`, `append` or `overwrite`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub op: Option<String>,
}

/// Deprecated `machine.time`.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields, rename_all = "camelCase")]
pub struct TimeConfig {
    /// Disables time sync.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub disabled: Option<bool>,
    /// NTP servers or PTP devices.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub servers: Vec<String>,
    /// Boot timeout for time sync (Go duration).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub boot_timeout: Option<String>,
}

/// Deprecated `machine.registries`.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct RegistriesConfig {
    /// Mirrors per registry host.
    #[serde(skip_serializing_if = "BTreeMap::is_empty")]
    pub mirrors: BTreeMap<String, Option<RegistryMirrorConfig>>,
    /// TLS and auth per registry host.
    #[serde(skip_serializing_if = "BTreeMap::is_empty")]
    pub config: BTreeMap<String, Option<RegistryConfig>>,
}

/// A registry mirror.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields, rename_all = "camelCase")]
pub struct RegistryMirrorConfig {
    /// Mirror endpoint URLs.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub endpoints: Vec<String>,
    /// Use the endpoint path as is.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub override_path: Option<bool>,
    /// Do not fall back to the upstream registry.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub skip_fallback: Option<bool>,
}

/// TLS and auth of a registry.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct RegistryConfig {
    /// TLS.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub tls: Option<RegistryTlsConfig>,
    /// Authentication.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub auth: Option<RegistryAuthConfig>,
}

/// Registry TLS.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields, rename_all = "camelCase")]
pub struct RegistryTlsConfig {
    /// Client certificate for mutual TLS.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub client_identity: Option<CertificateAndKey>,
    /// Base64 CA certificate.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub ca: Option<String>,
    /// Skip server verification.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub insecure_skip_verify: Option<bool>,
}

/// Registry authentication (docker config.json fields).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields, rename_all = "camelCase")]
pub struct RegistryAuthConfig {
    /// Username.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub username: Option<String>,
    /// Password.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub password: Option<String>,
    /// Base64 `user:password`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub auth: Option<String>,
    /// Identity token.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub identity_token: Option<String>,
}

/// Deprecated `machine.systemDiskEncryption`.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct SystemDiskEncryptionConfig {
    /// STATE partition.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub state: Option<EncryptionConfig>,
    /// EPHEMERAL partition.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub ephemeral: Option<EncryptionConfig>,
}

/// Encryption of one partition.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields, rename_all = "camelCase")]
pub struct EncryptionConfig {
    /// `luks2`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub provider: Option<String>,
    /// Keys, one per slot.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub keys: Vec<EncryptionKey>,
    /// Cipher.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub cipher: Option<String>,
    /// Key length.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub key_size: Option<u32>,
    /// Sector size.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub block_size: Option<u64>,
    /// `--perf` options.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub options: Vec<String>,
}

/// One encryption key.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct EncryptionKey {
    /// Static passphrase.
    #[serde(rename = "static", skip_serializing_if = "Option::is_none")]
    pub static_key: Option<EncryptionKeyStatic>,
    /// Key derived from the node UUID.
    #[serde(rename = "nodeID", skip_serializing_if = "Option::is_none")]
    pub node_id: Option<EncryptionKeyNodeId>,
    /// KMS-sealed key.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub kms: Option<EncryptionKeyKms>,
    /// LUKS2 key slot.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub slot: Option<u32>,
    /// TPM-sealed key.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub tpm: Option<EncryptionKeyTpm>,
}

/// Static passphrase key.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct EncryptionKeyStatic {
    /// The passphrase.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub passphrase: Option<String>,
}

/// Node-ID derived key (no options).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct EncryptionKeyNodeId {}

/// KMS key.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct EncryptionKeyKms {
    /// KMS endpoint.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub endpoint: Option<String>,
}

/// TPM key.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields, rename_all = "camelCase")]
pub struct EncryptionKeyTpm {
    /// Require Secure Boot at enrollment.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub check_secureboot_status_on_enroll: Option<bool>,
}

/// `machine.features`.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields, rename_all = "camelCase")]
pub struct FeaturesConfig {
    /// Role-based access control of the Talos API.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub rbac: Option<bool>,
    /// Deprecated: stable default hostname.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub stable_hostname: Option<bool>,
    /// Talos API access from Kubernetes pods.
    #[serde(
        rename = "kubernetesTalosAPIAccess",
        skip_serializing_if = "Option::is_none"
    )]
    pub kubernetes_talos_api_access: Option<KubernetesTalosApiAccessConfig>,
    /// Enforce the client certificate extended key usage.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub apid_check_ext_key_usage: Option<bool>,
    /// XFS project quotas.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub disk_quota_support: Option<bool>,
    /// KubePrism local API server load balancer.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub kube_prism: Option<KubePrism>,
    /// Host DNS caching resolver.
    #[serde(rename = "hostDNS", skip_serializing_if = "Option::is_none")]
    pub host_dns: Option<HostDnsConfig>,
    /// Image cache.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub image_cache: Option<ImageCacheConfig>,
    /// `v1` or `v2`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub node_address_sort_algorithm: Option<String>,
}

/// KubePrism.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct KubePrism {
    /// Enabled.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub enabled: Option<bool>,
    /// Listen port (7445).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub port: Option<u16>,
}

/// Image cache.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields, rename_all = "camelCase")]
pub struct ImageCacheConfig {
    /// Local image cache.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub local_enabled: Option<bool>,
}

/// Talos API access from Kubernetes.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields, rename_all = "camelCase")]
pub struct KubernetesTalosApiAccessConfig {
    /// Enabled.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub enabled: Option<bool>,
    /// Roles that can be granted.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub allowed_roles: Vec<String>,
    /// Namespaces access is available from.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub allowed_kubernetes_namespaces: Vec<String>,
}

/// Host DNS.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields, rename_all = "camelCase")]
pub struct HostDnsConfig {
    /// Enabled.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub enabled: Option<bool>,
    /// CoreDNS forwards to the host resolver.
    #[serde(
        rename = "forwardKubeDNSToHost",
        skip_serializing_if = "Option::is_none"
    )]
    pub forward_kube_dns_to_host: Option<bool>,
    /// Resolve cluster member names.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub resolve_member_names: Option<bool>,
}

/// `machine.udev`.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct UdevConfig {
    /// udev rules.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub rules: Vec<String>,
}

/// `machine.logging`.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct LoggingConfig {
    /// Destinations.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub destinations: Vec<LoggingDestination>,
}

/// A log destination.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields, rename_all = "camelCase")]
pub struct LoggingDestination {
    /// `tcp://host:port` or `udp://host:port`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub endpoint: Option<String>,
    /// `json_lines`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub format: Option<String>,
    /// Extra tags on every message.
    #[serde(skip_serializing_if = "BTreeMap::is_empty")]
    pub extra_tags: BTreeMap<String, String>,
}

/// `machine.kernel`.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct KernelConfig {
    /// Modules to load.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub modules: Vec<KernelModuleConfig>,
}

/// A kernel module to load.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct KernelModuleConfig {
    /// Module name.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
    /// Module parameters.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub parameters: Vec<String>,
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::resources::block::DiskSpec;

    fn disk(size: u64, model: &str, transport: &str, rotational: bool) -> DiskSpec {
        DiskSpec {
            dev_path: "/dev/vda".into(),
            size,
            model: model.into(),
            transport: transport.into(),
            rotational,
            bus_path: "/pci0000:00/0000:00:04.0/virtio2".into(),
            ..DiskSpec::default()
        }
    }

    #[test]
    fn a_disk_selector_matches_as_upstreams() {
        let sel = |yaml: &str| serde_yaml_ng::from_str::<InstallDiskSelector>(yaml).unwrap();
        let ssd = disk(8_000_000_000, "QEMU HARDDISK", "virtio", false);
        let small = disk(2_000_000_000, "QEMU HARDDISK", "virtio", true);
        assert_eq!(sel("size: '>= 4GB'").matches(&ssd), Ok(true));
        assert_eq!(sel("size: '>= 4GB'").matches(&small), Ok(false));
        assert_eq!(sel("size: 2GB").matches(&small), Ok(true));
        assert_eq!(sel("size: '< 3GiB'").matches(&small), Ok(true));
        assert_eq!(sel("model: 'QEMU*'").matches(&ssd), Ok(true));
        assert_eq!(sel("model: 'Samsung*'").matches(&ssd), Ok(false));
        assert_eq!(sel("type: ssd").matches(&ssd), Ok(true));
        assert_eq!(sel("type: hdd").matches(&ssd), Ok(false));
        assert_eq!(sel("type: hdd").matches(&small), Ok(true));
        assert_eq!(sel("type: nvme").matches(&ssd), Ok(false));
        // `*` does not cross a `/`.
        assert_eq!(sel("busPath: '/pci0000:00/*'").matches(&ssd), Ok(false));
        assert_eq!(sel("busPath: '/pci0000:00/*/*'").matches(&ssd), Ok(true));
        // Never a read-only disk, a CD or a device without a transport.
        let mut ro = ssd.clone();
        ro.readonly = true;
        assert_eq!(sel("size: '>= 1GB'").matches(&ro), Ok(false));
        let lo = disk(8_000_000_000, "", "", false);
        assert_eq!(sel("size: '>= 1GB'").matches(&lo), Ok(false));
        assert!(sel("name: vda")
            .matches(&ssd)
            .unwrap_err()
            .contains("not supported"));
        assert!(sel("size: '>= many'").matches(&ssd).is_err());
    }
}
