//! Retention: how long memory is kept and how it is destroyed. Access
//! tracking (the sealed `memvault/access` log of views and writes,
//! [`access`]), the expiry sweep and purge by crypto-erasure
//! ([`erase`]), and the clock they read ([`clock`], injectable).
//!
//! What it promises: an erasure destroys every key of the versions it
//! names in the same log record as its tombstone commit, then prunes the
//! replaced key states so the keys are physically gone; a crash leaves
//! none of it or all of it; a lost access record makes a time older than
//! the truth, never newer, so a sweep never removes a file viewed since.

pub(crate) mod access;
pub mod clock;
pub(crate) mod erase;
