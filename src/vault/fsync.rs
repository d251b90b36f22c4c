//! The one libgit2 option memvault sets through the raw FFI.
//!
//! git2 does not expose `GIT_OPT_ENABLE_FSYNC_GITDIR`, and without it
//! libgit2 writes objects and refs without fsync: a power loss could lose a
//! commit that memvault already acknowledged. [`enable`] turns it on once per
//! process, before any repository is opened.
#![allow(unsafe_code)]

use std::ffi::c_int;
use std::sync::Once;

static FSYNC: Once = Once::new();

fn set_fsync(on: bool) {
    // Initialise libgit2's global state through a safe git2 call first.
    git2::opts::strict_hash_verification(true);
    // SAFETY: `git_libgit2_opts(GIT_OPT_ENABLE_FSYNC_GITDIR, int)` takes
    // exactly one `int` vararg, which we pass as `c_int`, and only stores a
    // global flag. libgit2 is initialised by the call above. Callers reach
    // this through `Once` (enable) or in a single-threaded benchmark set-up.
    let rc = unsafe {
        libgit2_sys::git_libgit2_opts(
            libgit2_sys::GIT_OPT_ENABLE_FSYNC_GITDIR as c_int,
            c_int::from(on),
        )
    };
    debug_assert!(rc >= 0, "libgit2 refused GIT_OPT_ENABLE_FSYNC_GITDIR");
}

/// Make every object, ref and directory write that libgit2 does durable.
/// Safe to call many times; only the first call does anything.
pub fn enable() {
    FSYNC.call_once(|| set_fsync(true));
}

/// Turn fsync on or off for the rest of the process: only for the
/// benchmark's comparison mode, never in the CLI.
pub fn set_for_benchmark(on: bool) {
    enable();
    set_fsync(on);
}
