//! The lock service's pure core: the replicated lock table and the leader's
//! lease clock. No IO and no clock reads here; `server` wraps them.

pub(crate) mod clock;
pub(crate) mod state;
pub mod validate;
