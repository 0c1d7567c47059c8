//! The errors of the State API, with the kinds callers branch on, and their mapping to and from
//! gRPC status codes (COSI's matrix, `reference/cosi.md` §1.5).

use std::fmt;

/// What went wrong in a State API call; callers branch on this.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ErrorKind {
    /// The resource does not exist.
    NotFound,
    /// The resource exists already (Create).
    AlreadyExists,
    /// Version mismatch or pending finalizers.
    Conflict,
    /// The owner string does not match the resource's owner.
    OwnerConflict,
    /// The resource is not in the expected phase (Update).
    PhaseConflict,
    /// The caller may not do this (peer credentials, namespace access).
    PermissionDenied,
    /// The request is malformed.
    InvalidArgument,
    /// A watch bookmark is no longer (or never was) valid.
    InvalidBookmark,
    /// stated cannot be reached; a retry may help.
    Unavailable,
    /// The server does not implement the call or option.
    Unimplemented,
    /// A limit of stated was reached (open watches or connections of a peer, resources, types
    /// or bytes of a namespace); the message names it.
    LimitReached,
    /// Anything else.
    Other,
}

/// An error of a State API call.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct StateError {
    kind: ErrorKind,
    message: String,
}

impl StateError {
    /// A new error of `kind`.
    pub fn new(kind: ErrorKind, message: impl Into<String>) -> Self {
        Self {
            kind,
            message: message.into(),
        }
    }

    /// The kind of the error.
    pub fn kind(&self) -> ErrorKind {
        self.kind
    }

    /// The message, without the kind.
    pub fn message(&self) -> &str {
        &self.message
    }

    /// NotFound.
    pub fn is_not_found(&self) -> bool {
        self.kind == ErrorKind::NotFound
    }

    /// Any conflict: exists, version, finalizers, owner or phase (as COSI's `IsConflictError`).
    pub fn is_conflict(&self) -> bool {
        matches!(
            self.kind,
            ErrorKind::AlreadyExists
                | ErrorKind::Conflict
                | ErrorKind::OwnerConflict
                | ErrorKind::PhaseConflict
        )
    }

    /// The owner string did not match.
    pub fn is_owner_conflict(&self) -> bool {
        self.kind == ErrorKind::OwnerConflict
    }

    /// The phase did not match.
    pub fn is_phase_conflict(&self) -> bool {
        self.kind == ErrorKind::PhaseConflict
    }

    /// The server is unreachable: a retry after a backoff may succeed.
    pub fn is_unavailable(&self) -> bool {
        self.kind == ErrorKind::Unavailable
    }

    /// Converts a gRPC status from stated into an error. `op` tells which call it was, so that
    /// the ambiguous codes of the COSI matrix map back to the right kind.
    pub fn from_status(op: Op, status: &tonic::Status) -> Self {
        use tonic::Code;
        let message = status.message().to_string();
        let kind = match status.code() {
            Code::NotFound => ErrorKind::NotFound,
            Code::AlreadyExists => ErrorKind::AlreadyExists,
            Code::PermissionDenied => {
                if message.starts_with(OWNER_CONFLICT_PREFIX) {
                    ErrorKind::OwnerConflict
                } else {
                    ErrorKind::PermissionDenied
                }
            }
            Code::InvalidArgument if op == Op::Update && message.starts_with(PHASE_PREFIX) => {
                ErrorKind::PhaseConflict
            }
            Code::InvalidArgument => ErrorKind::InvalidArgument,
            Code::FailedPrecondition if op == Op::Watch => ErrorKind::InvalidBookmark,
            Code::FailedPrecondition => ErrorKind::Conflict,
            Code::Unavailable | Code::Cancelled => ErrorKind::Unavailable,
            Code::Unknown if message.contains("transport error") => ErrorKind::Unavailable,
            // The connection broke mid-call (the peer was killed while answering): a transport
            // failure like the one above, whatever code hyper's error was mapped to.
            Code::Unknown | Code::Internal if message.starts_with("h2 protocol error") => {
                ErrorKind::Unavailable
            }
            Code::Unimplemented => ErrorKind::Unimplemented,
            Code::ResourceExhausted => ErrorKind::LimitReached,
            _ => ErrorKind::Other,
        };
        Self { kind, message }
    }

    /// The gRPC status stated answers with for this error (COSI's matrix).
    pub fn to_status(&self) -> tonic::Status {
        use tonic::Code;
        let code = match self.kind {
            ErrorKind::NotFound => Code::NotFound,
            ErrorKind::AlreadyExists => Code::AlreadyExists,
            ErrorKind::Conflict | ErrorKind::InvalidBookmark => Code::FailedPrecondition,
            ErrorKind::OwnerConflict | ErrorKind::PermissionDenied => Code::PermissionDenied,
            ErrorKind::PhaseConflict | ErrorKind::InvalidArgument => Code::InvalidArgument,
            ErrorKind::Unavailable => Code::Unavailable,
            ErrorKind::Unimplemented => Code::Unimplemented,
            ErrorKind::LimitReached => Code::ResourceExhausted,
            ErrorKind::Other => Code::Unknown,
        };
        tonic::Status::new(code, bounded(&self.message, MAX_STATUS_MESSAGE))
    }
}

/// Longest error message sent on the wire: it travels in an HTTP/2 trailer, which clients
/// limit (a message echoing a 1 MiB ID would make the client fail on the trailer instead of
/// reporting the error).
pub const MAX_STATUS_MESSAGE: usize = 2048;

/// `s` cut to at most `max` bytes on a character boundary, with how much was left out.
pub fn bounded(s: &str, max: usize) -> String {
    if s.len() <= max {
        return s.to_string();
    }
    let mut end = max.saturating_sub(40);
    while !s.is_char_boundary(end) {
        end -= 1;
    }
    format!("{}… ({} bytes more)", &s[..end], s.len() - end)
}

/// Client input quoted in an error message: debug-quoted, at most about 80 characters, with
/// its length when cut.
pub fn quoted(s: &str) -> String {
    const MAX: usize = 80;
    if s.len() <= MAX {
        return format!("{s:?}");
    }
    let mut end = MAX;
    while !s.is_char_boundary(end) {
        end -= 1;
    }
    format!("{:?}… ({} bytes)", &s[..end], s.len())
}

/// Messages of owner conflicts start with this, so a client can tell them from access denials.
pub const OWNER_CONFLICT_PREFIX: &str = "owner conflict";
/// Messages of phase conflicts start with this.
pub const PHASE_PREFIX: &str = "phase conflict";

/// The State API call an error came from.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Op {
    /// Get.
    Get,
    /// List.
    List,
    /// Create.
    Create,
    /// Update.
    Update,
    /// Destroy.
    Destroy,
    /// Watch.
    Watch,
    /// Teardown or TeardownAndDestroy.
    Teardown,
}

impl fmt::Display for StateError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let kind = match self.kind {
            ErrorKind::NotFound => "not found",
            ErrorKind::AlreadyExists => "already exists",
            ErrorKind::Conflict => "conflict",
            ErrorKind::OwnerConflict => "owner conflict",
            ErrorKind::PhaseConflict => "phase conflict",
            ErrorKind::PermissionDenied => "permission denied",
            ErrorKind::InvalidArgument => "invalid argument",
            ErrorKind::InvalidBookmark => "invalid bookmark",
            ErrorKind::Unavailable => "unavailable",
            ErrorKind::Unimplemented => "unimplemented",
            ErrorKind::LimitReached => "limit reached",
            ErrorKind::Other => "error",
        };
        if self.message.is_empty() || self.message.starts_with(kind) {
            write!(
                f,
                "{}",
                if self.message.is_empty() {
                    kind
                } else {
                    &self.message
                }
            )
        } else {
            write!(f, "{kind}: {}", self.message)
        }
    }
}

impl std::error::Error for StateError {}

/// Renders an error with its chain of causes: `a: b: c`.
pub struct Chain<'a>(pub &'a (dyn std::error::Error + 'static));

impl fmt::Display for Chain<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.0)?;
        let mut cur = self.0.source();
        while let Some(e) = cur {
            write!(f, ": {e}")?;
            cur = e.source();
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_connection_broken_mid_call_is_unavailable() {
        for code in [tonic::Code::Internal, tonic::Code::Unknown] {
            let st = tonic::Status::new(
                code,
                "h2 protocol error: error reading a body from connection",
            );
            assert!(StateError::from_status(Op::Create, &st).is_unavailable());
        }
        let other = tonic::Status::internal("stated failed to persist");
        assert!(!StateError::from_status(Op::Create, &other).is_unavailable());
    }

    #[test]
    fn messages_on_the_wire_are_bounded() {
        let long = "é".repeat(600_000);
        let st = StateError::new(ErrorKind::InvalidArgument, format!("id {long}")).to_status();
        assert!(
            st.message().len() <= MAX_STATUS_MESSAGE,
            "{}",
            st.message().len()
        );
        assert!(st.message().ends_with("bytes more)"));
        let q = quoted(&long);
        assert!(q.len() < 200 && q.contains("(1200000 bytes)"), "{q}");
        assert_eq!(quoted("eth0"), "\"eth0\"");
    }

    #[test]
    fn matrix_round_trips() {
        for (op, kind) in [
            (Op::Get, ErrorKind::NotFound),
            (Op::Create, ErrorKind::AlreadyExists),
            (Op::Update, ErrorKind::Conflict),
            (Op::Destroy, ErrorKind::Conflict),
            (Op::Update, ErrorKind::OwnerConflict),
            (Op::Update, ErrorKind::PhaseConflict),
            (Op::Watch, ErrorKind::InvalidBookmark),
            (Op::Create, ErrorKind::PermissionDenied),
            (Op::List, ErrorKind::InvalidArgument),
        ] {
            let msg = match kind {
                ErrorKind::OwnerConflict => format!("{OWNER_CONFLICT_PREFIX}: x"),
                ErrorKind::PhaseConflict => format!("{PHASE_PREFIX}: x"),
                _ => "x".to_string(),
            };
            let e = StateError::new(kind, msg);
            assert_eq!(
                StateError::from_status(op, &e.to_status()).kind(),
                kind,
                "{kind:?}"
            );
        }
    }
}
