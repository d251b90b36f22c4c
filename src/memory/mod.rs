//! The memory tool (`memory_20250818`) as pure semantics over a storage
//! trait.
//!
//! This layer owns the six commands and everything Claude sees of them:
//! the command types ([`Command`], [`parse_command`]), path validation
//! ([`MemoryPath`]: the only way to hold a path), the exact result strings
//! of `SPEC.md` ([`Memory::execute`]) and their layout (`render`). It knows
//! nothing of git, keys, files or the terminal: it reads a [`Snapshot`] and
//! describes each change as one [`Mutation`] that a [`Store`] makes
//! durable. [`MemStore`] is the in-memory store for tests and fuzzing.
//!
//! Promises: every path is validated before the store is touched; a bad
//! request changes nothing; every command answers with exactly one
//! [`ToolResult`] and never panics; a mutation's read and write happen in
//! one [`Store::write`] call.

pub mod command;
pub mod exec;
pub mod memstore;
pub mod path;
pub mod render;
pub mod result;
pub mod store;

pub use command::{COMMAND_NAMES, Command, parse_command};
pub use exec::{FilterOutcome, Memory, MemoryConfig, TextFilter};
pub use memstore::MemStore;
pub use path::{
    MAX_DEPTH, MAX_PATH_BYTES, MAX_SEGMENT_BYTES, MemoryPath, PathError, PathRule, ROOT,
};
pub use result::{Content, ToolResult};
pub use store::{
    Change, ChangeFacts, DirEntry, Mutation, NodeKind, Op, Outcome, Snapshot, Store, StoreError,
};
