//! # downpour-apps
//!
//! The math of the applications, separate from the cluster code so it is tested without
//! sockets: sparse logistic regression ([`linear`]) and evaluation metrics ([`metrics`]).

#![warn(missing_docs)]

pub mod linear;
pub mod metrics;
