//! The storage engine: git objects, the write-ahead log, checkpoints,
//! packs and their maintenance, the lock and the file-system rules. It
//! knows nothing of memory paths, sealing or key state: it moves bytes
//! whose integrity it checks (hashes, checksums, the log's tags) and
//! never the meaning.
//!
//! What it promises:
//! - no object reaches libgit2's reader unchecked ([`objects`]);
//! - a record of the log ([`wal`]) is the commit and its ref moves:
//!   durable with one `fdatasync`, refused before writing if a reader
//!   would refuse it, tagged and chained so that no entry from elsewhere
//!   or out of place is applied;
//! - a checkpoint ([`checkpoint`]) forgets log records only once git
//!   holds them, synced; packs are merged ([`gc`]) without losing an
//!   object that checks out, and `gc` deletes only what neither ref
//!   reaches;
//! - one lock type ([`lock::FileLock`]); no file inside the vault is
//!   opened through a symbolic link, and everything is private to its
//!   owner ([`fsx`]); libgit2 never syncs, memvault does ([`fsync`]).
//!
//! Its errors are the vault's ([`crate::vault::VaultError`], which names
//! the engine's own [`wal::WalError`] and [`objects::ObjectError`]); it
//! imports nothing else from the vault.

/// The branch that holds the memory history.
pub(crate) const MAIN_REF: &str = "refs/heads/main";
/// The ref that holds the key state.
pub(crate) const KEYS_REF: &str = "refs/memvault/keys";

pub(crate) mod checkpoint;
pub(crate) mod fsx;
pub mod fsync;
pub(crate) mod gc;
pub(crate) mod lock;
pub(crate) mod objects;
pub(crate) mod pack;
pub(crate) mod raw;
pub(crate) mod wal;
