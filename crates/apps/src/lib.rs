//! # downpour-apps
//!
//! The math of the applications, separate from the cluster code so it is tested without
//! sockets: sparse logistic regression ([`linear`]), L1 logistic regression by delayed block proximal
//! gradient ([`l1lr`]) and evaluation metrics ([`metrics`]).

#![warn(missing_docs)]

pub mod l1lr;
pub mod linear;
pub mod metrics;
