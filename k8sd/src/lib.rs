//! k8sd: the Kubernetes daemon of a talos-rs node (DESIGN.md §1). It writes the `etcd` and
//! `k8s` namespaces. On a control plane with an etcd CA it derives etcd's configuration and
//! spec from the machine configuration and the node's addresses, writes etcd's certificates
//! where etcd reads them, asks init to run etcd (a requested service: its own uid, no
//! capability, landlock on its data and certificates, TCP 2379/2380 only), answers
//! `talosctl bootstrap`, and checks etcd's quorum. It holds no capability and no CA key.
//! It renders the Kubernetes control plane's static pods (kube-apiserver,
//! kube-controller-manager, kube-scheduler) and serves them as a `PodList`; no kubelet runs
//! them yet.

pub mod controllers;
pub mod etcd;
pub mod k8s;
pub mod run;
pub mod wipe;
