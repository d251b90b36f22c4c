//! The raw FFI, in one place: durability switches (the one libgit2 option
//! memvault sets through it, and the process-wide "sync to disk" flag of
//! the write-ahead log), and the direct write into an in-memory object
//! store ([`mempack_odb`], [`mempack_write`]), a `poll` of `serve`'s
//! input ([`readable_now`]), and `memvault server`'s open-files limit
//! ([`raise_open_files`]).
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

use std::ffi::{c_int, c_void};
use std::fs::File;
use std::path::Path;
use std::sync::{Mutex, Once};

use git2::{Binding, ObjectType, Odb, Oid, Repository};
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
    // A vault is read with its own settings only: never the user's or the
    // system's git config (`~/.gitconfig`, `$XDG_CONFIG_HOME/git/config`,
    // `/etc/gitconfig`). A FIFO there made every command hang, an
    // unreadable home made an intact vault "not a memvault vault", and a
    // setting there (`core.compression`) changed what memvault wrote. The
    // git subprocesses of sync read them as git does (remote helpers,
    // SSH, credentials).
    for level in [
        git2::ConfigLevel::ProgramData,
        git2::ConfigLevel::System,
        git2::ConfigLevel::XDG,
        git2::ConfigLevel::Global,
    ] {
        // SAFETY: `git_libgit2_opts(GIT_OPT_SET_SEARCH_PATH, level, path)`
        // stores the search path of one config level in libgit2's global
        // state; git2 passes a valid C string (empty: search nowhere).
        // This runs once (through `Once`), before any repository is
        // opened, so nothing reads that state meanwhile.
        let rc = unsafe { git2::opts::set_search_path(level, "") };
        debug_assert!(rc.is_ok(), "libgit2 refused GIT_OPT_SET_SEARCH_PATH");
    }
}

/// Set libgit2 up for memvault's durability scheme (its own fsyncs off:
/// the write-ahead log and checkpoints sync instead). Safe to call many
/// times; only the first call does anything. Call before opening any
/// repository.
pub fn enable() {
    INIT.call_once(|| set_libgit2_fsync(false));
}

/// For a process that keeps many vaults open at once (`memvault server`):
/// bound libgit2's process-wide memory, its object cache to `cache_bytes`
/// and its mapped pack windows to `mapped_bytes` (least recently used
/// windows are unmapped past it), and the pack files it keeps open to
/// `pack_files`. Call before any other thread is started.
pub fn limit_for_many_vaults(cache_bytes: usize, mapped_bytes: usize, pack_files: usize) {
    enable();
    // SAFETY: each call is `git_libgit2_opts` with the option's one
    // documented argument (a `ssize_t` or `size_t`), which only stores a
    // global limit; libgit2 is initialised by `enable`, and the caller
    // runs this before starting any other thread, as git2 asks.
    unsafe {
        let cache = isize::try_from(cache_bytes).unwrap_or(isize::MAX);
        let rc = git2::opts::set_cache_max_size(cache);
        debug_assert!(rc.is_ok(), "libgit2 refused GIT_OPT_SET_CACHE_MAX_SIZE");
        let rc = git2::opts::set_mwindow_mapped_limit(mapped_bytes);
        debug_assert!(
            rc.is_ok(),
            "libgit2 refused GIT_OPT_SET_MWINDOW_MAPPED_LIMIT"
        );
        let rc = git2::opts::set_mwindow_file_limit(pack_files);
        debug_assert!(rc.is_ok(), "libgit2 refused GIT_OPT_SET_MWINDOW_FILE_LIMIT");
    }
}

/// Raise this process's soft limit on open files to `want`, or to its
/// hard limit if that is lower (an unprivileged process may); the soft
/// limit it has after. `memvault server` holds a descriptor per client
/// connection and a few per open vault: at a soft limit of 1,024 (many
/// systems' default) a flood of idle connections left none for the
/// vaults, which then read as damaged.
pub fn raise_open_files(want: u64) -> u64 {
    let mut lim = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: `getrlimit` writes one `rlimit` into the struct it is given,
    // which lives on this stack frame for the call.
    if unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut lim) } != 0 {
        return u64::MAX;
    }
    if lim.rlim_cur >= want {
        return lim.rlim_cur;
    }
    let raised = libc::rlimit {
        rlim_cur: want.min(lim.rlim_max),
        rlim_max: lim.rlim_max,
    };
    // SAFETY: `setrlimit` only reads the struct it is given, which lives
    // on this stack frame for the call; a soft limit at most the hard one
    // is allowed to any process.
    if unsafe { libc::setrlimit(libc::RLIMIT_NOFILE, &raised) } == 0 {
        raised.rlim_cur
    } else {
        lim.rlim_cur
    }
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

/// The in-memory stores (libgit2's mempack backends) memvault put in front
/// of its object databases, by address, with the mempack's `write`
/// function. Only compared, never dereferenced: a write goes through the
/// backend the repository's own database holds now (see
/// [`mempack_write`]), so an address left here by a closed vault is
/// harmless, and the list holds no reference that would keep a database
/// alive.
struct Installed {
    backends: std::collections::HashSet<usize>,
    write: usize,
}

static INSTALLED: Mutex<Option<Installed>> = Mutex::new(None);

fn installed() -> std::sync::MutexGuard<'static, Option<Installed>> {
    INSTALLED.lock().unwrap_or_else(|e| e.into_inner())
}

/// The first backend of `odb` (the highest priority), if it has one.
fn first_backend(odb: &Odb<'_>) -> Option<*mut libgit2_sys::git_odb_backend> {
    let mut out: *mut libgit2_sys::git_odb_backend = std::ptr::null_mut();
    // SAFETY: `odb.raw()` is a live database (borrowed for the call);
    // `git_odb_get_backend` stores a borrowed pointer to its backend at
    // position 0 in `out`, or fails; the backend lives as long as the
    // database, which the caller holds.
    let rc = unsafe { libgit2_sys::git_odb_get_backend(&mut out, odb.raw(), 0) };
    (rc == 0 && !out.is_null()).then_some(out)
}

/// Install on `repo` a new object database whose first backend is an
/// in-memory store (priority 1000), then the disk at `objects` as an
/// alternate (only read), and list the store for [`mempack_write`].
pub(crate) fn install_mempack_odb(repo: &Repository, objects: &str) -> Result<(), git2::Error> {
    let old = repo.odb().ok().and_then(|o| first_backend(&o));
    let odb = Odb::new()?;
    let backend = odb.add_new_mempack_backend(1000)?.raw();
    odb.add_disk_alternate(objects)?;
    repo.set_odb(&odb)?;
    // SAFETY: `backend` is the mempack just added to `odb`, alive while
    // `odb` is (held here); reading its `write` field reads a function
    // pointer libgit2 set when it made the backend.
    let write = unsafe { (*backend).write }.map_or(0, |f| f as usize);
    let mut list = installed();
    let list = list.get_or_insert_with(|| Installed {
        backends: Default::default(),
        write,
    });
    if let Some(old) = old {
        list.backends.remove(&(old as usize));
    }
    list.backends.insert(backend as usize);
    Ok(())
}

/// Drop `repo`'s in-memory store from the list (its vault is closing).
pub(crate) fn forget_odb(repo: &Repository) {
    if let Ok(odb) = repo.odb()
        && let Some(b) = first_backend(&odb)
        && let Some(list) = installed().as_mut()
    {
        list.backends.remove(&(b as usize));
    }
}

/// Put an object into `repo`'s in-memory store under `id`, which the
/// caller computed from `data` (see `pack::object_hash`), without the
/// lookups libgit2's `git_odb_write` makes first (it stats the loose path
/// and re-reads the pack directory for every new object, about a third
/// of a mutation's CPU). False if `repo`'s database has no listed store
/// (the caller then writes through libgit2).
pub(crate) fn mempack_write(
    repo: &Repository,
    id: Oid,
    kind: ObjectType,
    data: &[u8],
) -> Result<bool, git2::Error> {
    let odb = repo.odb()?;
    let Some(backend) = first_backend(&odb) else {
        return Ok(false);
    };
    {
        let list = installed();
        let Some(list) = list.as_ref() else {
            return Ok(false);
        };
        // SAFETY: `backend` is the first backend of `repo`'s database,
        // alive while `odb` (a reference to that database) is; its `write`
        // field is a function pointer libgit2 set.
        let write = unsafe { (*backend).write }.map_or(0, |f| f as usize);
        // One of the stores memvault installed, still the database's
        // first backend: a mempack (its `write` is the mempack's).
        if !list.backends.contains(&(backend as usize)) || write != list.write || write == 0 {
            return Ok(false);
        }
    }
    let kind = match kind {
        ObjectType::Blob => libgit2_sys::GIT_OBJECT_BLOB,
        ObjectType::Tree => libgit2_sys::GIT_OBJECT_TREE,
        ObjectType::Commit => libgit2_sys::GIT_OBJECT_COMMIT,
        _ => return Ok(false),
    };
    // SAFETY: `backend` is a mempack backend owned by `repo`'s database,
    // which `odb` keeps alive for the call; `repo` is used by one thread at
    // a time (a vault is behind `&mut` or a mutex). The mempack's `write`
    // copies `len` bytes from `data`, which outlives the call, and stores
    // them under the 20-byte id `id.raw()` points to.
    let rc = unsafe {
        match (*backend).write {
            Some(write) => write(
                backend,
                id.raw(),
                data.as_ptr().cast::<c_void>(),
                data.len(),
                kind,
            ),
            None => return Ok(false),
        }
    };
    if rc < 0 {
        return Err(git2::Error::from_str(
            "the in-memory object store refused an object",
        ));
    }
    Ok(true)
}

/// Whether `fd` has input to read, or its end, now (`poll` with no
/// wait): `serve` looks a few times before it blocks on its input.
pub fn readable_now(fd: &impl std::os::fd::AsRawFd) -> bool {
    let mut p = libc::pollfd {
        fd: fd.as_raw_fd(),
        events: libc::POLLIN,
        revents: 0,
    };
    // SAFETY: `poll` reads and writes exactly the one `pollfd` it is
    // given (count 1), which lives on this frame for the call; a zero
    // timeout never blocks. An invalid descriptor only sets `POLLNVAL`.
    let rc = unsafe { libc::poll(&mut p, 1, 0) };
    rc > 0
}

#[cfg(test)]
mod tests {
    /// A pipe with nothing in it is not readable; one with a line is, and
    /// so is one whose writer has gone (the read then sees its end).
    #[test]
    fn readable_now_sees_input_and_its_end_without_waiting() {
        use std::io::Write;
        let (reader, mut writer) = std::io::pipe().unwrap();
        assert!(!super::readable_now(&reader));
        writer.write_all(b"{}\n").unwrap();
        assert!(super::readable_now(&reader));
        let (reader, writer) = std::io::pipe().unwrap();
        drop(writer);
        assert!(super::readable_now(&reader));
    }
}
