//! The transport of sync: the user's own `git` program, run against a
//! throwaway repository, never against the vault.
//!
//! Why the `git` CLI and not libgit2's transports: a user who can `git
//! push` to a URL from their shell can then `memvault push` to it. Their
//! `~/.ssh/config` (host aliases, `IdentityFile`, `ProxyJump`), keys or
//! agent, `known_hosts`, `GIT_SSH_COMMAND`, `url.*.insteadOf` and
//! credential helpers all work as they do for git; libssh2 reads none of
//! `~/.ssh/config`. And git's push protocol gives a real compare-and-swap:
//! `--force-with-lease=REF:OLD` sends OLD in the update command and the
//! receiving side moves the ref only from it, `--atomic` moves both refs
//! or neither where the remote supports it, and `--porcelain` reports each
//! ref's fate.
//!
//! What git never gets to do: read the vault's `config` or run its hooks
//! (a hostile vault directory would run code). Every command runs with
//! `GIT_DIR` set to a scratch repository under `memvault/` whose only link
//! to the vault is `objects/info/alternates`, hooks off, and transports
//! limited to file, ssh, http(s). Objects come back from the scratch
//! repository through `git cat-file`, and memvault hashes each one itself
//! before anything of it is used (see `sync`).

use std::io::{BufRead, BufReader, Read, Write};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Duration;

use git2::{ObjectType, Oid};

use super::SyncError;
use crate::vault::engine::pack::object_hash;
use crate::vault::engine::raw::Object;
use crate::vault::{FileLock, MAIN_REF, fsx};

pub(crate) const KEYS_REF: &str = crate::vault::engine::KEYS_REF;
/// The third ref sync exchanges: a MAC'd commit holding the sealed access
/// table (when each file was last viewed and written), so that expiry on
/// one machine sees the views of the others. Local vaults have no such
/// ref; it lives only on remotes.
pub(crate) const ACCESS_REF: &str = "refs/memvault/access";

/// The largest object a remote may send (a vault's largest blob is its
/// file size limit plus the envelope; its largest tree, 100,000 entries in
/// one directory, about 9 MiB).
pub(crate) const MAX_OBJECT: u64 = 1 << 30;

/// Set once by a process that syncs in the background (`serve --sync`):
/// git may not prompt for a password there.
static NO_PROMPTS: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);

/// From now on git asks for no credentials on a terminal (a helper or an
/// SSH agent still works).
pub fn no_prompts() {
    NO_PROMPTS.store(true, std::sync::atomic::Ordering::Relaxed);
}

/// How long one git command that reaches a remote may run, in ms
/// (`--remote-timeout`).
static REMOTE_TIMEOUT_MS: std::sync::atomic::AtomicU64 =
    std::sync::atomic::AtomicU64::new(DEFAULT_REMOTE_TIMEOUT.as_millis() as u64);

/// [`set_remote_timeout`]'s default: a remote that stalls (accepts the
/// connection, then sends nothing) holds a sync this long at most.
const DEFAULT_REMOTE_TIMEOUT: Duration = Duration::from_secs(300);

/// From now on a git command that reaches a remote and has not ended
/// after `limit` is killed and the remote reported as not answering.
#[cfg(feature = "cli")]
pub fn set_remote_timeout(limit: Duration) {
    let ms = u64::try_from(limit.as_millis()).unwrap_or(u64::MAX).max(1);
    REMOTE_TIMEOUT_MS.store(ms, std::sync::atomic::Ordering::Relaxed);
}

/// Run `c`, a git command that reaches a remote (fetch, push), to its end
/// as [`Command::output`] does, within the remote timeout, its output
/// included. The error's kind is then `TimedOut`. Nothing of what a fetch
/// brought is used; a push either moved the remote's refs whole or not at
/// all, which the next sync's lease sees.
///
/// In a process that syncs in the background (no prompts), git runs in a
/// session of its own (no terminal: nothing can stop on one or prompt),
/// and when it has exited or run out of time its whole process group is
/// killed before it is reaped: a transport that would outlive git (ssh
/// waits on its peer, not on its input) goes with it, and cannot hold
/// git's output pipes open. At a terminal git stays in the foreground,
/// where ssh and credential prompts can read the terminal; past the
/// timeout git alone is killed, and a helper that still holds its pipes
/// is not waited for.
fn output_within(mut c: Command) -> std::io::Result<std::process::Output> {
    let limit = Duration::from_millis(REMOTE_TIMEOUT_MS.load(std::sync::atomic::Ordering::Relaxed));
    let grouped = NO_PROMPTS.load(std::sync::atomic::Ordering::Relaxed);
    if grouped {
        crate::hygiene::in_new_session(&mut c);
    }
    c.stdout(Stdio::piped()).stderr(Stdio::piped());
    let mut child = c.spawn()?;
    let pid = child.id();
    let (tx, rx) = std::sync::mpsc::channel();
    for (which, pipe) in [
        (
            0,
            child
                .stdout
                .take()
                .map(|p| Box::new(p) as Box<dyn Read + Send>),
        ),
        (
            1,
            child
                .stderr
                .take()
                .map(|p| Box::new(p) as Box<dyn Read + Send>),
        ),
    ] {
        let tx = tx.clone();
        std::thread::spawn(move || {
            let mut v = Vec::new();
            if let Some(mut p) = pipe {
                let _ = p.read_to_end(&mut v);
            }
            let _ = tx.send((which, v));
        });
    }
    drop(tx);
    let deadline = std::time::Instant::now() + limit;
    let timed_out =
        || std::io::Error::new(std::io::ErrorKind::TimedOut, "git did not finish in time");
    let mut nap = Duration::from_micros(200);
    let status = loop {
        // Grouped: seen exited but not reaped, so its group id is still
        // its own when the group is killed.
        let exited = if grouped {
            crate::hygiene::has_exited(pid)
        } else {
            child.try_wait().map(|s| s.is_some())
        };
        let now = std::time::Instant::now();
        match exited {
            Ok(true) => {
                if grouped {
                    crate::hygiene::kill_group(pid);
                }
                break child.wait()?;
            }
            Ok(false) if now < deadline => {
                std::thread::sleep(nap.min(deadline - now));
                nap = (nap * 2).min(Duration::from_millis(5));
            }
            done => {
                if grouped {
                    crate::hygiene::kill_group(pid);
                }
                let _ = child.kill();
                let _ = child.wait();
                return Err(done.err().unwrap_or_else(timed_out));
            }
        }
    };
    let mut outputs = [Vec::new(), Vec::new()];
    for _ in 0..2 {
        let left = deadline.saturating_duration_since(std::time::Instant::now());
        let (which, bytes) = rx.recv_timeout(left).map_err(|_| timed_out())?;
        outputs[which] = bytes;
    }
    let [stdout, stderr] = outputs;
    Ok(std::process::Output {
        status,
        stdout,
        stderr,
    })
}

/// The error for an I/O failure on this machine (the CLI words a full
/// disk as such; it was the bare "No space left on device").
fn local_io(e: std::io::Error) -> SyncError {
    SyncError::LocalIo(e)
}

/// The error for a git command that could not run or did not end in time.
fn spawn_failed(e: std::io::Error, remote: &str) -> SyncError {
    match e.kind() {
        std::io::ErrorKind::NotFound => SyncError::NoGit,
        std::io::ErrorKind::TimedOut => SyncError::Transport {
            remote: remote.to_string(),
            detail: format!(
                "it did not answer within {} s (--remote-timeout); gave up, nothing was changed here{}",
                REMOTE_TIMEOUT_MS
                    .load(std::sync::atomic::Ordering::Relaxed)
                    .div_ceil(1000),
                // At a terminal, ssh or git may have been waiting for an
                // answer there, not for the remote (round 41b).
                if std::io::IsTerminal::is_terminal(&std::io::stdin()) {
                    " (if ssh or git asked a question above, such as whether to trust a new host key or a password, it was waiting for that answer: answer it within the timeout, or set up the host key and credentials first)"
                } else {
                    ""
                }
            ),
        },
        _ => local_io(e),
    }
}

/// Check a remote URL: a local path, `file://`, `ssh://`, scp-like
/// `[user@]host:path`, `https://`, or `http://` to a loopback host. Never
/// one of git's `<transport>::<address>` forms (`ext::` runs a command),
/// an option, or a string with control characters.
pub(crate) fn check_url(url: &str) -> Result<(), SyncError> {
    let bad = |why: &str| Err(SyncError::BadUrl(why.to_string()));
    if url.is_empty() || url.len() > 4096 {
        return bad("a remote URL is 1 to 4096 characters");
    }
    if url.starts_with('-') {
        return bad("a remote URL may not start with '-'");
    }
    if url.chars().any(|c| c.is_control()) {
        return bad("a remote URL may not hold control characters");
    }
    if let Some((scheme, rest)) = url.split_once("://") {
        return match scheme {
            // As memvault reads it: a path, which git would otherwise
            // decode or take a host from first.
            "file" if !rest.starts_with('/') => {
                bad("a file:// URL names no host: file:///absolute/path")
            }
            "file" if rest.contains('%') => {
                bad("a file:// URL may not hold %-escapes: give the path as it is")
            }
            "file" | "ssh" | "https" => Ok(()),
            "http" => {
                let host = rest.split('/').next().unwrap_or("");
                let host = host.rsplit('@').next().unwrap_or(host);
                let host = match host.strip_prefix('[') {
                    Some(v6) => v6.split(']').next().unwrap_or(""),
                    None => host.split(':').next().unwrap_or(""),
                };
                if matches!(host, "127.0.0.1" | "localhost" | "::1") {
                    Ok(())
                } else {
                    bad("plain http:// is allowed to a loopback host only; use https://")
                }
            }
            _ => bad("a remote URL is a path, file://, ssh://, user@host:path or https://"),
        };
    }
    if url.contains("::") {
        return bad("git's <transport>::<address> URLs are not allowed");
    }
    Ok(())
}

/// A URL as it is stored: a relative local path made absolute (from the
/// current directory), anything else as given.
pub(crate) fn absolute_url(url: &str) -> Result<String, SyncError> {
    check_url(url)?;
    if url.contains("://") || is_scp_like(url) || url.starts_with('/') {
        return Ok(url.to_string());
    }
    let cwd = std::env::current_dir().map_err(local_io)?;
    let path = cwd.join(url);
    path.to_str()
        .map(str::to_string)
        .ok_or_else(|| SyncError::BadUrl("a remote path must be UTF-8".into()))
}

/// `host:path` as git reads it: a colon before any slash.
fn is_scp_like(url: &str) -> bool {
    match (url.find(':'), url.find('/')) {
        (Some(c), Some(s)) => c < s,
        (Some(_), None) => true,
        _ => false,
    }
}

/// Where the remote's two refs point (None: it has no such ref).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct RemoteRefs {
    pub main: Option<Oid>,
    pub keys: Option<Oid>,
    pub access: Option<Oid>,
}

/// One ref update of a push: move `name` to `new`, only from `old`
/// (None: only if the remote has no such ref).
pub(crate) struct Update {
    pub name: &'static str,
    pub new: Oid,
    pub old: Option<Oid>,
}

/// A throwaway bare repository under `memvault/` that borrows the vault's
/// objects (alternates): every git command of a sync runs in one. Removed
/// when dropped; one left by a crash is removed by the next sync.
pub(crate) struct Scratch {
    dir: PathBuf,
}

const SCRATCH_PREFIX: &str = "sync-";

impl Scratch {
    /// Make one in `<vault>/memvault/`, borrowing `<vault>/objects` (or no
    /// objects, with `borrow` false: `clone`).
    pub(crate) fn new(vault: &Path, borrow: bool) -> Result<Scratch, SyncError> {
        let state = vault.join("memvault");
        remove_stale(&state);
        let name = format!(
            "{SCRATCH_PREFIX}{}",
            data_encoding::HEXLOWER.encode(&crate::crypto::random_bytes::<8>())
        );
        let dir = state.join(name);
        fsx::mkdir_new_private(&dir).map_err(local_io)?;
        let scratch = Scratch { dir };
        for sub in [
            "objects",
            "objects/info",
            "objects/pack",
            "refs",
            "refs/heads",
        ] {
            fsx::mkdir_private(&scratch.dir.join(sub)).map_err(local_io)?;
        }
        let write = |name: &str, text: &str| -> Result<(), SyncError> {
            let mut f =
                fsx::create_new(&scratch.dir.join(name), fsx::FILE_MODE).map_err(local_io)?;
            f.write_all(text.as_bytes()).map_err(local_io)
        };
        write("HEAD", "ref: refs/heads/main\n")?;
        write(
            "config",
            "[core]\n\trepositoryformatversion = 0\n\tbare = true\n",
        )?;
        if borrow {
            // Absolute: git reads the file relative to the scratch
            // repository's objects.
            let objects = std::fs::canonicalize(vault)
                .map_err(local_io)?
                .join("objects");
            let objects = objects
                .to_str()
                .ok_or_else(|| SyncError::Local("the vault's path is not UTF-8".into()))?;
            write("objects/info/alternates", &format!("{objects}\n"))?;
        }
        Ok(scratch)
    }

    /// A `git` command in this repository: its config and hooks alone.
    fn git(&self) -> Command {
        git_in(&self.dir)
    }

    /// Run a local `git` command to its end: its stdout, or its failure.
    fn run(&self, c: Command, remote: &str) -> Result<Vec<u8>, SyncError> {
        run_git(c, remote, "")
    }

    fn odd(&self, remote: &str) -> SyncError {
        SyncError::Transport {
            remote: remote.to_string(),
            detail: "git ls-remote gave an answer memvault does not read".into(),
        }
    }

    /// Fetch the remote's refs (main, and the key state and access table
    /// under `refs/memvault/`) into this repository's `refs/incoming/`,
    /// offering `have` (commits the vault holds) so that only what is new
    /// travels. One connection. Ok(false): the remote has no main (an
    /// empty remote); nothing was fetched.
    pub(crate) fn fetch(&self, remote: &str, url: &str, have: &[Oid]) -> Result<bool, SyncError> {
        check_vault_remote(remote, url, false)?;
        check_remote_config(remote, url)?;
        if let Some(done) = self.read_in_place(remote, url)? {
            return Ok(done);
        }
        for (i, id) in have.iter().enumerate() {
            let path = self.dir.join(format!("refs/heads/have{i}"));
            let mut f = fsx::create_new(&path, fsx::FILE_MODE).map_err(local_io)?;
            f.write_all(format!("{id}\n").as_bytes())
                .map_err(local_io)?;
        }
        let mut c = self.git();
        c.args([
            "fetch",
            "--quiet",
            "--no-tags",
            "--no-write-fetch-head",
            "--no-auto-gc",
            "--no-recurse-submodules",
        ]);
        if local_dir(url).is_some() {
            c.arg(LOCAL_UPLOAD_PACK);
        }
        c.args(["--", url]);
        c.arg(format!("+{MAIN_REF}:refs/incoming/main"));
        c.arg("+refs/memvault/*:refs/incoming/memvault/*");
        let fetched = output_within(c)
            .map_err(|e| spawn_failed(e, remote))
            .and_then(|out| git_result(out, remote, ""));
        match fetched {
            Ok(_) => Ok(true),
            Err(SyncError::Transport { detail, .. })
                if detail.contains("couldn't find remote ref") =>
            {
                Ok(false)
            }
            // git reads a ref file that holds no id as the zero id, and
            // then asks the remote for it.
            Err(SyncError::Transport { detail, .. })
                if detail.contains("not our ref 0000000000000000000000000000000000000000") =>
            {
                Err(SyncError::Transport {
                    remote: remote.to_string(),
                    detail: "one of its refs (main, or one under refs/memvault/) holds no object id: its file is damaged there".into(),
                })
            }
            Err(e) => Err(e),
        }
    }

    /// A bare repository on a path is read where it is, not fetched: its
    /// refs from its files (see [`peek_refs`]) into `refs/incoming/*`,
    /// and its objects directory borrowed beside the vault's, so that
    /// [`new_objects`](Self::new_objects) and
    /// [`read_objects`](Self::read_objects) find its objects (which
    /// memvault hashes and checks as it reads them, as it does those a
    /// fetch brings). git's fetch of it cost an `upload-pack`, a
    /// `pack-objects`, an `index-pack` and a connectivity walk: 40 of a
    /// 150 ms sync. None: fetch it (not a path, not bare, refs this does
    /// not read, no main).
    fn read_in_place(&self, remote: &str, url: &str) -> Result<Option<bool>, SyncError> {
        let Some(dir) = local_repo(url) else {
            return Ok(None);
        };
        let objects = dir.join("objects");
        let Some(text) = objects.to_str().filter(|t| !t.contains('\n')) else {
            return Ok(None);
        };
        if fsx::check_real_dir(&objects).is_err() {
            return Ok(None);
        }
        // Under the remote's lock, which memvault's pushes to a path hold
        // while they move its refs: git moves them one after the other
        // (main before the key state), and refs read in between would
        // pair a new main with the key state it replaces ("rolled back").
        let lock = lock_remote(remote, &dir)?;
        let refs = peek_refs(&dir);
        drop(lock);
        let Some(refs) = refs else {
            return Ok(None);
        };
        let Some(main) = refs.main else {
            return Ok(None);
        };
        let alternates = self.dir.join("objects/info/alternates");
        let mut list = fsx::read_to_string(&alternates, fsx::LIST).unwrap_or_default();
        list.push_str(text);
        list.push('\n');
        std::fs::write(&alternates, list).map_err(local_io)?;
        fsx::mkdir_private(&self.dir.join("refs/incoming")).map_err(local_io)?;
        fsx::mkdir_private(&self.dir.join("refs/incoming/memvault")).map_err(local_io)?;
        for (name, id) in [
            ("main", Some(main)),
            ("memvault/keys", refs.keys),
            ("memvault/access", refs.access),
        ] {
            if let Some(id) = id {
                let path = self.dir.join("refs/incoming").join(name);
                std::fs::write(path, format!("{id}\n")).map_err(local_io)?;
            }
        }
        Ok(Some(true))
    }

    /// Where this repository's `refs/incoming/*` point after [`fetch`].
    pub(crate) fn incoming(&self) -> RemoteRefs {
        let read = |name: &str| {
            fsx::read_to_string(&self.dir.join("refs/incoming").join(name), fsx::SMALL)
                .ok()
                .and_then(|t| Oid::from_str(t.trim()).ok())
        };
        RemoteRefs {
            main: read("main"),
            keys: read(&KEYS_REF.replace("refs/", "")),
            access: read(&ACCESS_REF.replace("refs/", "")),
        }
    }

    /// The ids of every object reachable from `tips` and not from `have`
    /// (`git rev-list --objects`), at most `limit` of them.
    pub(crate) fn new_objects(
        &self,
        remote: &str,
        tips: &[Oid],
        have: &[Oid],
        limit: usize,
    ) -> Result<Vec<Oid>, SyncError> {
        if tips.is_empty() {
            return Ok(Vec::new());
        }
        let mut c = self.git();
        c.args(["rev-list", "--objects", "--no-object-names"]);
        c.args(tips.iter().map(Oid::to_string));
        if !have.is_empty() {
            c.arg("--not");
            c.args(have.iter().map(Oid::to_string));
        }
        let out = self.run(c, remote)?;
        let mut ids = Vec::new();
        for line in out.split(|b| *b == b'\n').filter(|l| !l.is_empty()) {
            let id = std::str::from_utf8(line)
                .ok()
                .and_then(|t| Oid::from_str(t.trim()).ok())
                .ok_or_else(|| self.odd(remote))?;
            ids.push(id);
            if ids.len() > limit {
                return Err(SyncError::Hostile {
                    remote: remote.to_string(),
                    what: "it sent more objects than a vault of this size can hold".into(),
                });
            }
        }
        Ok(ids)
    }

    /// `git cat-file MODE` over `ids`, written to its input by a thread
    /// (so that its output is read while it takes them): the child, that
    /// thread, and the child's output.
    fn cat_file(
        &self,
        mode: &str,
        ids: &[Oid],
        stderr: Stdio,
    ) -> Result<
        (
            std::process::Child,
            std::thread::JoinHandle<()>,
            std::process::ChildStdout,
        ),
        SyncError,
    > {
        let mut c = self.git();
        c.args(["cat-file", mode])
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(stderr);
        let mut child = c.spawn().map_err(|e| match e.kind() {
            std::io::ErrorKind::NotFound => SyncError::NoGit,
            _ => local_io(e),
        })?;
        let mut stdin = child.stdin.take().expect("piped");
        let list: Vec<Oid> = ids.to_vec();
        let writer = std::thread::spawn(move || {
            let mut w = std::io::BufWriter::new(&mut stdin);
            for id in list {
                if writeln!(w, "{id}").is_err() {
                    return;
                }
            }
            let _ = w.flush();
        });
        let stdout = child.stdout.take().expect("piped");
        Ok((child, writer, stdout))
    }

    /// The commits among `ids`, with their sizes (`git cat-file
    /// --batch-check`: kinds and sizes, no content): read and checked
    /// first, so that a remote that plants a huge object under a commit
    /// not of this vault is refused before that object is read.
    pub(crate) fn commits_among(
        &self,
        remote: &str,
        ids: &[Oid],
    ) -> Result<std::collections::HashMap<Oid, u64>, SyncError> {
        let mut commits = std::collections::HashMap::new();
        if ids.is_empty() {
            return Ok(commits);
        }
        let (mut child, writer, stdout) = self.cat_file("--batch-check", ids, Stdio::null())?;
        let reader = BufReader::new(stdout);
        let mut lines = 0usize;
        let read = (|| -> std::io::Result<()> {
            for line in reader.lines() {
                let line = line?;
                lines += 1;
                let mut parts = line.split(' ');
                if let (Some(id), Some("commit"), Some(size)) =
                    (parts.next(), parts.next(), parts.next())
                    && let (Ok(id), Ok(size)) = (Oid::from_str(id), size.parse::<u64>())
                {
                    commits.insert(id, size);
                }
            }
            Ok(())
        })();
        let _ = writer.join();
        let status = child.wait().map_err(local_io)?;
        read.map_err(local_io)?;
        // Every id answered, or the check did not happen: never go on as
        // if there were no commits.
        if !status.success() || lines != ids.len() {
            return Err(self.odd(remote));
        }
        Ok(commits)
    }

    /// How many commits `tip` reaches that `base` does not (`git rev-list
    /// --count`, over the borrowed objects: no walk of the history here).
    pub(crate) fn count_since(&self, tip: Oid, base: Option<Oid>) -> Result<usize, SyncError> {
        let mut c = self.git();
        c.args(["rev-list", "--count", &tip.to_string()]);
        if let Some(b) = base {
            c.arg("--not").arg(b.to_string());
        }
        let out = self.run(c, "(local)")?;
        std::str::from_utf8(&out)
            .ok()
            .and_then(|t| t.trim().parse().ok())
            .ok_or_else(|| SyncError::Local("git rev-list --count gave no number".into()))
    }

    /// Read `ids` out of this repository (`git cat-file --batch`), each
    /// one hashed here: an object whose bytes do not hash to its id, or
    /// over [`MAX_OBJECT`], or more than `budget` bytes in all, is refused.
    pub(crate) fn read_objects(
        &self,
        remote: &str,
        ids: &[Oid],
        budget: u64,
    ) -> Result<Vec<Object>, SyncError> {
        if ids.is_empty() {
            return Ok(Vec::new());
        }
        let hostile = |what: &str| SyncError::Hostile {
            remote: remote.to_string(),
            what: what.to_string(),
        };
        let (mut child, writer, stdout) = self.cat_file("--batch", ids, Stdio::piped())?;
        let mut reader = BufReader::with_capacity(1 << 16, stdout);
        let mut objects = Vec::with_capacity(ids.len());
        let mut total = 0u64;
        let result = (|| {
            for &id in ids {
                let mut header = String::new();
                reader.read_line(&mut header).map_err(local_io)?;
                let mut parts = header.split_whitespace();
                let (Some(got), Some(kind), Some(size)) =
                    (parts.next(), parts.next(), parts.next())
                else {
                    return Err(hostile("an object it named is missing"));
                };
                if got != id.to_string().as_str() {
                    return Err(hostile("an object it named is missing"));
                }
                let kind = match kind {
                    "commit" => ObjectType::Commit,
                    "tree" => ObjectType::Tree,
                    "blob" => ObjectType::Blob,
                    _ => return Err(hostile("it sent an object of a kind a vault never holds")),
                };
                let size: u64 = size.parse().map_err(|_| hostile("an object's size"))?;
                total = total.saturating_add(size);
                if size > MAX_OBJECT || total > budget {
                    return Err(hostile("it sent objects of absurd size"));
                }
                let mut data = vec![0u8; size as usize];
                reader
                    .read_exact(&mut data)
                    .map_err(|_| hostile("an object is cut short"))?;
                let mut nl = [0u8; 1];
                reader
                    .read_exact(&mut nl)
                    .map_err(|_| hostile("an object is cut short"))?;
                if object_hash(kind, &data) != *id.as_bytes() {
                    return Err(hostile("an object's bytes do not hash to its id"));
                }
                objects.push(Object { kind, id, data });
            }
            Ok(())
        })();
        drop(reader);
        let _ = writer.join();
        let mut stderr = Vec::new();
        if let Some(mut e) = child.stderr.take() {
            let _ = e.read_to_end(&mut stderr);
        }
        let _ = child.wait();
        result.map(|()| objects)
    }

    /// Write an object (bytes memvault made) into this repository as a
    /// loose object, for a push: the access ref's commit, which the vault
    /// itself does not keep.
    pub(crate) fn write_loose(&self, kind: ObjectType, data: &[u8]) -> Result<Oid, SyncError> {
        use flate2::{Compression, write::ZlibEncoder};
        let id = Oid::from_bytes(&object_hash(kind, data))
            .map_err(|e| SyncError::Local(e.to_string()))?;
        let hex = id.to_string();
        let dir = self.dir.join("objects").join(&hex[..2]);
        fsx::mkdir_private(&dir).map_err(local_io)?;
        let path = dir.join(&hex[2..]);
        if path.exists() {
            return Ok(id);
        }
        let name = match kind {
            ObjectType::Commit => "commit",
            ObjectType::Tree => "tree",
            _ => "blob",
        };
        let mut z = ZlibEncoder::new(Vec::new(), Compression::fast());
        z.write_all(format!("{name} {}\0", data.len()).as_bytes())
            .and_then(|()| z.write_all(data))
            .map_err(local_io)?;
        let bytes = z.finish().map_err(local_io)?;
        let mut f = fsx::create_new(&path, fsx::FILE_MODE).map_err(local_io)?;
        f.write_all(&bytes).map_err(local_io)?;
        Ok(id)
    }

    /// Push `updates` (each only from its `old`: a lease), atomically when
    /// the remote supports it, else one ref after the other in the order
    /// given. Ok(false): the remote moved (a lease failed), nothing or
    /// only the earlier refs moved.
    pub(crate) fn push(
        &self,
        remote: &str,
        url: &str,
        updates: &[Update],
    ) -> Result<bool, SyncError> {
        check_vault_remote(remote, url, true)?;
        check_remote_config(remote, url)?;
        match self.push_once(remote, url, updates, true) {
            Err(SyncError::Transport { detail, .. })
                if detail.contains("does not support --atomic") =>
            {
                for u in updates {
                    if !self.push_once(remote, url, std::slice::from_ref(u), false)? {
                        return Ok(false);
                    }
                }
                Ok(true)
            }
            other => other,
        }
    }

    fn push_once(
        &self,
        remote: &str,
        url: &str,
        updates: &[Update],
        atomic: bool,
    ) -> Result<bool, SyncError> {
        let mut c = self.git();
        c.args(["push", "--porcelain", "--no-verify"]);
        if local_dir(url).is_some() {
            c.arg(LOCAL_RECEIVE_PACK);
        }
        if atomic {
            c.arg("--atomic");
        }
        for u in updates {
            let old = u.old.map(|o| o.to_string()).unwrap_or_default();
            c.arg(format!("--force-with-lease={}:{old}", u.name));
        }
        c.arg("--").arg(url);
        for u in updates {
            c.arg(format!("{}:{}", u.new, u.name));
        }
        let out = output_within(c).map_err(|e| spawn_failed(e, remote))?;
        // `--porcelain`: one line per ref, "<flag>\t<from>:<to>\t<summary>".
        let text = String::from_utf8_lossy(&out.stdout);
        let errors = String::from_utf8_lossy(&out.stderr);
        // The receiving side found a ref not where the lease said (it
        // moved between the advertisement and the update): a race lost.
        let lost_race = errors.contains("but expected") || errors.contains("cannot lock ref");
        let mut moved = 0;
        let mut stale = false;
        let mut refused: Option<String> = None;
        for line in text.lines() {
            let mut parts = line.split('\t');
            let (Some(flag), Some(spec)) = (parts.next(), parts.next()) else {
                continue;
            };
            let summary = parts.next().unwrap_or("");
            let Some((_, to)) = spec.split_once(':') else {
                continue;
            };
            if !updates.iter().any(|u| u.name == to) {
                continue;
            }
            match flag {
                " " | "+" | "*" | "=" => moved += 1,
                "!" if summary.contains("stale info")
                    || summary.contains("fetch first")
                    || summary.contains("non-fast-forward")
                    || summary.contains("atomic push failed")
                    || (lost_race
                        && (summary.contains("atomic transaction failed")
                            || summary.contains("failed to update ref")
                            || summary.contains("failed to lock"))) =>
                {
                    stale = true
                }
                _ => refused = Some(summary.to_string()),
            }
        }
        if moved == updates.len() && out.status.success() {
            return Ok(true);
        }
        // The remote could not take a ref's lock: its `.lock` file exists
        // (another push, or one killed before it cleaned up). Not a race
        // that a pull and merge would settle.
        if errors.contains("Unable to create") && errors.contains(".lock': File exists") {
            // "cannot lock ref 'refs/heads/main': Unable to create ...":
            // the ref's name, when git gives one of ours.
            let name = errors
                .split("cannot lock ref '")
                .nth(1)
                .and_then(|rest| rest.split('\'').next())
                .filter(|n| updates.iter().any(|u| u.name == *n))
                .or_else(|| updates.first().map(|u| u.name))
                .unwrap_or(MAIN_REF)
                .to_string();
            return Err(SyncError::RefLocked {
                remote: remote.to_string(),
                name,
            });
        }
        if let Some(why) = refused.filter(|_| !stale) {
            return Err(SyncError::Transport {
                remote: remote.to_string(),
                detail: format!(
                    "the remote refused the push: {why} ({})",
                    last_lines(&out.stderr)
                ),
            });
        }
        if stale {
            return Ok(false);
        }
        Err(SyncError::Transport {
            remote: remote.to_string(),
            detail: last_lines(&out.stderr),
        })
    }
}

/// A `git` command in the repository `dir`: its config and hooks alone
/// (none), no prompts when asked, only the transports memvault runs, and
/// none of the caller's `GIT_*` variables that would point it elsewhere.
fn git_in(dir: &Path) -> Command {
    let mut c = Command::new("git");
    c.env("GIT_DIR", dir);
    scrub_env(&mut c);
    for setting in [
        "core.hooksPath=/dev/null",
        "core.fsmonitor=false",
        "core.askPass=",
        "gc.auto=0",
        "maintenance.auto=false",
        "fetch.unpackLimit=1",
        "transfer.unpackLimit=1",
        "fetch.writeCommitGraph=false",
        "protocol.allow=never",
        "protocol.file.allow=always",
        "protocol.ssh.allow=always",
        "protocol.https.allow=always",
        "protocol.http.allow=always",
    ] {
        c.arg("-c").arg(setting);
    }
    if NO_PROMPTS.load(std::sync::atomic::Ordering::Relaxed) {
        c.env("GIT_TERMINAL_PROMPT", "0")
            .env("SSH_ASKPASS_REQUIRE", "never");
    }
    c.stdin(Stdio::null());
    c
}

/// The `git receive-pack` a push to a remote reached as a path runs, in
/// the remote's repository on this machine: git clears the `-c` settings
/// of the pushing command for it, so they are given again, with the
/// remote's hooks, its alternate refs command and its automatic `gc`
/// off. (Settings that name a command and that a later `-c` cannot
/// override are refused first: [`check_remote_config`].)
const LOCAL_RECEIVE_PACK: &str = "--receive-pack=git -c core.hooksPath=/dev/null -c core.fsmonitor=false -c core.alternateRefsCommand=true -c receive.autogc=false -c gc.auto=0 -c maintenance.auto=false receive-pack";

/// The same for the `git upload-pack` a fetch from such a remote runs.
const LOCAL_UPLOAD_PACK: &str = "--upload-pack=git -c core.hooksPath=/dev/null -c core.fsmonitor=false -c core.alternateRefsCommand=true upload-pack";

/// Refuse a remote reached as a path whose repository's config (its own
/// file and what that includes, as git reads it there) names a command
/// git could run on this machine while memvault pushes to it, fetches
/// from it or prunes it: a hook's setting that a later `-c` cannot take
/// back (`gc.recentObjectsHook` runs every value), an include (whose
/// file can change after this look), or any setting of the kinds that
/// name programs. The repository is the one git opens for the path
/// ([`local_repo`]: `DIR/.git`, `DIR`, `DIR.git/.git` or `DIR.git`); one
/// whose config git cannot read (owned by another user, a format git does
/// not know) is refused too. No repository there at all is left to the
/// git command that follows, which fails.
pub(crate) fn check_remote_config(remote: &str, url: &str) -> Result<(), SyncError> {
    match local_repo(url) {
        Some(dir) => check_repo_config(remote, &dir),
        None => Ok(()),
    }
}

/// [`check_remote_config`] for the repository (its git directory) `dir`.
fn check_repo_config(remote: &str, dir: &Path) -> Result<(), SyncError> {
    let mut c = Command::new("git");
    scrub_env(&mut c);
    c.env("GIT_DIR", dir)
        .args([
            "config",
            "--list",
            "--includes",
            "--show-scope",
            "--name-only",
            "-z",
        ])
        .stdin(Stdio::null());
    let unreadable = || SyncError::RemoteConfigUnreadable {
        remote: remote.to_string(),
    };
    let out = output_within(c).map_err(|_| unreadable())?;
    if !out.status.success() {
        return Err(unreadable());
    }
    let fields: Vec<&[u8]> = out.stdout.split(|b| *b == 0).collect();
    for pair in fields.chunks(2) {
        let [scope, key] = pair else { continue };
        if !matches!(*scope, b"local" | b"worktree") {
            continue;
        }
        let key = String::from_utf8_lossy(key).into_owned();
        if names_a_command(&key.to_lowercase()) {
            return Err(SyncError::RemoteCommand {
                remote: remote.to_string(),
                key,
            });
        }
    }
    Ok(())
}

/// Whether the git setting `key` (lowercase) names a program to run, or
/// pulls in settings from elsewhere, or names a working tree git would
/// write into (a push to a repository that checks out what it receives). `core.hooksPath` is not refused:
/// every git command memvault runs there sets it to `/dev/null`.
fn names_a_command(key: &str) -> bool {
    let first = key.split('.').next().unwrap_or("");
    let last = key.rsplit('.').next().unwrap_or("");
    if matches!(first, "include" | "includeif" | "pager" | "alias") {
        return true;
    }
    if last == "hookspath" {
        return false;
    }
    [
        "command",
        "hook",
        "program",
        "helper",
        "editor",
        "pager",
        "textconv",
        "askpass",
        "fsmonitor",
        "driver",
        "cmd",
        "clean",
        "smudge",
        "process",
        "proxy",
        "worktree",
    ]
    .iter()
    .any(|word| last.contains(word))
}

/// Clear the caller's `GIT_*` variables that would point a `git` command
/// elsewhere, and read git's messages in English.
fn scrub_env(c: &mut Command) {
    c.env("LC_ALL", "C").env("GIT_NO_REPLACE_OBJECTS", "1");
    for v in [
        "GIT_WORK_TREE",
        "GIT_INDEX_FILE",
        "GIT_OBJECT_DIRECTORY",
        "GIT_ALTERNATE_OBJECT_DIRECTORIES",
        "GIT_COMMON_DIR",
        "GIT_NAMESPACE",
        "GIT_QUARANTINE_PATH",
        "GIT_CONFIG",
        "GIT_SHALLOW_FILE",
        "GIT_GRAFT_FILE",
        "GIT_CONFIG_PARAMETERS",
        "GIT_CONFIG_COUNT",
        "GIT_CEILING_DIRECTORIES",
    ] {
        c.env_remove(v);
    }
}

/// Where the refs of a remote reached as a path point, read from its
/// files (a loose ref, else `packed-refs`), each file read at most
/// [`PEEK_LIMIT`] bytes. Anything it cannot read this way (reftable, a
/// working tree, a ref it cannot parse, a ref file that is a link or not
/// a regular file, which git may follow) is None: the caller fetches
/// through git instead. A ref file that is there but not read is never
/// passed over for `packed-refs`, whose line for it may be older.
pub(crate) fn peek_refs(dir: &Path) -> Option<RemoteRefs> {
    // Ok(None): no such file.
    let read = |path: &Path| -> Result<Option<String>, ()> {
        // Not through a link, nor a FIFO's open that would wait.
        let f = match fsx::open_read(path) {
            Ok(f) => f,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
            Err(_) => return Err(()),
        };
        let mut text = String::new();
        f.take(PEEK_LIMIT)
            .read_to_string(&mut text)
            .map_err(|_| ())?;
        Ok(Some(text))
    };
    if dir.join("reftable").exists() || !dir.join("refs").is_dir() {
        return None;
    }
    let packed = read(&dir.join("packed-refs")).ok()?.unwrap_or_default();
    if packed.len() as u64 >= PEEK_LIMIT {
        // Perhaps cut short: not read this way.
        return None;
    }
    let one = |name: &str| -> Option<Option<Oid>> {
        if let Some(text) = read(&dir.join(name)).ok()? {
            return Oid::from_str(text.trim()).ok().map(Some);
        }
        for line in packed.lines() {
            if let Some((id, r)) = line.split_once(' ')
                && r == name
            {
                return Oid::from_str(id).ok().map(Some);
            }
        }
        Some(None)
    };
    Some(RemoteRefs {
        main: one(MAIN_REF)?,
        keys: one(KEYS_REF)?,
        access: one(ACCESS_REF)?,
    })
}

/// The most [`peek_refs`] reads of one file.
const PEEK_LIMIT: u64 = 1 << 20;

/// The lock file memvault takes in a remote reached as a path: pushes
/// from memvault processes and the prune after an erasure wait for each
/// other on it.
const REMOTE_LOCK: &str = "memvault.lock";

/// Whether the remote reached as the path `dir` is a memvault vault's
/// own directory (its format file there), not a git repository made to be
/// a remote: `dir` itself or any directory git would open for it (it tries
/// `dir/.git`, `dir`, `dir.git/.git` and `dir.git`, and follows a `.git`
/// file's `gitdir:`), links followed.
pub(crate) fn is_vault_dir(dir: &Path) -> bool {
    repo_candidates(dir)
        .iter()
        .any(|d| d.join(crate::vault::FORMAT_FILE).is_file())
}

/// A remote reached as a path that is a vault's own directory: never
/// pushed to (git would move its ref files under its log and its running
/// processes); fetched from only while its log holds no record its ref
/// files do not show (after `gc`, with no process on it), or the copy
/// would lack acknowledged writes.
fn check_vault_remote(remote: &str, url: &str, pushing: bool) -> Result<(), SyncError> {
    let Some(dir) = local_dir(url) else {
        return Ok(());
    };
    if !is_vault_dir(&dir) {
        return Ok(());
    }
    if pushing {
        return Err(SyncError::VaultAsRemote {
            remote: remote.to_string(),
        });
    }
    if crate::vault::wal::holds_records(&dir) {
        return Err(SyncError::VaultBusy {
            remote: remote.to_string(),
        });
    }
    Ok(())
}

/// The directory of a remote reached as a path (a local path or a
/// `file://` URL without a host or escapes, see [`check_url`]; stored URLs
/// are absolute), None for a remote reached over the network.
pub(crate) fn local_dir(url: &str) -> Option<PathBuf> {
    let path = match url.strip_prefix("file://") {
        Some(rest) => rest,
        None if url.contains("://") || is_scp_like(url) => return None,
        None => url,
    };
    path.starts_with('/').then(|| PathBuf::from(path))
}

/// The git directory git opens for a remote reached as a path, as its
/// `receive-pack` and `upload-pack` find it: the first of `DIR/.git`,
/// `DIR`, `DIR.git/.git` and `DIR.git` that is a git directory (a `.git`
/// file's `gitdir:` followed). None: not a path, or no repository there.
pub(crate) fn local_repo(url: &str) -> Option<PathBuf> {
    repo_candidates(&local_dir(url)?)
        .into_iter()
        .find(|d| is_git_dir(d))
}

/// The directories git tries for the path `dir`, in its order: `DIR/.git`,
/// `DIR`, `DIR.git/.git`, `DIR.git` (trailing slashes dropped), a `.git`
/// file's `gitdir:` followed (at most 4 KiB read, relative to the file's
/// directory; one that does not say `gitdir:` is left out).
fn repo_candidates(dir: &Path) -> Vec<PathBuf> {
    let trimmed = dir.to_string_lossy().trim_end_matches('/').to_string();
    let dir = if trimmed.is_empty() {
        dir.to_path_buf()
    } else {
        PathBuf::from(trimmed)
    };
    let with_git = {
        let mut s = dir.as_os_str().to_owned();
        s.push(".git");
        PathBuf::from(s)
    };
    let mut out = Vec::with_capacity(4);
    for candidate in [dir.join(".git"), dir, with_git.join(".git"), with_git] {
        if !candidate.is_file() {
            out.push(candidate);
            continue;
        }
        let mut text = String::new();
        let read = std::fs::File::open(&candidate)
            .and_then(|f| f.take(4096).read_to_string(&mut text))
            .is_ok();
        if let (true, Some(target), Some(parent)) = (
            read,
            text.trim_end().strip_prefix("gitdir: "),
            candidate.parent(),
        ) {
            out.push(parent.join(target));
        }
    }
    out
}

/// Whether `dir` looks like a git directory to git: a `HEAD` file, and
/// `objects` and `refs` directories (or a `commondir` file naming them).
fn is_git_dir(dir: &Path) -> bool {
    dir.join("HEAD").is_file()
        && ((dir.join("objects").is_dir() && dir.join("refs").is_dir())
            || dir.join("commondir").is_file())
}

/// The lock of a remote reached as a path, held while the guard lives.
pub(crate) struct RemoteLock {
    _guard: FileLock,
}

/// Take the lock of the remote in `dir`, exclusively: pushes and the
/// prune of memvault processes go one at a time (git's own pushes, and
/// memvault's over SSH or HTTP to the same repository, do not take it).
/// `Ok(None)`: there is no lock to take (not a repository with objects,
/// or a remote this user may only read). The wait is bounded by the
/// remote timeout, as a transfer is: a lock held longer (a stuck memvault
/// on another machine sharing the disk, or the remote's owner holding it)
/// is a remote that does not answer, and nothing is changed here.
pub(crate) fn lock_remote(remote: &str, dir: &Path) -> Result<Option<RemoteLock>, SyncError> {
    if !dir.join("objects").is_dir() {
        return Ok(None);
    }
    let Ok(file) = fsx::open_rw(&dir.join(REMOTE_LOCK)) else {
        return Ok(None);
    };
    let file = std::sync::Arc::new(file);
    let limit = Duration::from_millis(REMOTE_TIMEOUT_MS.load(std::sync::atomic::Ordering::Relaxed));
    let start = std::time::Instant::now();
    let mut pause = Duration::from_millis(5);
    let mut said = false;
    loop {
        match FileLock::try_exclusive_on(&file) {
            Ok(Some(guard)) => return Ok(Some(RemoteLock { _guard: guard })),
            Ok(None) => {}
            Err(_) => return Ok(None),
        }
        let waited = start.elapsed();
        if waited >= limit {
            return Err(SyncError::Transport {
                remote: remote.to_string(),
                detail: format!(
                    "its lock file (memvault.lock, which memvault's pushes to a path hold) stayed taken for {} s (--remote-timeout: another memvault pushing there, or one stuck or stopped); gave up, nothing was changed here",
                    limit.as_millis().div_ceil(1000)
                ),
            });
        }
        if !said && waited >= Duration::from_secs(3) {
            said = true;
            eprintln!(
                "memvault: waiting for the lock of remote {remote} (another memvault is pushing there, or one is stuck); giving up after {} s (--remote-timeout)",
                limit.as_millis().div_ceil(1000)
            );
        }
        std::thread::sleep(pause.min(limit.saturating_sub(waited)));
        pause = (pause * 2).min(Duration::from_millis(100));
    }
}

/// Prune the bare repository in `dir` (a remote reached as a path, whose
/// lock the caller holds): `git gc --prune=now`, reflogs expired first,
/// so that objects nothing reaches any more (key states replaced by an
/// erasure, holding the destroyed key) are deleted there too. Its own
/// hooks do not run.
pub(crate) fn prune_remote(remote: &str, dir: &Path) -> Result<(), SyncError> {
    check_repo_config(remote, dir)?;
    let mut c = git_in(dir);
    c.args([
        "-c",
        "gc.reflogExpire=now",
        "-c",
        "gc.reflogExpireUnreachable=now",
        "-c",
        "gc.cruftPacks=false",
        "gc",
        "--quiet",
        "--prune=now",
    ]);
    // Within the remote timeout, as a fetch or push there: the directory
    // is the remote's, and what it holds may stall git (a FIFO where git
    // reads a file) while this sync holds the remote's lock.
    let out = output_within(c).map_err(|e| spawn_failed(e, remote))?;
    git_result(out, remote, "git gc failed there: ")?;
    // What no ref reaches is gone now, unless git's prune kept it for an
    // index, a worktree's HEAD or a kept pack; and a ref memvault does not
    // write (a backup's, a mirror's) may still reach a replaced key state.
    // Either way the prune is not called done.
    let mut c = git_in(dir);
    c.args(["for-each-ref", "--format=%(refname)"]);
    let out = output_within(c).map_err(|e| spawn_failed(e, remote))?;
    let listed = git_result(out, remote, "git for-each-ref failed there: ")?;
    let listed = String::from_utf8_lossy(&listed).into_owned();
    let ours = [MAIN_REF, KEYS_REF, ACCESS_REF];
    let all: Vec<&str> = listed.lines().filter(|r| !r.is_empty()).collect();
    let present: Vec<&str> = all.iter().copied().filter(|r| ours.contains(r)).collect();
    let foreign: Vec<&str> = all.iter().copied().filter(|r| !ours.contains(r)).collect();
    // Whether `refs` reach a key-state commit memvault's refs do not (a
    // key state's message names it; another project's branch does not).
    let key_states_beyond = |refs: &[&str]| -> Result<bool, SyncError> {
        let mut c = git_in(dir);
        c.args(["log", "--format=%s"])
            .args(refs)
            .arg("--not")
            .args(&present)
            .arg("--");
        let out = output_within(c).map_err(|e| spawn_failed(e, remote))?;
        let subjects = git_result(out, remote, "git log failed there: ")?;
        Ok(String::from_utf8_lossy(&subjects)
            .lines()
            .any(|l| l.starts_with("memvault key state")))
    };
    if !foreign.is_empty() && key_states_beyond(&foreign)? {
        // The refs to name (the first few that reach one).
        let mut named = Vec::new();
        for r in foreign.iter().take(8) {
            if key_states_beyond(std::slice::from_ref(r))? {
                named.push(r.escape_debug().to_string());
            }
        }
        let more = if foreign.len() > 8 { ", ..." } else { "" };
        return Err(SyncError::Transport {
            remote: remote.to_string(),
            detail: format!(
                "refs there that memvault does not write ({}{more}) reach key states its own refs do not, which may be the replaced ones: delete them there (`git update-ref -d REF`) and sync again",
                named.join(", "),
            ),
        });
    }
    // The objects there against those every ref reaches: more are held by
    // an index, a worktree's HEAD or a kept pack.
    let mut c = git_in(dir);
    c.args(["count-objects", "-v"]);
    let out = output_within(c).map_err(|e| spawn_failed(e, remote))?;
    let counted = git_result(out, remote, "git count-objects failed there: ")?;
    let held: u64 = String::from_utf8_lossy(&counted)
        .lines()
        .filter_map(|l| {
            l.strip_prefix("count: ")
                .or_else(|| l.strip_prefix("in-pack: "))
        })
        .filter_map(|n| n.trim().parse::<u64>().ok())
        .sum();
    let mut c = git_in(dir);
    c.args(["rev-list", "--objects", "--no-object-names"])
        .args(&all)
        .arg("--");
    let out = output_within(c).map_err(|e| spawn_failed(e, remote))?;
    let reached = git_result(out, remote, "git rev-list failed there: ")?;
    let reached = reached
        .split(|&b| b == b'\n')
        .filter(|l| !l.is_empty())
        .count() as u64;
    if held <= reached {
        return Ok(());
    }
    Err(SyncError::Transport {
        remote: remote.to_string(),
        detail: format!(
            "it keeps {} object{} that no ref there reaches (held by an index, a worktree, or a kept pack there), which may hold the replaced key states: remove what holds them there, then sync again",
            held - reached,
            if held - reached == 1 { "" } else { "s" }
        ),
    })
}

/// Run a `git` command to its end: its stdout, or its failure (the last
/// lines of its stderr after `context`).
fn run_git(mut c: Command, remote: &str, context: &str) -> Result<Vec<u8>, SyncError> {
    c.stdout(Stdio::piped()).stderr(Stdio::piped());
    let out = c.output().map_err(|e| spawn_failed(e, remote))?;
    git_result(out, remote, context)
}

/// A finished git command's stdout, or its failure (the last lines of its
/// stderr after `context`).
fn git_result(
    out: std::process::Output,
    remote: &str,
    context: &str,
) -> Result<Vec<u8>, SyncError> {
    if !out.status.success() {
        // What git refuses to read in what the remote sent: the remote's
        // doing (forged or damaged), not a transport failure.
        if contains(&out.stderr, b"exceeded maximum allowed tree depth") {
            return Err(SyncError::Hostile {
                remote: remote.to_string(),
                what:
                    "it holds a tree nested deeper than git reads (a forged or damaged repository)"
                        .into(),
            });
        }
        return Err(SyncError::Transport {
            remote: remote.to_string(),
            detail: format!("{context}{}", last_lines(&out.stderr)),
        });
    }
    Ok(out.stdout)
}

impl Drop for Scratch {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// Remove scratch repositories a killed sync left behind (older than a
/// day, so a sync running now in another process keeps its own).
fn remove_stale(state: &Path) {
    let Ok(entries) = std::fs::read_dir(state) else {
        return;
    };
    for e in entries.flatten() {
        let name = e.file_name();
        let Some(name) = name.to_str() else { continue };
        if !name.starts_with(SCRATCH_PREFIX) {
            continue;
        }
        let old = e
            .metadata()
            .and_then(|m| m.modified())
            .ok()
            .and_then(|t| t.elapsed().ok())
            .is_some_and(|age| age.as_secs() > 86_400);
        if old && e.file_type().is_ok_and(|t| t.is_dir()) {
            let _ = std::fs::remove_dir_all(e.path());
        }
    }
}

fn contains(hay: &[u8], needle: &[u8]) -> bool {
    hay.windows(needle.len()).any(|w| w == needle)
}

/// What ssh says of why it could not connect, where git's own verdict
/// does not.
const SSH_CAUSES: [&str; 4] = [
    "Host key verification failed",
    "Permission denied (",
    "No such identity",
    "kex_exchange_identification",
];

/// The last lines of git's stderr, for an error message: at most 3 lines
/// and 400 characters, control characters dropped.
fn last_lines(stderr: &[u8]) -> String {
    let text = String::from_utf8_lossy(stderr);
    let lines: Vec<&str> = text
        .lines()
        .map(str::trim)
        .filter(|l| !l.is_empty())
        .collect();
    // git's own verdict (`fatal:`, `error:`) when it gave one: the lines
    // after it are often advice cut mid-sentence by the last-3 rule.
    let mut verdicts: Vec<&str> = Vec::new();
    // What the remote's own hooks print comes as `remote: ...`: never
    // taken for ssh's word.
    let local: Vec<&str> = lines
        .iter()
        .copied()
        .filter(|l| !l.starts_with("remote:"))
        .collect();
    // ssh's cause first: git's verdict alone ("Could not read from remote
    // repository") is the same for a refused connection, a key not
    // authorized and a host key that changed (round 41b).
    if local
        .iter()
        .any(|l| l.contains("REMOTE HOST IDENTIFICATION HAS CHANGED"))
    {
        verdicts.push(
            "ssh: the remote host's key changed since it was trusted (REMOTE HOST IDENTIFICATION HAS CHANGED): someone may be intercepting the connection; check the new key with the host's owner before trusting it",
        );
    }
    verdicts.extend(
        local
            .iter()
            .copied()
            .filter(|l| l.starts_with("ssh:") || SSH_CAUSES.iter().any(|cause| l.contains(cause)))
            .take(2),
    );
    verdicts.extend(
        lines
            .iter()
            .copied()
            .filter(|l| l.starts_with("fatal:") || l.starts_with("error:"))
            .take(2),
    );
    verdicts.dedup();
    let tail = if verdicts.is_empty() {
        lines[lines.len().saturating_sub(3)..].join("; ")
    } else {
        verdicts.join("; ")
    };
    let clean: String = tail.chars().filter(|c| !c.is_control()).take(400).collect();
    if clean.is_empty() {
        "git failed without saying why".into()
    } else {
        clean
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ssh_causes_come_before_gits_verdict() {
        let changed = b"@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@\n\
            @    WARNING: REMOTE HOST IDENTIFICATION HAS CHANGED!     @\n\
            IT IS POSSIBLE THAT SOMEONE IS DOING SOMETHING NASTY!\n\
            Host key verification failed.\n\
            fatal: Could not read from remote repository.\n\n\
            Please make sure you have the correct access rights\n";
        let said = last_lines(changed);
        assert!(
            said.starts_with("ssh: the remote host's key changed"),
            "{said}"
        );
        assert!(said.contains("Host key verification failed"), "{said}");
        assert!(said.contains("fatal: Could not read"), "{said}");
        let refused = b"ssh: connect to host 127.0.0.1 port 2222: Connection refused\r\n\
            fatal: Could not read from remote repository.\n";
        let said = last_lines(refused);
        assert!(
            said.starts_with("ssh: connect to host 127.0.0.1 port 2222: Connection refused"),
            "{said}"
        );
        let denied = b"git@h: Permission denied (publickey).\nfatal: Could not read from remote repository.\n";
        assert!(last_lines(denied).starts_with("git@h: Permission denied (publickey)."));
        // A remote's hook cannot speak for ssh.
        let hook = b"remote: WARNING: REMOTE HOST IDENTIFICATION HAS CHANGED!\nremote: Permission denied (x)\nfatal: the remote end hung up\n";
        assert_eq!(last_lines(hook), "fatal: the remote end hung up");
        // git's verdict alone, as before.
        assert_eq!(
            last_lines(b"hint: x\nfatal: repository 'x' not found\n"),
            "fatal: repository 'x' not found"
        );
    }

    #[test]
    fn urls_of_the_transports_memvault_runs_pass_and_others_are_refused() {
        for ok in [
            "/srv/vault.git",
            "relative/path",
            "file:///srv/v.git",
            "ssh://git@example.com/v.git",
            "git@example.com:v.git",
            "https://example.com/v.git",
            "http://127.0.0.1:8080/v.git",
            "http://localhost/v.git",
            "http://[::1]:80/v.git",
        ] {
            assert!(check_url(ok).is_ok(), "{ok}");
        }
        for bad in [
            "",
            "-uhelp",
            "ext::sh -c touch% /tmp/pwned",
            "fd::17",
            "http://example.com/v.git",
            "ftp://example.com/v.git",
            "git://example.com/v.git",
            "/a\nb",
            "file://localhost/srv/v.git",
            "file://host/srv/v.git",
            "file:///srv/v%61ult",
        ] {
            assert!(check_url(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn every_directory_git_would_open_for_a_path_is_checked_for_a_vault() {
        let tmp = tempfile::tempdir().unwrap();
        let vault = tmp.path().join("v");
        std::fs::create_dir_all(vault.join("memvault")).unwrap();
        std::fs::write(vault.join("memvault/format"), "8\n").unwrap();
        let plain = tmp.path().join("plain");
        std::fs::create_dir_all(&plain).unwrap();
        assert!(is_vault_dir(&vault));
        assert!(!is_vault_dir(&plain));
        // `X.git` for `X`, `X/.git`, a link, a `.git` file naming it.
        std::fs::rename(&vault, tmp.path().join("w.git")).unwrap();
        assert!(is_vault_dir(&tmp.path().join("w")));
        std::fs::create_dir_all(tmp.path().join("x")).unwrap();
        std::os::unix::fs::symlink(tmp.path().join("w.git"), tmp.path().join("x/.git")).unwrap();
        assert!(is_vault_dir(&tmp.path().join("x")));
        std::os::unix::fs::symlink(tmp.path().join("w.git"), tmp.path().join("link")).unwrap();
        assert!(is_vault_dir(&tmp.path().join("link")));
        std::fs::create_dir_all(tmp.path().join("y")).unwrap();
        std::fs::write(tmp.path().join("y/.git"), "gitdir: ../w.git\n").unwrap();
        assert!(is_vault_dir(&tmp.path().join("y")));
        assert!(!is_vault_dir(&tmp.path().join("nothing")));
    }

    #[test]
    fn a_relative_path_is_stored_absolute() {
        let abs = absolute_url("some/dir.git").unwrap();
        assert!(abs.starts_with('/') && abs.ends_with("some/dir.git"));
        assert_eq!(absolute_url("git@h:v.git").unwrap(), "git@h:v.git");
    }
}
