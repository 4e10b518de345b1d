//! # downpour-data
//!
//! Data input for the applications, kept out of the apps themselves:
//!
//! * [`libsvm`]: a streaming LIBSVM/svmlight reader (`.gz` read transparently, detected by
//!   its magic bytes) whose errors name the file and line;
//! * [`idx`]: IDX arrays (the MNIST format; gzip detected by its magic bytes) with a bounded
//!   declared size, errors that name the file, and MNIST image/label helpers;
//! * [`text`]: JSON-lines text (`--format text-jsonl`) tokenised and feature-hashed with a
//!   stable, documented hash, log(1+tf) weights, unit L2 norm;
//! * [`Format`] / [`ExampleReader`]: one reader over both formats;
//! * [`lines`] / [`share`]: each worker's share of the input (byte ranges of plain files,
//!   every W-th line of gzip files), read with a seeded per-epoch shuffle buffer;
//! * [`ratings`]: (user, item, rating) files for matrix factorisation;
//! * [`ldac`]: bag-of-words corpora (LDA-C) and vocabularies for topic models;
//! * [`scaling`]: per-feature division and standardisation of values (`--scale`), with
//!   the map back to a model on the original values;
//! * [`batch`]: minibatches as the parameter server wants them: the sorted, unique union of
//!   the examples' keys (what a worker pulls and pushes) plus each example's features as
//!   indices into that union.

#![warn(missing_docs)]

/// The feature id of the constant feature (value 1) that `train linear --bias` adds to every
/// example: its weight is the model's intercept. An input that uses this id itself is read as
/// it is, and shares its weight.
pub const BIAS_ID: u64 = u64::MAX - 1;

pub mod batch;
pub mod idx;
pub mod ldac;
pub mod libsvm;
pub mod lines;
pub mod ratings;
pub mod scaling;
pub mod share;
pub mod synth;
pub mod text;

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

/// Input format of example files.
#[derive(Clone, Debug)]
pub enum Format {
    /// LIBSVM/svmlight, its labels read by the rule.
    Libsvm(libsvm::Labels),
    /// JSON lines with a text and a label field.
    TextJsonl(text::TextOptions),
}

/// A reader over either format.
pub enum ExampleReader {
    /// LIBSVM.
    Libsvm(libsvm::LibsvmReader),
    /// JSON lines.
    Text(text::JsonlReader),
}

impl ExampleReader {
    /// Opens `path` in `format`.
    pub fn open(path: &std::path::Path, format: &Format) -> Result<Self, libsvm::DataError> {
        Ok(match format {
            Format::Libsvm(l) => ExampleReader::Libsvm(libsvm::LibsvmReader::open(path)?.with_labels(*l)),
            Format::TextJsonl(o) => ExampleReader::Text(text::JsonlReader::open(path, o.clone())?),
        })
    }

    /// Opens one worker's piece of a file in `format`.
    pub fn open_piece(piece: &lines::Piece, format: &Format) -> Result<Self, libsvm::DataError> {
        Ok(match format {
            Format::Libsvm(l) => ExampleReader::Libsvm(libsvm::LibsvmReader::open_piece(piece)?.with_labels(*l)),
            Format::TextJsonl(o) => ExampleReader::Text(text::JsonlReader::open_piece(piece, o.clone())?),
        })
    }

    /// Bytes of input consumed so far.
    pub fn consumed(&self) -> u64 {
        match self {
            ExampleReader::Libsvm(r) => r.consumed(),
            ExampleReader::Text(r) => r.consumed(),
        }
    }

    /// A `FILE:LINE: what` error for the example read last (for checks made after parsing).
    pub fn error(&mut self, what: impl Into<String>) -> libsvm::DataError {
        match self {
            ExampleReader::Libsvm(r) => r.error(what),
            ExampleReader::Text(r) => r.error(what),
        }
    }

    /// Reads the next example into `ex`; `Ok(false)` at the end.
    pub fn next_into(&mut self, ex: &mut Example) -> Result<bool, libsvm::DataError> {
        match self {
            ExampleReader::Libsvm(r) => r.next_into(ex),
            ExampleReader::Text(r) => r.next_into(ex),
        }
    }
}
