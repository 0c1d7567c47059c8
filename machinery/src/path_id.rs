//! A resource ID that becomes a file name. IDs are chosen by whoever writes the resource, often
//! another daemon: one that names a file must be a single, plain path component, or `..` in it
//! would leave the directory the reader meant (k8sd wrote `<recovery dir>/<id>.part` from an ID
//! apid chose).

/// Why an ID cannot name a file.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("resource ID {id:?} cannot name a file: {why}")]
pub struct BadFileId {
    /// The ID (cut to 64 characters).
    pub id: String,
    /// What is wrong with it.
    pub why: &'static str,
}

/// Longest ID that names a file (a file name is at most 255 bytes; room for a suffix).
pub const MAX_FILE_ID: usize = 200;

/// `id` as one file name: not empty, not `.` or `..`, no `/`, no NUL or other control
/// character, not starting with `.` (no hidden or dot file), at most [`MAX_FILE_ID`] bytes.
///
/// # Errors
///
/// [`BadFileId`] saying why.
pub fn file_name(id: &str) -> Result<&str, BadFileId> {
    let why = if id.is_empty() {
        Some("it is empty")
    } else if id.len() > MAX_FILE_ID {
        Some("it is longer than 200 bytes")
    } else if id.contains('/') {
        Some("it contains '/'")
    } else if id.starts_with('.') {
        Some("it starts with '.'")
    } else if id.chars().any(char::is_control) {
        Some("it contains control characters")
    } else {
        None
    };
    match why {
        None => Ok(id),
        Some(why) => Err(BadFileId {
            id: id.chars().take(64).collect(),
            why,
        }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_a_plain_name_names_a_file() {
        for ok in ["upload-1", "a1b2c3", "resolv.conf", "x..y", "名前"] {
            assert_eq!(file_name(ok), Ok(ok));
        }
        for bad in [
            "",
            ".",
            "..",
            "../etcd/member",
            "a/b",
            "/abs",
            ".hidden",
            "a\0b",
            "a\nb",
            &"x".repeat(201),
        ] {
            let e = file_name(bad).unwrap_err();
            assert!(e.to_string().contains("cannot name a file"), "{e}");
        }
    }
}
