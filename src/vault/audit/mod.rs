//! Audit: what a person asks of the history an agent left. Decrypted
//! history and per-file history ([`history`], with the sealed
//! [`index`] cache that makes it fast), revert and restore as new commits
//! ([`undo`]), the whole-history check with the rollback mark
//! ([`verify`]), and the plaintext scan of the demo ([`inspect`]).
//!
//! What it promises: nothing here changes history except by a new commit
//! through the one publish path; the index is trusted only where it
//! chains to commits read from main itself, so it never adds to history;
//! verify reports each problem with its revision and path, and never
//! calls damage a rollback.

pub(crate) mod history;
pub(crate) mod index;
#[cfg(feature = "cli")]
pub(crate) mod inspect;
pub(crate) mod undo;
pub(crate) mod verify;
