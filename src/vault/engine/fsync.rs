//! Durability switches: the one libgit2 option memvault sets through the
//! raw FFI, and the process-wide "sync to disk" flag of the write-ahead log.
//!
//! memvault makes a mutation durable with one `fdatasync` of its
//! write-ahead log record (see `wal`), not with libgit2's own fsyncs (about
//! twelve per commit with loose objects). So [`enable`] turns libgit2's
//! `GIT_OPT_ENABLE_FSYNC_GITDIR` *off*: objects and refs written through
//! libgit2 are made durable later, in one go, by a checkpoint that writes a
//! pack and syncs it, the refs and their directories itself.
//!
//! The benchmarks' comparison mode and the fuzzers turn the log's own
//! syncing off with `set_for_benchmark` (the binary, with
//! `MEMVAULT_BENCH_NO_FSYNC=1`: `set_from_env_for_benchmark`), which exist
//! only in a build with the `bench-hooks` feature (never a shipped binary:
//! without it memvault always syncs).
#![allow(unsafe_code)]

use std::ffi::c_int;
use std::fs::File;
use std::path::Path;
use std::sync::Once;
#[cfg(feature = "bench-hooks")]
use std::sync::atomic::{AtomicBool, Ordering};

static INIT: Once = Once::new();
#[cfg(feature = "bench-hooks")]
static SYNC: AtomicBool = AtomicBool::new(true);

fn set_libgit2_fsync(on: bool) {
    // Initialise libgit2's global state through a safe git2 call first.
    git2::opts::strict_hash_verification(true);
    // SAFETY: `git_libgit2_opts(GIT_OPT_ENABLE_FSYNC_GITDIR, int)` takes
    // exactly one `int` vararg, which we pass as `c_int`, and only stores a
    // global flag. libgit2 is initialised by the call above. Callers reach
    // this through `Once`.
    let rc = unsafe {
        libgit2_sys::git_libgit2_opts(
            libgit2_sys::GIT_OPT_ENABLE_FSYNC_GITDIR as c_int,
            c_int::from(on),
        )
    };
    debug_assert!(rc >= 0, "libgit2 refused GIT_OPT_ENABLE_FSYNC_GITDIR");
    // libgit2 caches parsed trees only up to 4 KiB by default, so a
    // directory of a hundred files was read, inflated, hashed and parsed
    // again on every lookup. Cache trees up to 1 MiB (the cache's total
    // stays bounded by libgit2's 256 MiB default).
    // SAFETY: `git_libgit2_opts(GIT_OPT_SET_CACHE_OBJECT_LIMIT, type, size)`
    // only stores a global limit; libgit2 is initialised above, and this
    // runs once, before any repository is opened.
    let rc = unsafe { git2::opts::set_cache_object_limit(git2::ObjectType::Tree, 1 << 20) };
    debug_assert!(rc.is_ok(), "libgit2 refused GIT_OPT_SET_CACHE_OBJECT_LIMIT");
    // libgit2's strict object creation looks up every object a new tree or
    // commit names, to check it exists: a directory of 600 files cost 600
    // object-database lookups per write. memvault names only objects it
    // has just written or read. Reads still check every object's hash
    // (strict hash verification stays on, above), which is what detects
    // a changed tree.
    git2::opts::strict_object_creation(false);
}

/// Set libgit2 up for memvault's durability scheme (its own fsyncs off:
/// the write-ahead log and checkpoints sync instead). Safe to call many
/// times; only the first call does anything. Call before opening any
/// repository.
pub fn enable() {
    INIT.call_once(|| set_libgit2_fsync(false));
}

/// Turn memvault's own syncing (log records, checkpoints) on or off for
/// the rest of the process: only for the benchmark's comparison mode,
/// never in the CLI. Off, an acknowledged mutation can be lost on power
/// failure. Only in a build with the `bench-hooks` feature.
#[cfg(feature = "bench-hooks")]
pub fn set_for_benchmark(on: bool) {
    enable();
    SYNC.store(on, Ordering::SeqCst);
}

/// Bench-only hook, read once at the start of the `memvault` binary
/// (`cli::main`): with `MEMVAULT_BENCH_NO_FSYNC=1` in the environment,
/// [`set_for_benchmark`]`(false)` for the whole process, so that
/// `benches/peer.rs` can run `memvault serve` with fsync off. Only in a
/// build with the `bench-hooks` feature: a default build never reads it.
#[cfg(feature = "bench-hooks")]
pub fn set_from_env_for_benchmark() {
    if std::env::var_os("MEMVAULT_BENCH_NO_FSYNC").is_some_and(|v| v == "1") {
        set_for_benchmark(false);
    }
}

/// Whether memvault syncs its writes: always, except in a `bench-hooks`
/// build whose benchmark or fuzzer turned syncing off.
pub(crate) fn syncing() -> bool {
    #[cfg(feature = "bench-hooks")]
    return SYNC.load(Ordering::Relaxed);
    #[cfg(not(feature = "bench-hooks"))]
    true
}

/// `fdatasync` a file (unless syncing is off for a benchmark).
pub(crate) fn sync_data(f: &File) -> std::io::Result<()> {
    if syncing() { f.sync_data() } else { Ok(()) }
}

/// `fsync` a file by path (unless syncing is off for a benchmark).
pub(crate) fn sync_path(p: &Path) -> std::io::Result<()> {
    if syncing() {
        File::open(p)?.sync_all()
    } else {
        Ok(())
    }
}
