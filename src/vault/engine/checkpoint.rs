//! The checkpoint: everything the write-ahead log holds made durable in
//! git (one synced pack or a few synced loose objects, synced ref files),
//! then the log started over. Runs under the writer lock.

use std::fs;
use std::path::Path;

use git2::{ErrorCode, Oid, Repository};

use super::fsx::{self, write_durable};
use super::wal::{self, Refs, Wal};
use super::{KEYS_REF, MAIN_REF};
use super::{fsync, gc, raw};
use crate::vault::error::VaultError;

/// The checkpoint (the caller holds the writer lock): write every object
/// of the log into one synced pack, set the refs to the log's tail, sync
/// them, then reset the log to a head naming them.
///
/// Which tail: a ref on disk that does not read, names a missing object, or
/// names an older target from the log (a writer died before moving it) is
/// set to the log's tail. A ref moved back outside memvault to a state
/// the log's tail is newer than (main: an ancestor of the tail; the key
/// state: a lower counter) is refused as rolled back, and nothing
/// changes: building on it would drop acknowledged writes from history.
/// A ref that is gone or names anything else the log never wrote was
/// changed outside memvault and is kept as it is (the MAC checks judge
/// it).
pub(crate) fn checkpoint_locked(repo: &Repository, wal: &mut Wal) -> Result<(), VaultError> {
    // Under the writer lock no live memvault writer holds a ref lock: one
    // left behind belongs to a writer killed while moving a ref.
    for name in [MAIN_REF, KEYS_REF, "packed-refs"] {
        let _ = fs::remove_file(repo.path().join(format!("{name}.lock")));
    }
    let contents = wal.contents_for_checkpoint()?;
    // Format 7: shards logged alone must be in a key state before the log
    // forgets them (`Vault::checkpoint_locked` logs one first).
    if !contents.pending_keys().is_empty() {
        return Err(VaultError::Damaged(
            "the log holds key-table shards no key state holds yet; nothing was changed",
        ));
    }
    let target = targets(repo, &contents)?;
    let superseded = wal::superseded_keys(&contents.records);
    let objects: Vec<&raw::Object> = contents
        .records
        .iter()
        .flat_map(|r| r.objects.iter())
        .filter(|o| !superseded.contains(&o.id))
        .collect();
    // Objects of tagged records were hashed when logged: not hashed again.
    wal::write_durable_objects(repo, &objects, contents.tagged)?;
    // Every record the refs are about to name is on disk first: a record
    // appended but not yet synced (another thread's, waiting for its group
    // sync) or the fold of the key records (format 7) could otherwise be
    // lost to a power cut after the ref files name what they made, and
    // the log replayed without them would disagree with those refs.
    wal.sync()?;
    // libgit2 makes a ref's missing folders, up to the repository's own:
    // a vault moved away while open here (a server's tenant removed, its
    // directory renamed to be erased) would be made again at its old
    // place, as a few ref files. Its folder of refs must still be there.
    fsx::check_real_dir(&repo.path().join("refs"))?;
    for (name, id) in &target {
        if repo.refname_to_id(name).ok() != Some(*id)
            && repo.reference(name, *id, true, "memvault recover").is_err()
        {
            // An unreadable ref file (cut short by a crash): replace it.
            write_durable(&repo.path().join(name), format!("{id}\n").as_bytes())?;
        }
        let file = repo.path().join(name);
        if file.exists() {
            // libgit2 wrote it with the umask's mode.
            fsx::make_private(&file)?;
            fsync::sync_path(&file)?;
        }
        if let Some(parent) = file.parent() {
            fsync::sync_path(parent)?;
        }
    }
    let packed = repo.path().join("packed-refs");
    if packed.exists() {
        fsync::sync_path(&packed)?;
    }
    wal.reset(target)?;
    // Everything is on disk now: drop the in-memory copies.
    wal::install_odb(repo)?;
    // A few packs at most: merge the small ones (a full repack with delta
    // search and pruning is `memvault gc`'s, never a mutation's).
    gc::merge_small_packs(repo)?;
    Ok(())
}

/// Refuse a checkpoint over refs moved back (or sideways) outside
/// memvault, changing nothing (the caller holds the writer lock): the
/// same judgement the checkpoint makes first.
pub(crate) fn judge_refs(repo: &Repository, wal: &Wal) -> Result<(), VaultError> {
    // Read aside: what this handle knows of the log (the records whose
    // objects it loaded, those it holds for a checkpoint) stays as it is.
    let contents = wal.peek_all()?;
    targets(repo, &contents).map(|_| ())
}

/// What the checkpoint sets each ref to (see [`checkpoint_locked`]).
fn targets(repo: &Repository, contents: &wal::Contents) -> Result<Refs, VaultError> {
    let tail = contents.tail();
    let odb = repo.odb()?;
    let mut target: Refs = Vec::new();
    for name in [MAIN_REF, KEYS_REF] {
        // A ref file that exists but does not read was cut short by a
        // crash; a ref that is gone was deleted on purpose.
        let disk = match repo.refname_to_id(name) {
            Ok(id) => Some(id),
            Err(e) if e.code() == ErrorCode::NotFound => None,
            Err(_) => Some(Oid::ZERO_SHA1),
        };
        let logged = tail.iter().find(|(n, _)| n == name).map(|(_, id)| *id);
        let earlier = |id: Oid| {
            contents
                .head
                .iter()
                .flat_map(|h| h.refs.iter())
                .chain(contents.records.iter().flat_map(|r| r.refs.iter()))
                .any(|(n, v)| n == name && *v == id)
        };
        // How a person puts the ref back: the last checkpoint's target is
        // in git (the log's newest may be in the log alone, and git
        // refuses a ref to an object it does not hold); memvault then
        // moves the ref on to the log's newest itself.
        let put_back = |l: Oid| match contents
            .head
            .iter()
            .flat_map(|h| h.refs.iter())
            .find(|(n, _)| n == name)
        {
            Some((_, h)) => format!(
                "the log's newest {name} is {l}; put the ref back with `git update-ref {name} {h}` in the vault directory (the last checkpoint's; memvault moves it on)"
            ),
            None => format!(
                "the log's newest {name} is {l}; put the ref back by writing that id into the file {name} in the vault directory"
            ),
        };
        let t = match (disk, logged) {
            (Some(d), Some(l)) if d == l || earlier(d) || !odb.exists(d) => Some(l),
            // A rollback under the log: building on the old ref would
            // drop acknowledged writes (their file keys, for the key
            // state) from history. Refused; the log keeps them.
            (Some(d), Some(l)) if behind(repo, name, d, l) => {
                return Err(VaultError::RolledBack(format!(
                    "{}; {}",
                    match name {
                        KEYS_REF => ROLLED_BACK_KEYS,
                        _ => ROLLED_BACK_MAIN,
                    },
                    put_back(l)
                )));
            }
            // Set outside memvault to something that does not hold the
            // log's target while the log holds records since the last
            // checkpoint: building on it would drop those acknowledged
            // writes (for the key state, their file keys). Refused like a
            // rollback. With no record pending, nothing is lost: the ref
            // is kept and the MAC checks judge it.
            (Some(d), Some(l)) if !contents.records.is_empty() && !keeps(repo, d, l) => {
                return Err(VaultError::RolledBack(format!(
                    "{} was set outside memvault to a state that lacks the newest one in the log (memvault/wal), which is kept; {}",
                    match name {
                        KEYS_REF => "the key state (refs/memvault/keys)",
                        _ => "main (refs/heads/main)",
                    },
                    put_back(l)
                )));
            }
            // Main gone while the log names it: taking it as gone would
            // leave every acknowledged change out of main (those the log
            // holds since the checkpoint for good). Refused until put
            // back; main never goes away in memvault's own hands.
            (None, Some(l)) if name == MAIN_REF => {
                return Err(VaultError::RolledBack(format!(
                    "main (refs/heads/main) was removed outside memvault; {}",
                    put_back(l)
                )));
            }
            (d, _) => d,
        };
        if let Some(t) = t.filter(|t| !t.is_zero()) {
            target.push((name.to_string(), t));
        }
    }
    Ok(target)
}

const ROLLED_BACK_MAIN: &str = "rollback: main (refs/heads/main) was moved back outside \
     memvault, below the newest commit in the log (memvault/wal), which is kept";
const ROLLED_BACK_KEYS: &str = "rollback: the key state (refs/memvault/keys) was rolled back \
     outside memvault, below the newest one in the log (memvault/wal), which is kept";

/// At most this many commits are read to find that a ref was moved back.
const BEHIND_WALK: usize = 1 << 18;

/// Whether the ref `name`'s file, naming `disk`, is behind the log's
/// `logged` target: for main, `disk` is an ancestor of `logged` (a walk
/// that never goes below `disk`'s date, as each commit is dated after
/// its parents); for the key state, `disk` has a lower counter. Every
/// commit is checked before it is read; anything unreadable is `false`
/// (the ref is then kept and judged by the MAC checks).
fn behind(repo: &Repository, name: &str, disk: Oid, logged: Oid) -> bool {
    use super::objects::find_commit;
    let Ok(d) = find_commit(repo, disk) else {
        return false;
    };
    if name == KEYS_REF {
        // `disk` is checked above; `logged` is checked here.
        let counter = |id: Oid| {
            crate::vault::keys::read_header(repo, id)
                .ok()
                .map(|(_, counter)| counter)
        };
        let logged_counter = find_commit(repo, logged).ok().and_then(|_| counter(logged));
        return matches!((counter(disk), logged_counter), (Some(d), Some(l)) if d < l);
    }
    reaches(repo, logged, disk, d.time().seconds())
}

/// Whether `ancestor` (dated `floor`) is `tip` or one of its ancestors:
/// a walk from `tip` that never goes below `floor` (each commit is dated
/// after its parents), every commit checked before it is read, at most
/// [`BEHIND_WALK`] of them; anything unreadable ends that path.
fn reaches(repo: &Repository, tip: Oid, ancestor: Oid, floor: i64) -> bool {
    use super::objects::find_commit;
    let mut seen = std::collections::HashSet::new();
    let mut todo = vec![tip];
    while let Some(id) = todo.pop() {
        if id == ancestor {
            return true;
        }
        if !seen.insert(id) || seen.len() > BEHIND_WALK {
            continue;
        }
        let Ok(c) = find_commit(repo, id) else {
            continue;
        };
        if c.time().seconds() > floor {
            todo.extend(c.parent_ids());
        }
    }
    false
}

/// Whether the ref file naming `disk` still holds everything the log's
/// `logged` target holds: `logged` is `disk` or one of its ancestors
/// (main and the key state both chain their commits by parent).
fn keeps(repo: &Repository, disk: Oid, logged: Oid) -> bool {
    let Ok(l) = super::objects::find_commit(repo, logged) else {
        return false;
    };
    reaches(repo, disk, logged, l.time().seconds())
}

/// fsync every file and directory below `dir` (a new vault, before it is
/// moved into place).
pub(crate) fn sync_tree(dir: &Path) -> std::io::Result<()> {
    for e in fs::read_dir(dir)? {
        let e = e?;
        if e.file_type()?.is_dir() {
            sync_tree(&e.path())?;
        } else {
            fsync::sync_path(&e.path())?;
        }
    }
    fsync::sync_path(dir)
}
