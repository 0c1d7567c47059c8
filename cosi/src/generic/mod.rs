//! Generic controllers built on [`crate::runtime`]: implement a small trait, get a controller.
//!
//! - [`transform`]: one input type → one output type by a pure function, per resource;
//! - [`merge`]: candidates of one type tagged with a layer → one winner per merge key.

pub mod merge;
pub mod transform;

pub use merge::{merge_candidates, Layered, LayeredMerge, Merge, MergeController};
pub use transform::{Transform, TransformController};
