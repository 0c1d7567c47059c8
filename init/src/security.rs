//! What a daemon's sandbox really is: `/proc/<pid>/task/*/status` of every thread (through
//! `sandbox::observe`), set beside what the manifest declares, with every difference named and
//! the exposure score on the `systemd-analyze security` model. Published as `DaemonSecurity`.

use std::collections::BTreeSet;

use machinery::resources::runtime::{
    DaemonSecuritySpec, DeclaredSandbox, ObservedSandbox, SecurityCheck,
};
use sandbox::{CapSet, IpcReach, LandlockEnforcement, Observed, SeccompMode};

use crate::manifest::{Daemon, Manifest};

/// What the manifest says about one daemon, to compare with what the kernel says.
#[derive(Clone, Debug)]
pub struct Audit {
    /// The declared sandbox.
    pub declared: DeclaredSandbox,
    /// Its declared capability set.
    pub caps: CapSet,
    /// Its reach through stated.
    pub reach: IpcReach,
}

impl Audit {
    /// The audit of `daemon` in `manifest`.
    pub fn of(manifest: &Manifest, daemon: &Daemon) -> Audit {
        let caps = crate::manifest::capability_set(daemon).unwrap_or(CapSet::EMPTY);
        Audit {
            declared: DeclaredSandbox {
                uid: daemon.uid,
                gid: daemon.gid,
                capabilities: caps.names(),
                seccomp_profile: if daemon.seccomp == "unconfined" {
                    String::new()
                } else {
                    daemon.seccomp.clone()
                },
                paths: daemon
                    .landlock
                    .paths
                    .iter()
                    .map(|p| {
                        format!(
                            "{}:{}",
                            serde_json::to_value(p.access)
                                .ok()
                                .and_then(|v| v.as_str().map(str::to_string))
                                .unwrap_or_default(),
                            p.path.display()
                        )
                    })
                    .collect(),
                bind_tcp: daemon.landlock.bind_tcp.clone(),
                connect_tcp: daemon.landlock.connect_tcp.clone(),
                writes: daemon.writes.clone(),
                reads: daemon.reads.clone(),
            },
            caps,
            reach: IpcReach {
                writes: daemon.writes.clone(),
                reads: daemon.reads.clone(),
                sensitive: manifest.sensitive(),
            },
        }
    }

    /// The observed sandbox beside the declared one, its differences and its score.
    pub fn describe(&self, observed: Observed) -> DaemonSecuritySpec {
        let exposure = sandbox::score(&observed, Some(&self.reach));
        let uids: BTreeSet<u32> = observed.threads.iter().flat_map(|t| t.uid.all()).collect();
        let gids: BTreeSet<u32> = observed.threads.iter().flat_map(|t| t.gid.all()).collect();
        let landlock = observed.applied.as_ref().map(|a| a.landlock.enforcement);
        let mut mismatches = Vec::new();
        for t in &observed.threads {
            let who = format!("thread {} ({})", t.tid, t.name);
            if t.uid.all() != [self.declared.uid; 4] {
                mismatches.push(format!("{who}: uids {:?}", t.uid.all()));
            }
            if t.gid.all() != [self.declared.gid; 4] {
                mismatches.push(format!("{who}: gids {:?}", t.gid.all()));
            }
            for (set, caps) in [
                ("effective", t.cap_effective),
                ("permitted", t.cap_permitted),
                ("inheritable", t.cap_inheritable),
                ("ambient", t.cap_ambient),
                ("bounding", t.cap_bounding),
            ] {
                if caps != self.caps {
                    mismatches.push(format!("{who}: {set} capabilities {caps}"));
                }
            }
            if !t.no_new_privs {
                mismatches.push(format!("{who}: no_new_privs is not set"));
            }
            if !self.declared.seccomp_profile.is_empty() && t.seccomp != SeccompMode::Filter {
                mismatches.push(format!("{who}: seccomp mode {:?}", t.seccomp));
            }
        }
        if observed.dumpable == Some(true) {
            mismatches.push("the process is dumpable: its uid could read its memory".to_string());
        }
        if landlock == Some(LandlockEnforcement::NotEnforced) && !self.declared.paths.is_empty() {
            mismatches.push("landlock is not enforced by this kernel".to_string());
        }
        let least_seccomp = observed
            .threads
            .iter()
            .map(|t| t.seccomp)
            .min_by_key(|m| match m {
                SeccompMode::Disabled => 0,
                SeccompMode::Strict => 2,
                SeccompMode::Filter => 1,
            })
            .unwrap_or(SeccompMode::Disabled);
        let union = |f: fn(&sandbox::ThreadStatus) -> CapSet| observed.union_of(f).names();
        DaemonSecuritySpec {
            pid: observed.pid,
            threads: u32::try_from(observed.threads.len()).unwrap_or(u32::MAX),
            observed: ObservedSandbox {
                uids: uids.into_iter().collect(),
                gids: gids.into_iter().collect(),
                effective: union(|t| t.cap_effective),
                permitted: union(|t| t.cap_permitted),
                inheritable: union(|t| t.cap_inheritable),
                bounding: union(|t| t.cap_bounding),
                ambient: union(|t| t.cap_ambient),
                no_new_privs: observed.every_thread(|t| t.no_new_privs),
                seccomp: match least_seccomp {
                    SeccompMode::Disabled => "disabled",
                    SeccompMode::Strict => "strict",
                    SeccompMode::Filter => "filter",
                }
                .to_string(),
                seccomp_filters: observed
                    .threads
                    .iter()
                    .map(|t| t.seccomp_filters)
                    .min()
                    .unwrap_or(0),
                landlock: match landlock {
                    Some(LandlockEnforcement::Full) => "full",
                    Some(LandlockEnforcement::Partial) => "partial",
                    Some(LandlockEnforcement::NotEnforced) | None => "notEnforced",
                }
                .to_string(),
                landlock_abi: observed.landlock_kernel_abi,
                non_dumpable: observed.dumpable.map(|d| !d),
            },
            declared: self.declared.clone(),
            mismatches,
            exposure: exposure.exposure,
            level: exposure.level.to_string(),
            checks: exposure
                .checks
                .iter()
                .map(|c| SecurityCheck {
                    id: c.id.clone(),
                    weight: c.weight,
                    range: c.range,
                    badness: c.badness,
                    description: c.description.clone(),
                })
                .collect(),
        }
    }
}
