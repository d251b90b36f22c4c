//! The one door between the vault's object files and libgit2's object
//! reader: every object memvault lets libgit2 read is checked here first.
//!
//! libgit2 1.9 loops forever on some truncated loose objects and crashes
//! on some damaged packs, so no byte from `objects/` may reach it
//! unchecked. [`check`] (and the `find_*`/[`read`] wrappers that call it
//! before reading through libgit2) does, for one object id:
//!
//! - the packs: each pack's index is checked once, before libgit2 may
//!   search it ([`super::pack::open_index`]: header, fanout, length, the
//!   pack's header and trailer; then each fanout bucket's ids, sorted and
//!   under their first byte, when an id of it is first looked up), and
//!   remembered by name, size and modification time. The pack
//!   directory is looked at (one `stat`, and a listing while it changed in
//!   the last moments) on every check, so a pack that appears later is
//!   checked before the next read. Then, in every pack that lists `id`,
//!   the entries libgit2 would read for it (its own and its delta bases:
//!   [`PackIndex::check_object`]), each once per process. [`check_packs`]
//!   (for `verify` and `gc`) validates every pack whole instead
//!   ([`super::pack::validate`]: every entry, the pack's checksum). While
//!   any pack fails, every read is refused as damage: libgit2 searches
//!   every pack's index for every id, so one bad pack is reachable from
//!   any read.
//! - the loose object, if there is one: inflated here (bounded by
//!   [`MAX_OBJECT`](super::pack::MAX_OBJECT), in 64 KiB pieces), its
//!   `<type> <size>\0` header checked against what follows, and its SHA-1
//!   against its id.
//!
//! Trees and blobs in packs are mostly not handed to libgit2 at all:
//! [`blob_content`] and [`tree_entries`] read them with memvault's own
//! reader ([`PackIndex::read_object`]), which checks each entry it reads
//! as above and hashes the object it makes; only the pack it reads from is
//! checked for that id.
//!
//! Objects never change, so an id that checked out is remembered (per
//! repository, in this process) until the object database is installed
//! again ([`odb_installed`]: at every checkpoint, this process's or
//! another's, an object may move from memory to a loose file, and loose
//! files may be replaced) or a new or changed pack appears (its entries
//! for that id were never checked). Objects in the in-memory store (the
//! write-ahead log's) were checked against their ids when they were
//! loaded (`Wal::catch_up`).
//!
//! Limitations: the check runs before libgit2's read, not inside it, so a
//! file replaced between the two (by someone writing the vault while a
//! process runs) is not seen; a loose object changed in place after it
//! checked out is not checked again before the next checkpoint, nor a
//! pack changed in place (its directory unchanged) before the pack
//! directory changes.

use std::collections::{HashMap, HashSet};
use std::io::Read;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::{LazyLock, Mutex};
use std::time::{Instant, SystemTime};

use git2::{Blob, Commit, ObjectType, OdbObject, Oid, Repository, Tree};
use sha1::{Digest, Sha1};

use super::pack::{self, MAX_OBJECT, PackError, PackIndex};

/// Why an object was not handed to libgit2, or libgit2 could not read it.
#[derive(Debug, thiserror::Error)]
pub enum ObjectError {
    #[error("object {0} is truncated or corrupt")]
    Corrupt(Oid),
    #[error("object {0} is missing or unreadable")]
    Unreadable(Oid),
    /// A pack failed its validation: its index file's name, and what
    /// failed (see [`PackError`]).
    #[error(
        "a pack in objects/pack is damaged ({what}: {}, with its index {index})",
        pack_of(.index)
    )]
    Pack { index: String, what: &'static str },
}

/// The pack file an index file (`pack-<id>.idx`) goes with.
fn pack_of(index: &str) -> String {
    format!("{}.pack", index.strip_suffix(".idx").unwrap_or(index))
}

impl From<ObjectError> for crate::memory::StoreError {
    fn from(e: ObjectError) -> Self {
        crate::memory::StoreError::Damaged(e.to_string())
    }
}

/// For the plumbing that speaks git2's error type (the message still says
/// the vault is damaged).
impl From<ObjectError> for git2::Error {
    fn from(e: ObjectError) -> Self {
        git2::Error::from_str(&format!("the vault is damaged: {e}"))
    }
}

/// What this process knows of one repository's objects.
#[derive(Default)]
struct Known {
    /// Since the object database was last installed: loose objects that
    /// checked out,
    loose: HashSet<Oid>,
    /// ids that had no loose file when checked, or were found in a pack
    /// (read from there: see [`check`]),
    elsewhere: HashSet<Oid>,
    /// and trees checked with every tree below them;
    deep: HashSet<Oid>,
    /// objects written into the in-memory store ([`write_object`]), which
    /// libgit2 reads before any pack or loose file.
    memory: HashSet<Oid>,
    /// Packs by index file name, with their index and pack stamps.
    packs: HashMap<String, Pack>,
    /// The pack directory's stamp and index names when the packs were
    /// last validated, and whether its time was old enough to trust.
    pack_dir: Option<Stamp>,
    names: Vec<String>,
    settled: bool,
    /// A `multi-pack-index` was seen in the pack directory.
    midx: bool,
    /// When the pack directory was last looked at by [`check`] (None:
    /// look at the next check; see [`new_request`]).
    looked: Option<Instant>,
}

/// Size, modification time, inode and change time of a file, to see it
/// changed: a file written again with its size and time set back still
/// gets a new change time (which `utimes` cannot set), and a file put in
/// its place a new inode.
type Stamp = (u64, Option<SystemTime>, u64, i64, i64);

/// One pack as this process knows it.
struct Pack {
    stamps: (Stamp, Stamp),
    /// Its checked index, or the refusal.
    state: Result<Box<PackIndex>, &'static str>,
    /// Whether every entry was checked ([`pack::validate`]), or only those
    /// of the objects checked so far ([`PackIndex::check_object`]).
    whole: bool,
    /// Whether it was there when the object database was last installed,
    /// so libgit2 lists it: libgit2 lists the packs again only when an id
    /// is found nowhere, so an id in a later pack may still be read from
    /// its loose file.
    listed: bool,
}

fn refusal(e: PackError) -> &'static str {
    match e {
        PackError::Unreadable(_) => "a pack or its index does not read",
        PackError::Malformed(what) => what,
    }
}

/// How old the pack directory's modification time must be before its
/// listing is trusted until it changes: longer than the file system's
/// timestamp tick (a jiffy of coarse kernel time here). Packs written by
/// other memvault processes come with a new log generation, which
/// revalidates at once (`odb_installed`); this window only guards
/// against a change within one tick by anything else. It is no security
/// boundary: whoever can write the vault can also set the directory's
/// time back (see the module's Limitations). A longer window (it was 2 s)
/// made every check list the directory for that long after each
/// checkpoint, about a fifth of a `str_replace`'s time in `serve`.
const RACY: std::time::Duration = std::time::Duration::from_millis(100);

/// Ids remembered per repository before the sets start over.
const KNOWN_LIMIT: usize = 1 << 20;

static KNOWN: LazyLock<Mutex<HashMap<PathBuf, Known>>> = LazyLock::new(Default::default);

fn with_known<T>(repo: &Repository, f: impl FnOnce(&mut Known) -> T) -> T {
    let mut all = KNOWN.lock().unwrap_or_else(|e| e.into_inner());
    // Looked up by the path as it is (no copy) once the entry exists.
    if let Some(k) = all.get_mut(repo.path()) {
        return f(k);
    }
    f(all.entry(repo.path().to_path_buf()).or_default())
}

/// Forget what was checked of the repository at `path` (a vault closed):
/// its packs' indexes hold two open files each, and a server that closes
/// idle vaults must not keep them.
pub(crate) fn forget(path: &Path) {
    KNOWN.lock().unwrap_or_else(|e| e.into_inner()).remove(path);
}

fn stamp(path: &Path) -> Option<Stamp> {
    use std::os::unix::fs::MetadataExt;
    let m = std::fs::metadata(path).ok()?;
    Some((
        m.len(),
        m.modified().ok(),
        m.ino(),
        m.ctime(),
        m.ctime_nsec(),
    ))
}

/// Validate whole (see [`check_packs`]) the packs named `stems`
/// (`pack-<hex>`) alone: those a merge of small packs copies entries from
/// as they stand. The others are read through libgit2, each object
/// checked as it is read, as always.
pub(crate) fn check_packs_named(repo: &Repository, stems: &[&str]) -> Result<(), ObjectError> {
    with_known(repo, |k| {
        refresh_packs(repo, k, false, false)?;
        let dir = repo.path().join("objects/pack");
        for (name, p) in &mut k.packs {
            let stem = name.strip_suffix(".idx").unwrap_or(name);
            if p.whole || p.state.is_err() || !stems.contains(&stem) {
                continue;
            }
            let idx = dir.join(name.as_str());
            p.state = pack::validate(&idx, &idx.with_extension("pack"))
                .map(Box::new)
                .map_err(refusal);
            p.whole = true;
        }
        refused(k)
    })
}

/// List the packs and check the index of each new or changed one if the
/// pack directory changed (or `force`); the first refusal, if any pack
/// failed. With `whole`, every pack is also validated whole.
fn refresh_packs(
    repo: &Repository,
    k: &mut Known,
    force: bool,
    whole: bool,
) -> Result<(), ObjectError> {
    let dir = repo.path().join("objects/pack");
    let now = stamp(&dir);
    let changed = force || now.is_none() || now != k.pack_dir;
    if changed || !k.settled {
        let listed: Vec<String> = std::fs::read_dir(&dir)
            .map(|d| {
                d.filter_map(Result::ok)
                    .map(|e| e.file_name().to_string_lossy().into_owned())
                    .collect()
            })
            .unwrap_or_default();
        // libgit2 reads a multi-pack-index's offsets before any pack's own
        // index, and memvault never writes one: it is damage.
        k.midx = listed.iter().any(|n| n == MIDX);
        let mut names: Vec<String> = listed.into_iter().filter(|n| n.ends_with(".idx")).collect();
        names.sort_unstable();
        // A directory changed in the last moments may change again within
        // the same timestamp (file times are coarse): until it is older,
        // its names are listed again at each check, as git does with
        // racily clean files.
        k.settled = now
            .and_then(|(_, m, ..)| m)
            .and_then(|m| SystemTime::now().duration_since(m).ok())
            .is_some_and(|age| age > RACY);
        if (changed || names != k.names) && revalidate(&dir, &names, &mut k.packs) {
            // An id checked before may be found in a new pack now, whose
            // entries for it were never checked.
            k.loose.clear();
            k.elsewhere.clear();
            k.deep.clear();
        }
        if changed || names != k.names {
            k.pack_dir = now;
            k.names = names;
        }
    }
    if whole {
        for (name, p) in &mut k.packs {
            if p.whole || p.state.is_err() {
                continue;
            }
            let idx = dir.join(name);
            p.state = pack::validate(&idx, &idx.with_extension("pack"))
                .map(Box::new)
                .map_err(refusal);
            p.whole = true;
        }
    }
    refused(k)
}

/// The file name of a multi-pack index in `objects/pack`.
const MIDX: &str = "multi-pack-index";

/// The first refusal of a pack `k` knows, if any.
fn refused(k: &Known) -> Result<(), ObjectError> {
    if k.midx {
        return Err(ObjectError::Pack {
            index: MIDX.to_string(),
            what: "a multi-pack index, which memvault never writes, would make git read unchecked offsets",
        });
    }
    match k
        .packs
        .iter()
        .find_map(|(name, p)| p.state.as_ref().err().map(|what| (name, *what)))
    {
        Some((name, what)) => Err(ObjectError::Pack {
            index: name.clone(),
            what,
        }),
        None => Ok(()),
    }
}

/// Check the index of each pack of `names` (index file names) whose index
/// or pack changed since `packs` last saw it; forget those that are gone.
/// Returns whether any pack is new or changed.
fn revalidate(dir: &Path, names: &[String], packs: &mut HashMap<String, Pack>) -> bool {
    let mut seen = HashSet::new();
    let mut any = false;
    for name in names {
        let idx = dir.join(name);
        let pack_path = idx.with_extension("pack");
        // libgit2 skips an index without its pack, as git does.
        let (Some(si), Some(sp)) = (stamp(&idx), stamp(&pack_path)) else {
            continue;
        };
        seen.insert(name.clone());
        if packs.get(name).is_some_and(|p| p.stamps == (si, sp)) {
            continue;
        }
        any = true;
        let state = pack::open_index(&idx, &pack_path)
            .map(Box::new)
            .map_err(refusal);
        packs.insert(
            name.clone(),
            Pack {
                stamps: (si, sp),
                state,
                whole: false,
                listed: false,
            },
        );
    }
    packs.retain(|name, _| seen.contains(name));
    any
}

/// Check what libgit2 would read of every pack holding `id` (see
/// [`PackIndex::check_object`]); a pack that fails is refused from then on.
/// Returns whether a pack libgit2 lists holds `id` (libgit2 then reads it
/// from there, never from a loose file).
fn check_in_packs(k: &mut Known, id: Oid) -> Result<bool, ObjectError> {
    let mut found = false;
    for (name, p) in &mut k.packs {
        let Ok(index) = &mut p.state else { continue };
        let held = if p.whole {
            index.holds(id)
        } else {
            index.check_object(id)
        };
        found |= refuse_on_error(name, p, held)? && p.listed;
    }
    Ok(found)
}

/// A pack's answer; on an error the pack is refused from then on (every
/// later read says so), and the error names it.
fn refuse_on_error<T>(name: &str, p: &mut Pack, r: Result<T, PackError>) -> Result<T, ObjectError> {
    r.map_err(|e| {
        let what = refusal(e);
        p.state = Err(what);
        ObjectError::Pack {
            index: name.to_string(),
            what,
        }
    })
}

/// The object database was (re)installed: validate every pack now, before
/// libgit2 lists them, and forget which ids checked out (an object held
/// in memory may be loose on disk now).
pub(crate) fn odb_installed(repo: &Repository) {
    with_known(repo, |k| {
        k.loose.clear();
        k.elsewhere.clear();
        k.deep.clear();
        k.memory.clear();
        // A refusal is remembered: the next check reports it.
        let _ = refresh_packs(repo, k, true, false);
        // libgit2 lists the packs there are now at its first read.
        for p in k.packs.values_mut() {
            p.listed = true;
        }
    });
}

/// Refuse the object `id` unless libgit2 may read it (see the module
/// docs): every pack sound, and its loose file, if any, whole and
/// hashing to `id`.
pub(crate) fn check(repo: &Repository, id: Oid) -> Result<(), ObjectError> {
    let known = with_known(repo, |k| {
        // Read from memory: no pack or loose file is involved.
        if k.memory.contains(&id) {
            return Ok(true);
        }
        // The pack directory is looked at once per read (see new_request;
        // and at least every LOOK_EVERY): libgit2 lists the packs again
        // only when an id is found nowhere, and the look below comes
        // before saying so.
        let looked = look(repo, k)?;
        if k.loose.contains(&id) || k.elsewhere.contains(&id) {
            return Ok(true);
        }
        let mut in_packs = check_in_packs(k, id)?;
        if !in_packs && looked {
            refresh_packs(repo, k, false, false)?;
            k.looked = Some(Instant::now());
            in_packs = check_in_packs(k, id)?;
        }
        // libgit2 searches the packs before the loose files (its packed
        // backend has the higher priority): an id found in a pack is read
        // from there, and its loose file, if any, never.
        if in_packs {
            if k.elsewhere.len() >= KNOWN_LIMIT {
                k.elsewhere.clear();
            }
            k.elsewhere.insert(id);
            return Ok(true);
        }
        Ok(false)
    })?;
    if !known {
        load_loose(repo, id, false)?;
    }
    Ok(())
}

/// Look at the pack directory unless [`check`] did within this request
/// (see [`LOOK_EVERY`]); refuse every read while a pack fails. Returns
/// whether it had looked already.
fn look(repo: &Repository, k: &mut Known) -> Result<bool, ObjectError> {
    let looked = k.looked.is_some_and(|t| t.elapsed() < LOOK_EVERY);
    if !looked {
        refresh_packs(repo, k, false, false)?;
        k.looked = Some(Instant::now());
    } else {
        refused(k)?;
    }
    Ok(looked)
}

/// [`look`], for a read served from memory (a cached tree): a pack
/// planted since the last request is still refused before the next.
pub(crate) fn look_at_packs(repo: &Repository) -> Result<(), ObjectError> {
    with_known(repo, |k| look(repo, k).map(|_| ()))
}

/// How long [`check`] goes without looking at the pack directory within
/// one request.
const LOOK_EVERY: std::time::Duration = std::time::Duration::from_millis(20);

/// A new read starts (a tip is checked, a snapshot taken): the next
/// [`check`] looks at the pack directory.
pub(crate) fn new_request(repo: &Repository) {
    with_known(repo, |k| k.looked = None);
}

/// Put a new object into `repo`'s in-memory store (see `wal::install_odb`)
/// and return its id: hashed here, and written straight into the store,
/// without libgit2's write path (which looks for the object on disk first:
/// a stat of its loose path and a listing of the pack directory per new
/// object). The store is read before the disk, so a file planted on disk
/// under the same id is never what a read returns; the id is remembered
/// as checked.
pub(crate) fn write_object(
    repo: &Repository,
    kind: ObjectType,
    data: &[u8],
) -> Result<Oid, git2::Error> {
    let id = Oid::from_bytes(&pack::object_hash(kind, data))?;
    if !super::fsync::mempack_write(repo, id, kind, data)? {
        return repo.odb()?.write(kind, data);
    }
    with_known(repo, |k| {
        if k.memory.len() >= KNOWN_LIMIT {
            k.memory.clear();
        }
        k.memory.insert(id);
    });
    Ok(id)
}

/// A pack this process has just written (`pack-<name>`, synced) from
/// objects that checked out (a checkpoint's, or a merge's copies of
/// validated packs' entries): remember it as validated, so the next
/// check does not inflate and hash it all again. Its stamps are taken
/// now; a file changed after this is validated again.
pub(crate) fn trust_written_pack(repo: &Repository, name: &str) {
    let dir = repo.path().join("objects/pack");
    let index = format!("pack-{name}.idx");
    let idx = dir.join(&index);
    let (Some(si), Some(sp)) = (stamp(&idx), stamp(&idx.with_extension("pack"))) else {
        return;
    };
    let state = pack::open_index(&idx, &idx.with_extension("pack"))
        .map(Box::new)
        .map_err(refusal);
    with_known(repo, |k| {
        k.packs.insert(
            index,
            Pack {
                stamps: (si, sp),
                state,
                whole: true,
                // Until the database is installed again.
                listed: false,
            },
        );
    });
}

/// Validate every pack whole now (every entry, its checksum: see
/// [`pack::validate`]), e.g. before a repack reads them all, or for
/// `verify`.
pub(crate) fn check_packs(repo: &Repository) -> Result<(), ObjectError> {
    with_known(repo, |k| refresh_packs(repo, k, false, true))
}

/// The type and content of the loose object `id`, checked (see
/// [`check`]); None when it is not stored loose.
pub(crate) fn read_loose(
    repo: &Repository,
    id: Oid,
) -> Result<Option<(ObjectType, Vec<u8>)>, ObjectError> {
    load_loose(repo, id, true)
}

/// [`read_loose`], keeping the content only with `keep`.
fn load_loose(
    repo: &Repository,
    id: Oid,
    keep: bool,
) -> Result<Option<(ObjectType, Vec<u8>)>, ObjectError> {
    let hex = id.to_string();
    let path = repo.path().join("objects").join(&hex[..2]).join(&hex[2..]);
    let compressed = match super::fsx::open_read(&path) {
        Ok(f) => {
            let mut bytes = Vec::new();
            // Stored zlib blocks add 5 bytes per 64 KiB.
            let limit = MAX_OBJECT + MAX_OBJECT / 64 + 64;
            f.take(limit + 1)
                .read_to_end(&mut bytes)
                .map_err(|_| ObjectError::Unreadable(id))?;
            if bytes.len() as u64 > limit {
                return Err(ObjectError::Corrupt(id));
            }
            bytes
        }
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            with_known(repo, |k| {
                if k.elsewhere.len() >= KNOWN_LIMIT {
                    k.elsewhere.clear();
                }
                k.elsewhere.insert(id);
            });
            return Ok(None);
        }
        Err(_) => return Err(ObjectError::Unreadable(id)),
    };
    let (kind, content) = inflate_loose(&compressed, id, keep).ok_or(ObjectError::Corrupt(id))?;
    with_known(repo, |k| {
        if k.loose.len() >= KNOWN_LIMIT {
            k.loose.clear();
        }
        k.loose.insert(id);
    });
    Ok(Some((kind, content)))
}

/// Inflate a loose object's file: its type and (with `keep`) content, if
/// the stream is whole, ends with the file, matches its `<type> <size>\0`
/// header and hashes to `id`. Inflating stops at the first byte beyond
/// the declared size.
fn inflate_loose(compressed: &[u8], id: Oid, keep: bool) -> Option<(ObjectType, Vec<u8>)> {
    let mut pending = Vec::new();
    let mut header: Option<(ObjectType, u64)> = None;
    let mut content = Vec::new();
    let mut content_len = 0u64;
    let mut h = Sha1::new();
    let used = pack::inflate_stream(compressed, MAX_OBJECT + 32, |chunk| {
        h.update(chunk);
        let body: &[u8] = match header {
            Some(_) => chunk,
            None => {
                pending.extend_from_slice(chunk);
                match parse_header(&pending) {
                    None => return true,
                    Some(Err(())) => return false,
                    Some(Ok((kind, size, start))) => {
                        header = Some((kind, size));
                        &pending[start..]
                    }
                }
            }
        };
        content_len += body.len() as u64;
        if header.is_some_and(|(_, size)| content_len > size) {
            return false;
        }
        if keep {
            content.extend_from_slice(body);
        }
        true
    })?;
    let (kind, size) = header?;
    if used != compressed.len() || content_len != size || h.finalize()[..] != *id.as_bytes() {
        return None;
    }
    Some((kind, content))
}

/// The `<type> <size>\0` header at the start of `raw`: None while it may
/// still be incomplete, an error if it cannot be one.
#[allow(clippy::type_complexity)]
fn parse_header(raw: &[u8]) -> Option<Result<(ObjectType, u64, usize), ()>> {
    let Some(nul) = raw.iter().take(32).position(|&b| b == 0) else {
        return (raw.len() >= 32).then_some(Err(()));
    };
    let parsed = std::str::from_utf8(&raw[..nul]).ok().and_then(|h| {
        let (kind, size) = h.split_once(' ')?;
        let kind = match kind {
            "commit" => ObjectType::Commit,
            "tree" => ObjectType::Tree,
            "blob" => ObjectType::Blob,
            "tag" => ObjectType::Tag,
            _ => return None,
        };
        if size.is_empty() || (size.len() > 1 && size.starts_with('0')) {
            return None;
        }
        let size: u64 = size.parse().ok()?;
        (size <= MAX_OBJECT).then_some((kind, size, nul + 1))
    });
    Some(parsed.ok_or(()))
}

/// [`Repository::find_commit`], checked first.
pub(crate) fn find_commit(repo: &Repository, id: Oid) -> Result<Commit<'_>, ObjectError> {
    check(repo, id)?;
    repo.find_commit(id)
        .map_err(|_| ObjectError::Unreadable(id))
}

/// [`Repository::find_tree`], checked first.
pub(crate) fn find_tree(repo: &Repository, id: Oid) -> Result<Tree<'_>, ObjectError> {
    check(repo, id)?;
    repo.find_tree(id).map_err(|_| ObjectError::Unreadable(id))
}

/// [`Repository::find_blob`], checked first.
pub(crate) fn find_blob(repo: &Repository, id: Oid) -> Result<Blob<'_>, ObjectError> {
    check(repo, id)?;
    repo.find_blob(id).map_err(|_| ObjectError::Unreadable(id))
}

/// The object `id` as a pack holds it, read by memvault itself (see
/// [`PackIndex::read_object`]: each entry checked as [`check`] checks it,
/// deltas applied, the object hashed against its id): one read, where
/// [`check`] and then libgit2 (hashing again with its slower
/// collision-detecting SHA-1) read it twice. None if it is in memory (the
/// log's, which libgit2 reads first) or in no pack (loose).
fn read_packed(repo: &Repository, id: Oid) -> Result<Option<pack::Made>, ObjectError> {
    with_known(repo, |k| {
        if k.memory.contains(&id) {
            return Ok(None);
        }
        look(repo, k)?;
        for (name, p) in &mut k.packs {
            let Ok(index) = &mut p.state else { continue };
            let read = index.read_object(id);
            if let Some(read) = refuse_on_error(name, p, read)? {
                return Ok(Some(read));
            }
        }
        Ok(None)
    })
}

/// The content of the blob `id`: from its pack by [`read_packed`], else
/// [`check`]ed and read through libgit2.
pub(crate) fn blob_content(repo: &Repository, id: Oid) -> Result<Vec<u8>, ObjectError> {
    match read_packed(repo, id)? {
        Some((ObjectType::Blob, data)) => {
            Ok(std::sync::Arc::try_unwrap(data).unwrap_or_else(|d| d.to_vec()))
        }
        Some(_) => Err(ObjectError::Unreadable(id)),
        None => Ok(find_blob(repo, id)?.content().to_vec()),
    }
}

/// One tree entry: its name, git's normalised mode and its id.
pub(crate) type TreeRow = (Arc<[u8]>, i32, Oid);

/// The entries of the tree `id` (name, git's normalised mode, id), from
/// its pack by [`read_packed`], else [`check`]ed and read through libgit2.
pub(crate) fn tree_entries(repo: &Repository, id: Oid) -> Result<Vec<TreeRow>, ObjectError> {
    match read_packed(repo, id)? {
        Some((ObjectType::Tree, data)) => parse_tree(&data).ok_or(ObjectError::Corrupt(id)),
        Some(_) => Err(ObjectError::Unreadable(id)),
        None => Ok(find_tree(repo, id)?
            .iter()
            .map(|e| (Arc::from(e.name_bytes()), e.filemode(), e.id()))
            .collect()),
    }
}

/// A tree's entries as libgit2 parses them (`<octal mode> <name>\0<20-byte
/// id>`, the mode normalised as `git_tree_entry_filemode` does); None if
/// the bytes are not a tree libgit2 would read.
fn parse_tree(mut data: &[u8]) -> Option<Vec<TreeRow>> {
    let mut out = Vec::new();
    while !data.is_empty() {
        let space = data.iter().position(|&b| b == b' ')?;
        let (digits, rest) = (&data[..space], &data[space + 1..]);
        // Octal digits only (libgit2 also takes a sign, which neither git
        // nor memvault writes: refused here), at most 16 bits of value.
        if digits.is_empty() {
            return None;
        }
        let mut mode = 0i32;
        for &d in digits {
            if !(b'0'..=b'7').contains(&d) {
                return None;
            }
            mode = mode * 8 + i32::from(d - b'0');
            if mode > 0xffff {
                return None;
            }
        }
        let nul = rest.iter().position(|&b| b == 0)?;
        if nul == 0 || nul > 0xffff {
            return None;
        }
        let name = Arc::from(&rest[..nul]);
        let id = rest.get(nul + 1..nul + 21)?;
        out.push((name, normalise_mode(mode), Oid::from_bytes(id).ok()?));
        data = &rest[nul + 21..];
    }
    Some(out)
}

/// libgit2's `normalize_filemode`.
fn normalise_mode(mode: i32) -> i32 {
    const TREE: i32 = 0o040000;
    const COMMIT: i32 = 0o160000;
    const LINK: i32 = 0o120000;
    match mode & 0o170000 {
        TREE => TREE,
        _ if mode & 0o100 != 0 => 0o100755,
        COMMIT => COMMIT,
        LINK => LINK,
        _ => 0o100644,
    }
}

/// [`git2::Odb::read`], checked first.
pub(crate) fn read<'o>(
    odb: &'o git2::Odb<'_>,
    repo: &Repository,
    id: Oid,
) -> Result<OdbObject<'o>, ObjectError> {
    check(repo, id)?;
    odb.read(id).map_err(|_| ObjectError::Unreadable(id))
}

/// [`git2::Odb::read_header`] (size and type), checked first.
pub(crate) fn read_header(
    odb: &git2::Odb<'_>,
    repo: &Repository,
    id: Oid,
) -> Result<(usize, ObjectType), ObjectError> {
    check(repo, id)?;
    odb.read_header(id).map_err(|_| ObjectError::Unreadable(id))
}

/// Check the tree `id` and every tree below it: libgit2's tree diff
/// descends into every subtree of both sides, changed or not (blobs it
/// does not read). A tree found whole with all below it is remembered
/// like the ids that checked out.
pub(crate) fn check_tree_deep(repo: &Repository, id: Oid) -> Result<(), ObjectError> {
    check(repo, id)?;
    if with_known(repo, |k| k.deep.contains(&id)) {
        return Ok(());
    }
    let subtrees: Vec<Oid> = repo
        .find_tree(id)
        .map_err(|_| ObjectError::Unreadable(id))?
        .iter()
        .filter(|e| e.kind() == Some(ObjectType::Tree))
        .map(|e| e.id())
        .collect();
    for sub in subtrees {
        check_tree_deep(repo, sub)?;
    }
    with_known(repo, |k| {
        if k.deep.len() >= KNOWN_LIMIT {
            k.deep.clear();
        }
        k.deep.insert(id);
    });
    Ok(())
}

/// Check the trees on `git_path` below the tree `root`: those libgit2
/// reads for `Tree::get_path` and for a tree update at that path.
pub(crate) fn check_path(repo: &Repository, root: Oid, git_path: &str) -> Result<(), ObjectError> {
    let mut tree = find_tree(repo, root)?;
    for name in git_path.split('/') {
        let next = match tree.get_name(name) {
            Some(e) if e.kind() == Some(ObjectType::Tree) => e.id(),
            _ => return Ok(()),
        };
        tree = find_tree(repo, next)?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Write;

    fn loose_bytes(header: &str, content: &[u8]) -> Vec<u8> {
        let mut z = flate2::write::ZlibEncoder::new(Vec::new(), flate2::Compression::default());
        z.write_all(header.as_bytes()).unwrap();
        z.write_all(content).unwrap();
        z.finish().unwrap()
    }

    #[test]
    fn trees_parse_as_libgit2_parses_them() {
        let tmp = tempfile::tempdir().unwrap();
        let repo = Repository::init_bare(tmp.path()).unwrap();
        let odb = repo.odb().unwrap();
        let id = [7u8; 20];
        let entry = |mode: &str, name: &[u8]| {
            let mut e = format!("{mode} ").into_bytes();
            e.extend_from_slice(name);
            e.push(0);
            e.extend_from_slice(&id);
            e
        };
        let mut cases: Vec<Vec<u8>> = vec![Vec::new()];
        for mode in [
            "100644", "100755", "100664", "100744", "100654", "40000", "040000", "40755", "120000",
            "160000", "0", "7", "177777", "200000", "1000000", "10064x", "", " 100644", "-1", "8",
        ] {
            cases.push(entry(mode, b"name"));
        }
        let two = [entry("100644", b"a"), entry("40000", b"b")].concat();
        cases.push(two.clone());
        cases.push(entry("100644", b""));
        cases.push(entry("100644", "é\u{1}/.".as_bytes()));
        cases.push(entry("100644", &[b'n'; 0xffff]));
        cases.push(entry("100644", &[b'n'; 0x10000]));
        cases.push(two[..two.len() - 1].to_vec());
        cases.push(b"100644 name".to_vec());
        cases.push(b"100644".to_vec());
        for raw in cases {
            let expected = odb
                .write(ObjectType::Tree, &raw)
                .ok()
                .and_then(|id| repo.find_tree(id).ok())
                .map(|t| {
                    t.iter()
                        .map(|e| (Arc::from(e.name_bytes()), e.filemode(), e.id()))
                        .collect::<Vec<_>>()
                });
            assert_eq!(
                parse_tree(&raw),
                expected,
                "{}",
                String::from_utf8_lossy(&raw)
            );
        }
    }

    #[test]
    fn a_loose_object_checks_out_only_whole_and_under_its_own_id() {
        let content = b"hello\n".repeat(1000);
        let id = Oid::hash_object(ObjectType::Blob, &content).unwrap();
        let good = loose_bytes(&format!("blob {}\0", content.len()), &content);
        assert_eq!(
            inflate_loose(&good, id, true),
            Some((ObjectType::Blob, content.clone()))
        );
        // Cut short anywhere.
        for cut in [1, good.len() / 2, good.len() - 1] {
            assert_eq!(inflate_loose(&good[..cut], id, true), None, "cut at {cut}");
        }
        // Trailing bytes, another id, a header that lies about the size or
        // the type.
        let mut trailing = good.clone();
        trailing.push(0);
        assert_eq!(inflate_loose(&trailing, id, true), None);
        assert_eq!(inflate_loose(&good, Oid::ZERO_SHA1, true), None);
        let short = loose_bytes(&format!("blob {}\0", content.len() - 1), &content);
        assert_eq!(inflate_loose(&short, id, true), None);
        let long = loose_bytes(&format!("blob {}\0", content.len() + 1), &content);
        assert_eq!(inflate_loose(&long, id, true), None);
        let kind = loose_bytes(&format!("tree {}\0", content.len()), &content);
        assert_eq!(inflate_loose(&kind, id, true), None);
        assert_eq!(
            inflate_loose(&loose_bytes("blob 01\0", b"x"), id, true),
            None
        );
        assert_eq!(
            inflate_loose(&loose_bytes(&"x".repeat(64), b""), id, true),
            None
        );
        assert_eq!(inflate_loose(b"", id, true), None);
    }

    #[test]
    fn an_object_longer_than_it_declares_stops_at_the_first_byte_beyond() {
        // 64 MiB of zeros deflate to about 64 KiB: inflating stops after
        // the declared 10 bytes, not at the end of the stream.
        let zeros = vec![0u8; 64 << 20];
        let bomb = loose_bytes("blob 10\0", &zeros);
        let start = std::time::Instant::now();
        assert_eq!(inflate_loose(&bomb, Oid::ZERO_SHA1, false), None);
        assert!(start.elapsed() < std::time::Duration::from_secs(2));
        // Declared one byte short, over several pieces of output.
        let content = vec![3u8; 300_000];
        let id = Oid::hash_object(ObjectType::Blob, &content).unwrap();
        let short = loose_bytes(&format!("blob {}\0", content.len() - 1), &content);
        assert_eq!(inflate_loose(&short, id, false), None);
        let good = loose_bytes(&format!("blob {}\0", content.len()), &content);
        assert_eq!(
            inflate_loose(&good, id, false),
            Some((ObjectType::Blob, Vec::new()))
        );
    }

    #[test]
    fn an_object_claiming_more_than_the_limit_is_refused_before_inflating_it() {
        let claim = loose_bytes(&format!("blob {}\0", MAX_OBJECT + 1), b"x");
        assert_eq!(inflate_loose(&claim, Oid::ZERO_SHA1, true), None);
    }
}
