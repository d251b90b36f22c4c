//! Files inside a vault: never reached through a link, never open to other
//! users.
//!
//! Every file memvault opens or creates inside a vault is opened here
//! (libgit2's own reads and writes aside; deletions and renames do not
//! follow a link at the name they act on, and the directories they act
//! in are checked by [`check_vault`]):
//! - files are opened with `O_NOFOLLOW`, so a symbolic link planted at
//!   `memvault/wal`, `memvault/access`, a pack's temporary name, … is an
//!   error ([`LinkRefused`]), never a write to wherever it points;
//!   temporary files are created with `O_EXCL` (a name already there, link
//!   or not, is removed first: removing a link removes the link);
//! - files are created 0600 (the packs `gc` has libgit2 write, 0400) and
//!   directories 0700, whatever the umask;
//! - [`check_vault`], at open, refuses a vault where a directory memvault
//!   writes into (`memvault/`, `objects/`, `objects/pack`, a loose-object
//!   fan-out directory, `refs/`…) or a file of `memvault/` is a link, or
//!   where the vault directory or `memvault/` (the socket's directory) is
//!   writable by group or others or owned by another user, before anything
//!   is read or written.
//!
//! Limitations: libgit2 opens the repository's files itself, through
//! links (reads of refs, config, packs); a process of the same user can
//! swap a directory for a link between the check and a later open of a
//! file below it (the directories are the user's own and 0700).

use std::fs::{self, DirBuilder, File, OpenOptions};
use std::io::{self, Read};
use std::os::unix::fs::{DirBuilderExt, MetadataExt, OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};

/// Mode of the files memvault writes into a vault.
pub(crate) const FILE_MODE: u32 = 0o600;
/// Mode of the packs `gc` has libgit2 write (never changed once named).
pub(crate) const OBJECT_MODE: u32 = 0o400;
/// Mode of a vault's directories.
pub(crate) const DIR_MODE: u32 = 0o700;

/// The files of `memvault/` (and the refs memvault writes) that must not
/// be links, if they exist.
const STATE_FILES: &[&str] = &[
    "memvault/format",
    "memvault/config.json",
    "memvault/lock",
    "memvault/wal",
    "memvault/access",
    "memvault/history-index",
    "memvault/history-index.lock",
    "memvault/verified-head",
    "memvault/keys-garbage",
    "memvault/erase-pending",
    "memvault/serve.lock",
    "memvault/serve.sock",
    "memvault/remotes",
    "memvault/sync.lock",
    "memvault/machine",
    "memvault/last-slot",
    "memvault/file-count",
    "refs/heads/main",
    "refs/memvault/keys",
    "packed-refs",
    "HEAD",
    "config",
];

/// The directories memvault writes into, which must be real directories
/// if they exist (one missing is for libgit2 to report).
const STATE_DIRS: &[&str] = &[
    "memvault",
    "objects",
    "objects/pack",
    "refs",
    "refs/heads",
    "refs/memvault",
    "logs",
];

/// The git config memvault writes, which libgit2 reads at every open:
/// each key (lowercase, `section.key`) with the values memvault may have
/// given it. Anything else (an `include`, `core.logAllRefUpdates = true`,
/// hooks, a worktree, an extension) was set outside memvault and would
/// change what libgit2 does in the vault: the vault is refused.
const CONFIG_KEYS: &[(&str, &[&str])] = &[
    ("core.bare", &["true"]),
    ("core.repositoryformatversion", &["0"]),
    ("core.filemode", &["true", "false"]),
    ("core.logallrefupdates", &["false"]),
    ("gc.auto", &["0"]),
];

/// The most read of `config` and `HEAD` (memvault writes a few dozen
/// bytes in each).
const GIT_FILE_MAX: u64 = 4096;

/// Why a vault is not safe to use.
#[derive(Debug, thiserror::Error)]
pub enum Unsafe {
    #[error("{0} is a symbolic link (memvault never follows a link inside a vault)")]
    Link(String),
    #[error("{0} is not a directory")]
    NotADir(String),
    #[error("{0} is not a regular file")]
    NotAFile(String),
    #[error("{0} is writable by group or others (make it private: chmod go-w)")]
    Writable(String),
    #[error("{0} is owned by another user")]
    Owner(String),
    #[error("cannot inspect {0}: {1}")]
    Io(String, io::Error),
    #[error(
        "the vault's git config sets {0}, which memvault never writes (changed outside memvault; git would act on it): remove it from the file config in the vault"
    )]
    Config(String),
    #[error("{0} is larger than memvault ever writes it (over {1})")]
    TooLarge(String, &'static str),
    #[error(
        "{0} would make git read and write the vault's refs in another directory (memvault never writes it; someone planted it): remove it"
    )]
    Planted(String),
}

/// An `O_NOFOLLOW` open that met a link.
#[derive(Debug, thiserror::Error)]
#[error("{0} is a symbolic link (memvault never follows a link inside a vault)")]
pub struct LinkRefused(String);

/// The last two components of `path`, to name it in a message.
fn short(path: &Path) -> String {
    let mut parts: Vec<_> = path.iter().rev().take(2).collect();
    parts.reverse();
    parts.iter().collect::<PathBuf>().display().to_string()
}

fn nofollow(path: &Path, e: io::Error) -> io::Error {
    if e.raw_os_error() == Some(libc::ELOOP) {
        io::Error::other(LinkRefused(short(path)))
    } else {
        e
    }
}

/// `O_NONBLOCK` too: opening a FIFO planted in the vault must not hang
/// (it has no effect on a regular file; anything else is refused by
/// [`regular`]).
fn options() -> OpenOptions {
    let mut o = OpenOptions::new();
    o.custom_flags(libc::O_NOFOLLOW | libc::O_NONBLOCK)
        .mode(FILE_MODE);
    o
}

/// Open with `o`, refusing a link and anything but a regular file.
fn open(o: &OpenOptions, path: &Path) -> io::Result<File> {
    open_sized(o, path).map(|(f, _)| f)
}

/// [`open`], and the file's length.
fn open_sized(o: &OpenOptions, path: &Path) -> io::Result<(File, u64)> {
    let f = o.open(path).map_err(|e| nofollow(path, e))?;
    let m = f.metadata()?;
    if !m.is_file() {
        return Err(io::Error::other(Unsafe::NotAFile(short(path))));
    }
    Ok((f, m.len()))
}

/// Open for reading, not through a link.
pub(crate) fn open_read(path: &Path) -> io::Result<File> {
    open(options().read(true), path)
}

/// The most memvault reads of one of its own small files (a format
/// line, a slot name, a machine's name, a ref).
pub(crate) const SMALL: Limit = Limit(4 << 10, "4 KiB");
/// The most it reads of one of its lists (remotes, alternates).
pub(crate) const LIST: Limit = Limit(1 << 20, "1 MiB");
/// The most it reads of one of its tables (the access table, the list of
/// keys to erase or key states to prune, the history index).
pub(crate) const TABLE: Limit = Limit(256 << 20, "256 MiB");

/// A size past which a file of memvault's own is not read: planted or
/// damaged (a sparse file of any size costs a writer nothing).
#[derive(Clone, Copy)]
pub(crate) struct Limit(u64, &'static str);

/// Read a whole file, not through a link (a pack and its index: as large
/// as they are).
pub(crate) fn read(path: &Path) -> io::Result<Vec<u8>> {
    let (mut f, len) = open_sized(options().read(true), path)?;
    let mut out = Vec::new();
    out.try_reserve_exact(usize::try_from(len).unwrap_or(0))?;
    f.read_to_end(&mut out)?;
    Ok(out)
}

/// Read a whole file of memvault's own, not through a link, refused past
/// `limit` (from its size, before anything is read).
pub(crate) fn read_max(path: &Path, limit: Limit) -> io::Result<Vec<u8>> {
    let (f, len) = open_sized(options().read(true), path)?;
    if len > limit.0 {
        return Err(io::Error::other(Unsafe::TooLarge(short(path), limit.1)));
    }
    let mut out = Vec::new();
    out.try_reserve_exact(usize::try_from(len).unwrap_or(0))?;
    // A file growing meanwhile is still read only to the limit.
    f.take(limit.0 + 1).read_to_end(&mut out)?;
    if out.len() as u64 > limit.0 {
        return Err(io::Error::other(Unsafe::TooLarge(short(path), limit.1)));
    }
    Ok(out)
}

/// [`read_max`] as text.
pub(crate) fn read_to_string(path: &Path, limit: Limit) -> io::Result<String> {
    String::from_utf8(read_max(path, limit)?).map_err(|_| io::ErrorKind::InvalidData.into())
}

/// Open for reading and writing, created 0600 if missing, never truncated
/// (the log, lock files).
pub(crate) fn open_rw(path: &Path) -> io::Result<File> {
    open(
        options()
            .read(true)
            .write(true)
            .create(true)
            .truncate(false),
        path,
    )
}

/// Open for appending, created 0600 if missing.
pub(crate) fn open_append(path: &Path) -> io::Result<File> {
    open(options().append(true).create(true), path)
}

/// Create a new file with `mode` for writing: whatever is at `path` (a
/// file left by a crash, a link) is removed first, and the file is made
/// with `O_EXCL`, so it is always a new file of ours.
pub(crate) fn create_new(path: &Path, mode: u32) -> io::Result<File> {
    match fs::remove_file(path) {
        Ok(()) => {}
        Err(e) if e.kind() == io::ErrorKind::NotFound => {}
        Err(e) => return Err(e),
    }
    open(options().write(true).create_new(true).mode(mode), path)
}

/// Create the directory `path` (mode 0700) unless it is there; refuse one
/// that is a link or not a directory.
pub(crate) fn mkdir_private(path: &Path) -> io::Result<()> {
    match DirBuilder::new().mode(DIR_MODE).create(path) {
        Ok(()) => Ok(()),
        Err(e) if e.kind() == io::ErrorKind::AlreadyExists => check_real_dir(path),
        Err(e) => Err(e),
    }
}

/// Create the directory `path` (mode 0700), failing with `AlreadyExists`
/// if anything is there: the caller is the one that made it.
pub(crate) fn mkdir_new_private(path: &Path) -> io::Result<()> {
    DirBuilder::new().mode(DIR_MODE).create(path)
}

/// `path` is a directory, not a link to one.
pub(crate) fn check_real_dir(path: &Path) -> io::Result<()> {
    let m = fs::symlink_metadata(path)?;
    if m.file_type().is_symlink() {
        return Err(io::Error::other(LinkRefused(short(path))));
    }
    if !m.is_dir() {
        return Err(io::Error::other(Unsafe::NotADir(short(path))));
    }
    Ok(())
}

/// Take group and other bits off the file at `path` (one libgit2 wrote
/// with the umask's mode), not through a link.
pub(crate) fn make_private(path: &Path) -> io::Result<()> {
    let f = open_read(path)?;
    let mode = f.metadata()?.mode() & 0o7777;
    if mode & 0o077 != 0 {
        f.set_permissions(fs::Permissions::from_mode(mode & 0o700))?;
    }
    Ok(())
}

/// [`make_private`] for `dir` and everything below it (a new vault, whose
/// tree libgit2 made with the umask's modes). Links are not followed.
pub(crate) fn make_private_tree(dir: &Path) -> io::Result<()> {
    let m = fs::symlink_metadata(dir)?;
    if m.file_type().is_symlink() {
        return Err(io::Error::other(LinkRefused(short(dir))));
    }
    if m.is_dir() {
        fs::set_permissions(dir, fs::Permissions::from_mode(DIR_MODE))?;
        for e in fs::read_dir(dir)? {
            make_private_tree(&e?.path())?;
        }
        Ok(())
    } else {
        make_private(dir)
    }
}

/// The process's effective user id, from `/proc/self/status` (no unsafe
/// code; `/proc/self` itself is owned by root once the process is made
/// non-dumpable). None where there is no procfs.
fn euid() -> Option<u32> {
    let status = fs::read_to_string("/proc/self/status").ok()?;
    let line = status.lines().find(|l| l.starts_with("Uid:"))?;
    line.split_whitespace().nth(2)?.parse().ok()
}

/// Whether the vault at `dir` is safe to open: no link where memvault
/// reads or writes its own files, and neither the vault directory nor
/// `memvault/` writable by anyone but its owner, the current user. Reads
/// metadata only.
pub(crate) fn check_vault(dir: &Path) -> Result<(), Unsafe> {
    let io = |name: &str, e: io::Error| Unsafe::Io(name.to_string(), e);
    let uid = euid();
    let private = |name: &str, m: &fs::Metadata| -> Result<(), Unsafe> {
        if m.mode() & 0o022 != 0 {
            return Err(Unsafe::Writable(name.to_string()));
        }
        if uid.is_some_and(|u| m.uid() != u) {
            return Err(Unsafe::Owner(name.to_string()));
        }
        Ok(())
    };
    // The vault's own path may be a link (the user chose it).
    let top = fs::metadata(dir).map_err(|e| io("the vault directory", e))?;
    private("the vault directory", &top)?;
    for name in STATE_DIRS {
        match fs::symlink_metadata(dir.join(name)) {
            Ok(m) if m.file_type().is_symlink() => return Err(Unsafe::Link(name.to_string())),
            Ok(m) if !m.is_dir() => return Err(Unsafe::NotADir(name.to_string())),
            // Another user who may write in `objects/` or `refs/` could
            // plant packs or move refs under a running writer.
            Ok(m) => private(&format!("{name}/"), &m)?,
            Err(e) if e.kind() == io::ErrorKind::NotFound => {}
            Err(e) => return Err(io(name, e)),
        }
    }
    for name in STATE_FILES {
        match fs::symlink_metadata(dir.join(name)) {
            Ok(m) if m.file_type().is_symlink() => return Err(Unsafe::Link(name.to_string())),
            Ok(m) if !m.is_file() && !name.ends_with(".sock") => {
                return Err(Unsafe::NotAFile(name.to_string()));
            }
            Ok(m) => private(name, &m)?,
            Err(e) if e.kind() == io::ErrorKind::NotFound => {}
            Err(e) => return Err(io(name, e)),
        }
    }
    check_git_files(dir)?;
    // Loose objects' fan-out directories (checkpoints write into them, gc
    // deletes what they hold).
    let objects = match fs::read_dir(dir.join("objects")) {
        Ok(d) => d,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(()),
        Err(e) => return Err(io("objects", e)),
    };
    for e in objects {
        let e = e.map_err(|e| io("objects", e))?;
        let t = e.file_type().map_err(|e| io("objects", e))?;
        if t.is_symlink() {
            let name = format!("objects/{}", e.file_name().to_string_lossy());
            return Err(Unsafe::Link(name));
        }
    }
    Ok(())
}

/// `HEAD` and `config`, which libgit2 reads at every open (their kind was
/// checked with the state files): small, and the config holds only what
/// memvault writes (see [`CONFIG_KEYS`]).
fn check_git_files(dir: &Path) -> Result<(), Unsafe> {
    // libgit2 takes a repository holding `commondir` (and `gitdir`) for a
    // worktree: its refs are then read from, and written to, the
    // directory that file names, which nothing here checks (round 41d:
    // refs from another vault, writes landing outside, a FIFO there
    // hanging every command).
    for name in ["commondir", "gitdir"] {
        if fs::symlink_metadata(dir.join(name)).is_ok() {
            return Err(Unsafe::Planted(name.to_string()));
        }
    }
    // The refs' loose files too, which libgit2 reads whole (a sparse file
    // of a GiB there cost a GiB of memory and seconds at every open), and
    // `packed-refs`, which holds a line per ref.
    for (name, max, said) in [
        ("HEAD", GIT_FILE_MAX, "4 KiB"),
        ("config", GIT_FILE_MAX, "4 KiB"),
        ("refs/heads/main", GIT_FILE_MAX, "4 KiB"),
        ("refs/memvault/keys", GIT_FILE_MAX, "4 KiB"),
        ("refs/memvault/access", GIT_FILE_MAX, "4 KiB"),
        ("packed-refs", LIST.0, LIST.1),
    ] {
        match fs::symlink_metadata(dir.join(name)) {
            Ok(m) if m.len() > max => {
                return Err(Unsafe::TooLarge(name.to_string(), said));
            }
            _ => {}
        }
    }
    let text = match read(&dir.join("config")) {
        Ok(bytes) => String::from_utf8_lossy(&bytes).into_owned(),
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(()),
        Err(e) => return Err(Unsafe::Io("config".to_string(), e)),
    };
    let mut section = String::new();
    for line in text.lines() {
        let line = line.trim();
        if line.is_empty() || line.starts_with('#') || line.starts_with(';') {
            continue;
        }
        if let Some(rest) = line.strip_prefix('[') {
            let name = rest.split(']').next().unwrap_or(rest).trim();
            if name.contains('"') || name.contains('.') || !rest.contains(']') {
                return Err(Unsafe::Config(format!("[{name}]")));
            }
            section = name.to_ascii_lowercase();
            if rest
                .split_once(']')
                .is_some_and(|(_, after)| !after.trim().is_empty())
            {
                return Err(Unsafe::Config(format!("[{name}] ...")));
            }
            continue;
        }
        let (key, value) = match line.split_once('=') {
            Some((k, v)) => (k.trim(), v.trim()),
            None => (line, "true"),
        };
        let full = format!("{section}.{}", key.to_ascii_lowercase());
        let value = value.trim_matches('"').to_ascii_lowercase();
        let allowed = CONFIG_KEYS
            .iter()
            .any(|(k, values)| *k == full && values.contains(&value.as_str()));
        if !allowed {
            return Err(Unsafe::Config(full));
        }
    }
    Ok(())
}

/// Write a small file and fsync it and its directory.
pub(crate) fn write_durable(path: &Path, bytes: &[u8]) -> std::io::Result<()> {
    use std::io::Write;
    let tmp = path.with_extension("tmp");
    let mut f = create_new(&tmp, FILE_MODE)?;
    let written = f
        .write_all(bytes)
        .and_then(|()| f.sync_all())
        .and_then(|()| fs::rename(&tmp, path));
    if let Err(e) = written {
        // A full disk, most likely: no empty or partial file left behind.
        let _ = fs::remove_file(&tmp);
        return Err(e);
    }
    if let Some(parent) = path.parent() {
        sync_dir(parent);
    }
    Ok(())
}

pub(crate) fn sync_dir(dir: &Path) {
    if let Ok(d) = File::open(dir) {
        let _ = d.sync_all();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn create_new_replaces_a_link_instead_of_writing_through_it() {
        let d = tempfile::tempdir().unwrap();
        let target = d.path().join("target");
        fs::write(&target, b"outside").unwrap();
        let link = d.path().join("link");
        std::os::unix::fs::symlink(&target, &link).unwrap();
        std::io::Write::write_all(&mut create_new(&link, FILE_MODE).unwrap(), b"new").unwrap();
        assert_eq!(fs::read(&target).unwrap(), b"outside");
        assert_eq!(fs::read(&link).unwrap(), b"new");
        assert!(
            !fs::symlink_metadata(&link)
                .unwrap()
                .file_type()
                .is_symlink()
        );
    }

    #[test]
    fn opens_refuse_a_link_and_name_it() {
        let d = tempfile::tempdir().unwrap();
        let target = d.path().join("target");
        fs::write(&target, b"outside").unwrap();
        let link = d.path().join("wal");
        std::os::unix::fs::symlink(&target, &link).unwrap();
        for e in [
            open_rw(&link).unwrap_err(),
            open_append(&link).unwrap_err(),
            read(&link).unwrap_err(),
        ] {
            assert!(e.to_string().contains("wal is a symbolic link"), "{e}");
        }
        assert_eq!(fs::read(&target).unwrap(), b"outside");
        let dlink = d.path().join("dir");
        std::os::unix::fs::symlink(d.path(), &dlink).unwrap();
        assert!(mkdir_private(&dlink).is_err());
        assert!(check_real_dir(&dlink).is_err());
    }

    #[test]
    fn euid_is_read() {
        assert!(euid().is_some());
    }
}
