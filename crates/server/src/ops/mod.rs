//! Table operations handled outside the dispatch itself: table creation and the memory
//! quota (`table`), range pulls (`pull`), incremental export (`changes`), a read cache's
//! update feed (`feed`), decoding filtered frames (`filtered`), range pushes applied from
//! a shared-memory ring in pieces (`pieces`), pushes at the rows their pull noted (`noted`)
//! and vector programs (`vecprog`).

pub(crate) mod changes;
pub(crate) mod feed;
pub(crate) mod filtered;
pub(crate) mod noted;
pub(crate) mod pieces;
pub(crate) mod pull;
pub(crate) mod table;
pub(crate) mod vecprog;
