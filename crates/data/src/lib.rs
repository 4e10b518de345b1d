//! # downpour-data
//!
//! Data input for the applications, kept out of the apps themselves:
//!
//! * [`libsvm`]: a streaming LIBSVM/svmlight reader (`.gz` read transparently, detected by
//!   its magic bytes) whose errors name the file and line;
//! * [`batch`]: minibatches as the parameter server wants them: the sorted, unique union of
//!   the examples' keys (what a worker pulls and pushes) plus each example's features as
//!   indices into that union.

#![warn(missing_docs)]

pub mod batch;
pub mod libsvm;

/// One labelled sparse example.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Example {
    /// Label in {0, 1}.
    pub label: f32,
    /// Feature ids, in the order they appeared.
    pub keys: Vec<u64>,
    /// Feature values, one per key.
    pub values: Vec<f32>,
}
