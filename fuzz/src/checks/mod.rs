//! One module per fuzz target: `check(data)` runs the target's property on
//! one input and panics when it does not hold.
//!
//! The same files are compiled into the main crate's replay test
//! (`tests/it/fuzz_replay.rs`, by `#[path]`), which runs every committed
//! corpus and artifact file through them on each `cargo test`. So this code
//! uses only memvault's public API, `serde_json` and `tempfile`, and every
//! item here must be reachable from a `check`.

pub mod crypto_open;
pub mod differential;
pub mod input;
pub mod memory_path;
pub mod pack_merge;
pub mod protocol_line;
pub mod redact;
pub mod vault_log;

/// A temporary directory for a vault, under `/dev/shm` when it exists
/// (the vault targets make or copy a vault per input).
pub fn scratch_dir() -> tempfile::TempDir {
    match std::path::Path::new("/dev/shm").is_dir() {
        true => tempfile::tempdir_in("/dev/shm"),
        false => tempfile::tempdir(),
    }
    .expect("a temporary directory")
}

/// A target's check: panics when the property does not hold for the input.
pub type Check = fn(&[u8]);

/// Every target, by the name of its corpus folder, with its check.
pub const TARGETS: &[(&str, Check)] = &[
    ("protocol_line", protocol_line::check),
    ("memory_path", memory_path::check),
    ("crypto_open", crypto_open::check),
    ("redact", redact::check),
    ("differential", differential::check),
    ("vault_log", vault_log::check),
    ("pack_merge", pack_merge::check),
];
