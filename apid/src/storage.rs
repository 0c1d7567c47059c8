//! `storage.StorageService`: upstream's `Disks` (what upstream's `talosctl disks` calls), from
//! blockd's `Disk` resources in `block`; `system_disk` is the disk of `SystemDisks/system-disk`
//! (the one the system volumes are on).

use machinery::resources::block::{DiskSpec, SystemDiskSpec, NAMESPACE, SYSTEM_DISK_ID};
use proto::storage::storage_service_server::StorageService;
use proto::storage::{disk::DiskType, Disk, Disks, DisksResponse};
use tonic::{Request, Response, Status};

/// The storage service, reading stated.
#[derive(Clone, Debug)]
pub struct Storage {
    client: cosi::Client,
}

impl Storage {
    /// The service over `client` (apid's stated client).
    pub fn new(client: cosi::Client) -> Self {
        Self { client }
    }
}

/// Upstream's disk type from what blockd observed.
pub fn disk_type(d: &DiskSpec) -> DiskType {
    match d.transport.as_str() {
        "nvme" => DiskType::Nvme,
        "mmc" => DiskType::Sd,
        _ if d.rotational => DiskType::Hdd,
        _ => DiskType::Ssd,
    }
}

#[tonic::async_trait]
impl StorageService for Storage {
    async fn disks(&self, _: Request<()>) -> Result<Response<DisksResponse>, Status> {
        let unavailable =
            |e: cosi::StateError| Status::unavailable(format!("stated is not answering apid: {e}"));
        // The disk the system volumes are on (blockd's `SystemDisks/system-disk`).
        let system = match self
            .client
            .get_typed::<SystemDiskSpec>(NAMESPACE, SYSTEM_DISK_ID)
            .await
        {
            Ok(r) => Some(r.spec.disk_id),
            Err(e) if e.is_not_found() => None,
            Err(e) => return Err(unavailable(e)),
        };
        let disks = self
            .client
            .list_typed::<DiskSpec>(NAMESPACE)
            .await
            .map_err(unavailable)?
            .into_iter()
            .filter(|d| !d.spec.cdrom)
            .map(|d| {
                let system_disk = system.as_deref() == Some(d.metadata.id.as_str());
                let s = d.spec;
                Disk {
                    size: s.size,
                    model: s.model.clone(),
                    device_name: s.dev_path.clone(),
                    name: String::new(),
                    serial: s.serial.clone(),
                    modalias: s.modalias.clone(),
                    uuid: String::new(),
                    wwid: s.wwid.clone(),
                    r#type: disk_type(&s) as i32,
                    bus_path: s.bus_path.clone(),
                    system_disk,
                    subsystem: s.sub_system.clone(),
                }
            })
            .collect();
        Ok(Response::new(DisksResponse {
            messages: vec![Disks {
                metadata: None,
                disks,
            }],
        }))
    }
}
