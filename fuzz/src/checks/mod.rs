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

/// Copy a vault directory, except the files named in `skip` (at any
/// depth).
pub fn copy_dir(from: &std::path::Path, to: &std::path::Path, skip: &[&str]) {
    std::fs::create_dir_all(to).expect("copy target");
    for e in std::fs::read_dir(from).expect("template dir") {
        let e = e.expect("template entry");
        if skip.iter().any(|s| e.file_name() == *s) {
            continue;
        }
        let target = to.join(e.file_name());
        if e.file_type().expect("file type").is_dir() {
            copy_dir(&e.path(), &target, skip);
        } else {
            std::fs::copy(e.path(), &target).expect("copy a template file");
        }
    }
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
