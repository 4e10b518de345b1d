//! Table operations handled outside the dispatch itself: table creation and the memory
//! quota (`table`), range pulls (`pull`), incremental export (`changes`), decoding filtered frames (`filtered`) and vector
//! programs (`vecprog`).

pub(crate) mod changes;
pub(crate) mod filtered;
pub(crate) mod pull;
pub(crate) mod table;
pub(crate) mod vecprog;
