//! Errors of reconciles and of the runtime itself.

use crate::error::StateError;
use crate::resource::SpecError;

/// Why a reconcile failed. Any error makes the runtime retry the controller after a backoff.
#[derive(Debug, thiserror::Error)]
pub enum ReconcileError {
    /// A State API call failed; `kind()` tells whether stated was unreachable.
    #[error(transparent)]
    State(#[from] StateError),
    /// A spec could not be encoded or decoded.
    #[error(transparent)]
    Spec(#[from] SpecError),
    /// The controller wrote a type it did not declare as an output.
    #[error("controller {controller} does not declare {type} as an output")]
    NotAnOutput {
        /// The controller.
        controller: &'static str,
        /// The type it tried to write.
        r#type: String,
    },
    /// The controller read a resource that is neither an input nor an output of it, or put a
    /// finalizer on a resource that is not a strong input.
    #[error("controller {controller} does not declare {namespace}/{type}{} as {what}", id.as_deref().map(|i| format!("/{i}")).unwrap_or_default())]
    NotAnInput {
        /// The controller.
        controller: &'static str,
        /// Namespace of the access.
        namespace: String,
        /// Type of the access.
        r#type: String,
        /// ID of the access, `None` for a list.
        id: Option<String>,
        /// What the declaration would have had to be (`an input`, `a strong input`).
        what: &'static str,
    },
    /// The controller's own logic failed, with its cause.
    #[error("{context}")]
    Failed {
        /// What the controller was doing.
        context: String,
        /// Why it failed.
        #[source]
        source: Box<dyn std::error::Error + Send + Sync + 'static>,
    },
    /// The controller's own logic failed.
    #[error("{0}")]
    Other(String),
}

impl ReconcileError {
    /// A failure of the controller's own logic, with a message.
    pub fn other(message: impl Into<String>) -> Self {
        Self::Other(message.into())
    }

    /// A failure of the controller's own logic while doing `context`, caused by `source`.
    pub fn failed(
        context: impl Into<String>,
        source: impl Into<Box<dyn std::error::Error + Send + Sync + 'static>>,
    ) -> Self {
        Self::Failed {
            context: context.into(),
            source: source.into(),
        }
    }

    /// The State API error, if this is one.
    pub fn state(&self) -> Option<&StateError> {
        match self {
            Self::State(e) => Some(e),
            _ => None,
        }
    }
}

/// An error of registering controllers or of running the runtime.
#[derive(Debug, thiserror::Error)]
pub enum RuntimeError {
    /// Two controllers have the same name (the owner string of their outputs).
    #[error("controller {name} is registered twice")]
    DuplicateController {
        /// The name.
        name: String,
    },
    /// An exclusive output type is claimed by two controllers, or is also a shared output.
    #[error("output {type} of controller {controller} conflicts with controller {existing}: an exclusive output has one writer")]
    OutputConflict {
        /// The type.
        r#type: String,
        /// The controller being registered.
        controller: String,
        /// The controller that already declares the type.
        existing: String,
    },
    /// A controller declares the same input twice.
    #[error("controller {controller} declares input {namespace}/{type}{} twice", id.as_deref().map(|i| format!("/{i}")).unwrap_or_default())]
    DuplicateInput {
        /// The controller.
        controller: String,
        /// Namespace.
        namespace: String,
        /// Type.
        r#type: String,
        /// ID, if any.
        id: Option<String>,
    },
    /// A task of the runtime itself (not a controller) panicked: a bug in the runtime.
    #[error("controller runtime task failed")]
    Task(#[source] tokio::task::JoinError),
}

/// Why a daemon built on the runtime stopped: what every daemon's `run` shares (networkd,
/// secretsd, trustd).
#[derive(Debug, thiserror::Error)]
pub enum DaemonError {
    /// The socket path is unusable.
    #[error("cannot create a stated client for {socket}")]
    Client {
        /// The socket.
        socket: std::path::PathBuf,
        /// The cause.
        #[source]
        source: StateError,
    },
    /// Two controllers conflict (a bug).
    #[error("cannot register the controllers")]
    Register(#[source] RuntimeError),
    /// The runtime itself failed (a bug).
    #[error("controller runtime failed")]
    Runtime(#[source] RuntimeError),
}
