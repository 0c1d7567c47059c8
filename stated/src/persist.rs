//! Persistence of the store.
//!
//! - The *run* state (`--run-dir`, `/run/stated` on a node: tmpfs, lives until reboot) is a
//!   snapshot plus an append-only log of every write, each record length-prefixed and
//!   checksummed. A write is appended with one `write(2)` before it is acknowledged, so a
//!   `kill -9` of stated loses no acknowledged write; a torn last record is cut off on load.
//!   The log is compacted into a new snapshot when it grows past twice the live data.
//! - *Durable* namespaces (`config`) are also written to `--state-dir` as one file per namespace,
//!   atomically: temp file, fsync, rename, fsync of the directory. A crash mid-write leaves the
//!   old or the new file, never a mix. They are what survives a reboot.

use std::fs::{self, File, OpenOptions};
use std::io::{self, Read, Write};
use std::path::{Path, PathBuf};

use prost::Message;

/// One record of the log or a snapshot.
#[derive(Clone, PartialEq, prost::Message)]
pub struct Record {
    /// Sequence number of the write (0 in snapshots and durable files).
    #[prost(uint64, tag = "1")]
    pub seq: u64,
    /// The resource after the write; absent for a destroy.
    #[prost(message, optional, tag = "2")]
    pub resource: Option<proto::Resource>,
    /// Namespace, type and ID of a destroyed resource.
    #[prost(string, tag = "3")]
    pub namespace: String,
    /// Type of a destroyed resource.
    #[prost(string, tag = "4")]
    pub r#type: String,
    /// ID of a destroyed resource.
    #[prost(string, tag = "5")]
    pub id: String,
}

/// Header of a snapshot: the sequence number it was taken at and the bookmark epoch.
#[derive(Clone, PartialEq, prost::Message)]
pub struct Header {
    /// Sequence number of the last write included.
    #[prost(uint64, tag = "1")]
    pub seq: u64,
    /// Bookmark epoch of this run state.
    #[prost(uint64, tag = "2")]
    pub epoch: u64,
}

/// Errors of persistence.
#[derive(Debug, thiserror::Error)]
pub enum PersistError {
    /// An I/O error on a file.
    #[error("{op} {path}")]
    Io {
        /// What was being done.
        op: &'static str,
        /// Which file.
        path: PathBuf,
        /// The cause.
        #[source]
        source: io::Error,
    },
    /// A complete record (not the torn tail) failed its checksum or did not decode.
    #[error("corrupt record in {path} at offset {offset}")]
    Corrupt {
        /// Which file.
        path: PathBuf,
        /// Where.
        offset: u64,
    },
}

fn io_err<'a>(op: &'static str, path: &'a Path) -> impl FnOnce(io::Error) -> PersistError + 'a {
    move |source| PersistError::Io {
        op,
        path: path.to_path_buf(),
        source,
    }
}

/// Appends the framed encoding of `msg` to `out`: length (u32 LE), CRC32 (u32 LE), payload.
pub fn frame<M: Message>(msg: &M, out: &mut Vec<u8>) {
    let payload = msg.encode_to_vec();
    let len = u32::try_from(payload.len()).unwrap_or(u32::MAX);
    out.extend_from_slice(&len.to_le_bytes());
    out.extend_from_slice(&crc32fast::hash(&payload).to_le_bytes());
    out.extend_from_slice(&payload);
}

/// Frames the [`Record`] of a write at `seq` of a resource already encoded (the bytes of a
/// `cosi.resource.Resource`): the same bytes as `frame(&Record { seq, resource, .. })`,
/// without encoding the resource again.
pub fn frame_record(seq: u64, resource: &[u8], out: &mut Vec<u8>) {
    use prost::encoding::{encode_key, encode_varint, encoded_len_varint, key_len, WireType};
    let mut payload = Vec::with_capacity(
        2 * key_len(1)
            + encoded_len_varint(seq)
            + encoded_len_varint(resource.len() as u64)
            + resource.len(),
    );
    if seq != 0 {
        encode_key(1, WireType::Varint, &mut payload);
        encode_varint(seq, &mut payload);
    }
    encode_key(2, WireType::LengthDelimited, &mut payload);
    encode_varint(resource.len() as u64, &mut payload);
    payload.extend_from_slice(resource);
    let len = u32::try_from(payload.len()).unwrap_or(u32::MAX);
    out.extend_from_slice(&len.to_le_bytes());
    out.extend_from_slice(&crc32fast::hash(&payload).to_le_bytes());
    out.extend_from_slice(&payload);
}

/// Splits a file into frames. A short or bad last frame is a torn write: it is reported as the
/// length of the valid prefix, so the caller can cut it off. A bad frame followed by more data
/// is corruption.
pub fn unframe<'a>(data: &'a [u8], path: &Path) -> Result<(Vec<&'a [u8]>, usize), PersistError> {
    let mut frames = Vec::new();
    let mut off = 0usize;
    while off < data.len() {
        let rest = &data[off..];
        if rest.len() < 8 {
            break;
        }
        let len = u32::from_le_bytes([rest[0], rest[1], rest[2], rest[3]]) as usize;
        let crc = u32::from_le_bytes([rest[4], rest[5], rest[6], rest[7]]);
        if rest.len() < 8 + len {
            break;
        }
        let payload = &rest[8..8 + len];
        if crc32fast::hash(payload) != crc {
            if off + 8 + len == data.len() {
                break;
            }
            return Err(PersistError::Corrupt {
                path: path.to_path_buf(),
                offset: off as u64,
            });
        }
        frames.push(payload);
        off += 8 + len;
    }
    Ok((frames, off))
}

fn read_all(path: &Path) -> Result<Option<Vec<u8>>, PersistError> {
    match File::open(path) {
        Ok(mut f) => {
            let mut buf = Vec::new();
            f.read_to_end(&mut buf).map_err(io_err("read", path))?;
            Ok(Some(buf))
        }
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(None),
        Err(e) => Err(io_err("open", path)(e)),
    }
}

/// Writes `data` to `path` atomically: temp file, fsync, rename, fsync of the directory.
pub fn write_atomic(path: &Path, data: &[u8], sync: bool) -> Result<(), PersistError> {
    let dir = path.parent().unwrap_or(Path::new("."));
    let tmp = path.with_extension("tmp");
    {
        let mut f = File::create(&tmp).map_err(io_err("create", &tmp))?;
        f.write_all(data).map_err(io_err("write", &tmp))?;
        if sync {
            f.sync_all().map_err(io_err("fsync", &tmp))?;
        }
    }
    fs::rename(&tmp, path).map_err(io_err("rename", path))?;
    if sync {
        File::open(dir)
            .and_then(|d| d.sync_all())
            .map_err(io_err("fsync", dir))?;
    }
    Ok(())
}

/// What was loaded from the run directory.
pub struct Loaded {
    /// The snapshot's header, if a snapshot existed.
    pub header: Option<Header>,
    /// Resources of the snapshot.
    pub snapshot: Vec<proto::Resource>,
    /// Log records after the snapshot, in order.
    pub log: Vec<Record>,
}

/// The run-state files of one stated.
pub struct RunFiles {
    dir: PathBuf,
    log: File,
    log_bytes: u64,
}

impl RunFiles {
    fn snapshot_path(dir: &Path) -> PathBuf {
        dir.join("snapshot")
    }

    fn log_path(dir: &Path) -> PathBuf {
        dir.join("log")
    }

    /// Loads the run state in `dir` (creating the directory) and opens the log for appending.
    /// A torn last log record is cut off.
    pub fn open(dir: &Path) -> Result<(Self, Loaded), PersistError> {
        fs::create_dir_all(dir).map_err(io_err("create", dir))?;
        let snap_path = Self::snapshot_path(dir);
        let mut header = None;
        let mut snapshot = Vec::new();
        if let Some(data) = read_all(&snap_path)? {
            let (frames, _) = unframe(&data, &snap_path)?;
            let mut frames = frames.into_iter();
            if let Some(h) = frames.next() {
                header = Some(Header::decode(h).map_err(|_| PersistError::Corrupt {
                    path: snap_path.clone(),
                    offset: 0,
                })?);
                for f in frames {
                    let r = Record::decode(f).map_err(|_| PersistError::Corrupt {
                        path: snap_path.clone(),
                        offset: 0,
                    })?;
                    if let Some(res) = r.resource {
                        snapshot.push(res);
                    }
                }
            }
        }
        let log_path = Self::log_path(dir);
        let mut log = Vec::new();
        let mut valid = 0usize;
        if let Some(data) = read_all(&log_path)? {
            let (frames, v) = unframe(&data, &log_path)?;
            valid = v;
            for f in frames {
                log.push(Record::decode(f).map_err(|_| PersistError::Corrupt {
                    path: log_path.clone(),
                    offset: 0,
                })?);
            }
            if v < data.len() {
                tracing::warn!(path = %log_path.display(), cut = data.len() - v, "cut torn log tail");
            }
        }
        let file = OpenOptions::new()
            .create(true)
            .write(true)
            .truncate(false)
            .open(&log_path)
            .map_err(io_err("open", &log_path))?;
        file.set_len(valid as u64)
            .map_err(io_err("truncate", &log_path))?;
        let mut file = file;
        use std::io::Seek;
        file.seek(io::SeekFrom::End(0))
            .map_err(io_err("seek", &log_path))?;
        Ok((
            Self {
                dir: dir.to_path_buf(),
                log: file,
                log_bytes: valid as u64,
            },
            Loaded {
                header,
                snapshot,
                log,
            },
        ))
    }

    /// Appends one record with a single write.
    pub fn append(&mut self, buf: &[u8]) -> Result<(), PersistError> {
        let path = Self::log_path(&self.dir);
        self.log.write_all(buf).map_err(io_err("append", &path))?;
        self.log_bytes += buf.len() as u64;
        Ok(())
    }

    /// Bytes in the log since the last snapshot.
    pub fn log_bytes(&self) -> u64 {
        self.log_bytes
    }

    /// Writes a new snapshot of `resources` at `header`, then starts an empty log. Records of the
    /// old log at or below the snapshot's sequence number are skipped on load, so a crash between
    /// the two steps loses nothing.
    pub fn compact<'a>(
        &mut self,
        header: &Header,
        resources: impl Iterator<Item = &'a cosi::RawResource>,
    ) -> Result<(), PersistError> {
        let mut buf = Vec::new();
        frame(header, &mut buf);
        for r in resources {
            frame(
                &Record {
                    resource: Some(r.to_proto()),
                    ..Default::default()
                },
                &mut buf,
            );
        }
        write_atomic(&Self::snapshot_path(&self.dir), &buf, false)?;
        let log_path = Self::log_path(&self.dir);
        write_atomic(&log_path, &[], false)?;
        self.log = OpenOptions::new()
            .append(true)
            .open(&log_path)
            .map_err(io_err("open", &log_path))?;
        self.log_bytes = 0;
        Ok(())
    }
}

/// The durable namespace files in the state directory.
pub struct DurableFiles {
    dir: PathBuf,
}

impl DurableFiles {
    /// Durable files under `dir` (created if missing).
    pub fn open(dir: &Path) -> Result<Self, PersistError> {
        fs::create_dir_all(dir).map_err(io_err("create", dir))?;
        Ok(Self {
            dir: dir.to_path_buf(),
        })
    }

    fn path(&self, namespace: &str) -> PathBuf {
        // Namespaces are validated to be path-safe before they get here.
        self.dir.join(format!("{namespace}.ns"))
    }

    /// Writes the whole namespace atomically and durably.
    pub fn write<'a>(
        &self,
        namespace: &str,
        resources: impl Iterator<Item = &'a cosi::RawResource>,
    ) -> Result<(), PersistError> {
        let mut buf = Vec::new();
        for r in resources {
            frame(
                &Record {
                    resource: Some(r.to_proto()),
                    ..Default::default()
                },
                &mut buf,
            );
        }
        write_atomic(&self.path(namespace), &buf, true)
    }

    /// Loads one namespace; an absent file is empty.
    pub fn load(&self, namespace: &str) -> Result<Vec<proto::Resource>, PersistError> {
        let path = self.path(namespace);
        let Some(data) = read_all(&path)? else {
            return Ok(Vec::new());
        };
        let (frames, valid) = unframe(&data, &path)?;
        if valid != data.len() {
            // Written atomically: a short file is corruption, not a torn append.
            return Err(PersistError::Corrupt {
                path,
                offset: valid as u64,
            });
        }
        frames
            .into_iter()
            .map(|f| {
                Record::decode(f)
                    .ok()
                    .and_then(|r| r.resource)
                    .ok_or_else(|| PersistError::Corrupt {
                        path: path.clone(),
                        offset: 0,
                    })
            })
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn torn_tail_is_cut_and_corruption_is_reported() {
        let p = Path::new("x");
        let mut buf = Vec::new();
        frame(&Header { seq: 1, epoch: 2 }, &mut buf);
        frame(&Header { seq: 3, epoch: 4 }, &mut buf);
        let full = buf.len();
        let (f, v) = unframe(&buf, p).unwrap();
        assert_eq!((f.len(), v), (2, full));
        let (f, v) = unframe(&buf[..full - 3], p).unwrap();
        assert_eq!(f.len(), 1);
        assert!(v < full);
        // Flip a byte of the first frame: corruption, not a torn tail.
        let mut bad = buf.clone();
        bad[9] ^= 0xff;
        assert!(matches!(
            unframe(&bad, p),
            Err(PersistError::Corrupt { .. })
        ));
    }

    #[test]
    fn a_record_framed_from_an_encoded_resource_is_the_same_bytes() {
        let r = cosi::RawResource {
            metadata: cosi::Metadata::new("ns", "T", "id"),
            spec: vec![1, 2, 3],
            yaml_spec: String::new(),
        };
        for seq in [0, 1, 300, u64::MAX] {
            let mut want = Vec::new();
            frame(
                &Record {
                    seq,
                    resource: Some(r.to_proto()),
                    ..Default::default()
                },
                &mut want,
            );
            let mut got = Vec::new();
            frame_record(seq, &r.to_proto().encode_to_vec(), &mut got);
            assert_eq!(got, want, "seq {seq}");
        }
    }
}
