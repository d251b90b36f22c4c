//! The vault's errors, and the one mapping each way between them and the
//! memory layer's [`StoreError`].
//!
//! Policy: a variant per kind of failure; damage carries a fixed
//! description of what failed (never content, a path or a key); libgit2's
//! messages reach a person through the CLI, never a tool result (which
//! gets the error's class and code). The CLI adds the sentence a person
//! needs (see `cli::CliError`).

use std::path::PathBuf;

use super::FORMAT;
use super::engine::{fsx, objects, wal};
use crate::memory::StoreError;

/// Why a vault could not be created, opened or written.
#[derive(Debug, thiserror::Error)]
pub enum VaultError {
    #[error("no vault at {0}: create one with `memvault init`")]
    NotFound(PathBuf),
    #[error("{0} exists and is not an empty directory; choose a new location for the vault")]
    NotEmpty(PathBuf),
    #[error("{0} is not a memvault vault (no memvault/format file)")]
    NotAVault(PathBuf),
    /// The format file is there but does not say a format.
    #[error(
        "the vault is damaged: its memvault/format file does not name a format (it must read `memvault vault format N`); nothing was changed"
    )]
    BadFormatFile,
    #[error("the passphrase or key file does not unlock this vault")]
    WrongSecret,
    /// The secret opens no keyslot, and the one this machine last
    /// unlocked with is gone from the key state (removed by `key remove`
    /// or `rekey --drop-other-slots`, or replaced by `passwd` or `rekey`;
    /// possibly on another machine, brought here by a sync): said, rather
    /// than only "does not unlock".
    #[error(
        "the passphrase or key file does not unlock this vault, and keyslot {0}, which this machine last unlocked it with, is gone from the vault (removed by memvault key remove or rekey --drop-other-slots, or replaced by passwd or rekey; here or on a machine this one synced with)"
    )]
    SlotRemoved(String),
    #[error("this vault has no keyslot of that kind (passphrase or key file)")]
    NoSlotOfKind,
    #[error("the vault's key derivation parameters exceed the allowed maximum; refusing to derive")]
    ExcessiveWork,
    /// Stored bytes failed a check; the text says which part (it never
    /// carries content, a path or a key).
    #[error("the vault is damaged: {0}")]
    Damaged(&'static str),
    /// A stored object or pack failed its check before libgit2 read it
    /// (see [`objects`]).
    #[error("the vault is damaged: {0}")]
    Object(objects::ObjectError),
    /// A ref was set back to an older state than this vault has reached
    /// (refused: it would bring back erased keys or removed keyslots).
    #[error("the vault is damaged: {0}")]
    RolledBack(String),
    /// The log was damaged in the middle: entries that check out follow
    /// one that does not (the text says where, and what to do).
    #[error("the vault is damaged: {0}")]
    DamagedLog(String),
    #[error(
        "{0:?} is not a revision on this vault's main branch (give a commit id from `memvault history`, 4 to 40 hex digits, or HEAD~N)"
    )]
    BadRevision(String),
    /// A revision written as one should be that names no commit on main
    /// (a failure, not a usage error).
    #[error(
        "{0:?} is not a revision on this vault's main branch (give a commit id from `memvault history`, or HEAD~N)"
    )]
    UnknownRevision(String),
    #[error("{0}")]
    Refused(String),
    #[error("invalid vault settings: {0}")]
    Config(&'static str),
    #[error(
        "memvault/config.json is not read since vault format 2: the settings live in the key state, authenticated. It was written by someone, or left by an earlier memvault stopped while it migrated a format-1 vault; nothing was changed. Remove it, and change settings with `memvault config set`"
    )]
    StraySettings,
    #[error(
        "this vault has format {0}, newer than this memvault understands (up to {FORMAT}): upgrade memvault"
    )]
    NewerFormat(u32),
    #[error("cannot take the writer lock (memvault/lock): {0}")]
    Lock(std::io::Error),
    #[error("the change was written but could not be made durable ({0}); check the disk")]
    NotDurable(std::io::Error),
    /// An error of the memory layer's store, carried unchanged (so a
    /// round trip through [`StoreError`] loses nothing).
    #[error(transparent)]
    Store(#[from] StoreError),
    #[error("git error: {0}")]
    Git(GitError),
    #[error("cannot write the vault's log (memvault/wal): {0}")]
    Log(std::io::Error),
    #[error("the vault is not safe to use: {0}; nothing was changed")]
    Unsafe(#[from] fsx::Unsafe),
    #[error("I/O error: {0}")]
    Io(#[from] std::io::Error),
    /// A sync step failed (see `vault::sync`).
    #[error(transparent)]
    Sync(Box<super::sync::SyncError>),
}

/// A libgit2 failure, kept opaque so that no git2 type is part of the
/// vault's API.
#[derive(Debug)]
pub struct GitError(git2::Error);

impl std::fmt::Display for GitError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        self.0.fmt(f)
    }
}

impl std::error::Error for GitError {}

impl From<git2::Error> for VaultError {
    fn from(e: git2::Error) -> Self {
        // The object store's own refusals travel as libgit2 errors.
        for damage in [wal::ALTERNATES_FOUND, wal::MIDX_FOUND] {
            if e.message() == damage {
                return VaultError::Damaged(damage);
            }
        }
        VaultError::Git(GitError(e))
    }
}

pub(crate) fn damaged(what: &'static str) -> VaultError {
    VaultError::Damaged(what)
}

impl VaultError {
    /// Stored bytes failed a check (as opposed to a refusal, a wrong
    /// secret or an I/O failure).
    pub fn is_damage(&self) -> bool {
        matches!(
            self,
            VaultError::Damaged(_)
                | VaultError::Object(_)
                | VaultError::RolledBack(_)
                | VaultError::DamagedLog(_)
                | VaultError::BadFormatFile
        ) || matches!(self, VaultError::Store(StoreError::Damaged(_)))
    }

    /// The disk holding the vault is full (or the user's quota reached).
    pub fn is_disk_full(&self) -> bool {
        match self {
            VaultError::Io(e) | VaultError::Log(e) => {
                matches!(
                    e.kind(),
                    std::io::ErrorKind::StorageFull | std::io::ErrorKind::QuotaExceeded
                )
            }
            // libgit2 (and memvault's writes reported through it) keep no
            // errno: the message carries the system's.
            VaultError::Git(GitError(e)) => {
                e.message().contains("No space left on device")
                    || e.message().contains("Disk quota exceeded")
            }
            _ => false,
        }
    }
}

impl From<wal::WalError> for VaultError {
    fn from(e: wal::WalError) -> Self {
        use wal::WalError as W;
        match e {
            W::Io(e) => VaultError::Log(e),
            W::Git(e) => e.into(),
            W::TooLarge { .. } => VaultError::Refused(e.to_string()),
            W::Forged => VaultError::Damaged(
                "the write-ahead log (memvault/wal) holds an entry that was not written with this vault's key (a log copied from another vault, or a forged entry)",
            ),
            W::Replayed => VaultError::Damaged(
                "the write-ahead log (memvault/wal) holds a record that does not build on the one before it (an earlier record replayed)",
            ),
            W::BadObject => VaultError::Damaged(
                "the write-ahead log (memvault/wal) holds an object that does not match its id",
            ),
            W::Damaged { .. } => VaultError::DamagedLog(e.to_string()),
            W::NotReady => VaultError::Damaged(
                "the write-ahead log (memvault/wal) cannot take a record before it was read",
            ),
        }
    }
}

/// The one mapping from the vault's errors to the memory layer's (the
/// other way is `VaultError::Store`, lossless).
impl From<VaultError> for StoreError {
    fn from(e: VaultError) -> Self {
        match e {
            VaultError::Store(e) => e,
            VaultError::Damaged(what) => StoreError::Damaged(what.to_string()),
            VaultError::RolledBack(what) | VaultError::DamagedLog(what) => {
                StoreError::Damaged(what)
            }
            VaultError::Object(e) => StoreError::Damaged(e.to_string()),
            VaultError::Refused(what) => StoreError::Limit(what),
            // libgit2 keeps no errno; its message says when the disk is
            // full, which is then what the answer says (not damage).
            ref full @ (VaultError::Git(_) | VaultError::Io(_)) if full.is_disk_full() => {
                StoreError::Unavailable(
                    "the vault's disk is full (no space left on device); free space and try again"
                        .into(),
                )
            }
            VaultError::Git(e) => git_unavailable(&e.0),
            other => StoreError::Unavailable(other.to_string()),
        }
    }
}

pub(crate) fn ge(e: git2::Error) -> StoreError {
    git_unavailable(&e)
}

/// A libgit2 failure as a tool result says it: its class and code, not
/// libgit2's message (which can name files of the vault directory).
pub(crate) fn git_unavailable(e: &git2::Error) -> StoreError {
    StoreError::Unavailable(format!(
        "the git object store failed ({:?}, {:?}); run `memvault verify`",
        e.class(),
        e.code()
    ))
}

impl From<objects::ObjectError> for VaultError {
    fn from(e: objects::ObjectError) -> Self {
        VaultError::Object(e)
    }
}
