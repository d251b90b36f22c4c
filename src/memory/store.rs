//! The storage contract the six commands run on.
//!
//! The memory layer never touches files, git or keys: it reads through a
//! [`Snapshot`] and describes a write as one [`Mutation`]. A [`Store`] decides
//! how that is made durable. The encrypted git vault is one implementation,
//! [`super::MemStore`] (in memory, for tests and fuzzing) is another.
//!
//! Contract every implementation keeps:
//! - `/memories` always exists and is a directory.
//! - A directory exists exactly when some file lies below it (as in git
//!   trees: there are no empty directories).
//! - [`Store::write`] runs its closure on the newest state while holding the
//!   writer lock, and applies the returned mutation atomically: either the
//!   whole change is durable before `write` returns `Ok`, or nothing changed.
//!   The closure may run more than once (retry on a newer tip), so it must
//!   not have side effects.

use zeroize::Zeroizing;

use super::path::MemoryPath;
use super::result::ToolResult;

/// What a path names.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum NodeKind {
    File,
    Dir,
}

/// One direct child of a directory.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DirEntry {
    /// The plaintext name of the child (one path segment).
    pub name: String,
    pub kind: NodeKind,
    /// Plaintext size in bytes; for a directory, the sum over every file
    /// below it, at any depth.
    pub size: u64,
}

/// Read access to one consistent state of the store.
pub trait Snapshot {
    /// What `path` names, if anything. The root is always a directory.
    fn kind(&self, path: &MemoryPath) -> Result<Option<NodeKind>, StoreError>;
    /// The content of the file at `path`. A missing path or a directory is
    /// [`StoreError::NotFound`].
    fn read(&self, path: &MemoryPath) -> Result<Zeroizing<Vec<u8>>, StoreError>;
    /// The direct children of the directory at `dir`, sorted by name
    /// (byte order). A missing path or a file is [`StoreError::NotFound`].
    fn list(&self, dir: &MemoryPath) -> Result<Vec<DirEntry>, StoreError>;
}

/// A change to the tree.
pub enum Change {
    /// Create or replace the file at `path`; missing parents come into being.
    Write {
        path: MemoryPath,
        content: Zeroizing<Vec<u8>>,
    },
    /// Remove the file or the directory (with everything below it).
    Delete { path: MemoryPath },
    /// Move a file or a directory; missing parents of `to` come into being.
    Rename { from: MemoryPath, to: MemoryPath },
}

/// What a mutation was, for the audit record.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Op {
    Create,
    Overwrite,
    StrReplace,
    Insert,
    Delete,
    Rename,
}

impl Op {
    /// Stable name used in commit metadata and `history`.
    pub fn as_str(self) -> &'static str {
        match self {
            Op::Create => "create",
            Op::Overwrite => "overwrite",
            Op::StrReplace => "str_replace",
            Op::Insert => "insert",
            Op::Delete => "delete",
            Op::Rename => "rename",
        }
    }
}

/// Audit facts about a mutation that only the memory layer knows.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ChangeFacts {
    /// Lines added and removed by an edit (create counts every line added).
    pub lines_added: u32,
    pub lines_removed: u32,
    /// Redaction kinds and counts applied to the written text.
    pub redactions: Vec<(String, u32)>,
}

/// One mutation: the change and its audit facts.
pub struct Mutation {
    pub op: Op,
    pub change: Change,
    pub facts: ChangeFacts,
}

/// What a write closure decided: the tool result to answer with, and the
/// mutation to apply (none when the command failed or changed nothing).
pub struct Outcome {
    pub result: ToolResult,
    pub mutation: Option<Mutation>,
}

/// Why a store could not serve a request. These are not command errors
/// ("file not found" for a command is an ordinary result); they are
/// problems with the store itself, except [`StoreError::NotFound`].
#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    /// The path does not exist (or is not of the kind asked for).
    #[error("not found")]
    NotFound,
    /// Stored bytes failed authentication or could not be parsed.
    #[error(
        "the vault is damaged ({0}); nothing was returned or changed. Run `memvault verify` to locate the damage"
    )]
    Damaged(String),
    /// This version of a file was erased on purpose: its key was destroyed.
    #[error(
        "this version of the file was erased (its key was destroyed by expiry or purge); it can no longer be read"
    )]
    Erased,
    /// A limit of the store refused the change before any work was done.
    #[error("{0}")]
    Limit(String),
    /// The store could not be reached or written (I/O, lock).
    #[error("the vault could not complete the operation ({0}); nothing was changed")]
    Unavailable(String),
}

/// A store the six commands can run on.
pub trait Store {
    /// Run `f` on the newest committed state.
    fn read(
        &mut self,
        f: &mut dyn FnMut(&dyn Snapshot) -> Result<ToolResult, StoreError>,
    ) -> Result<ToolResult, StoreError>;

    /// Run `f` on the newest state under the writer lock and apply the
    /// mutation it returns, durably and atomically, before returning.
    fn write(
        &mut self,
        f: &mut dyn FnMut(&dyn Snapshot) -> Result<Outcome, StoreError>,
    ) -> Result<ToolResult, StoreError>;

    /// Called after a `view` of a file returned its content, so a store
    /// may record the access (expiry). Directory views do not call it.
    fn note_viewed(&mut self, _path: &MemoryPath) {}

    /// Called by `serve` once a reply has been written and flushed: the
    /// moment for housekeeping the request need not wait for (a vault
    /// runs a due checkpoint here).
    fn after_reply(&mut self) {}
}
