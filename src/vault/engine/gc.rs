//! Maintenance (`memvault gc`): fold every pack and loose object into one
//! pack of what `refs/heads/main` and `refs/memvault/keys` reach, and
//! delete the rest.
//!
//! What it promises: nothing reachable from those two refs is removed (the
//! new pack is synced before anything is deleted); unreachable objects,
//! such as earlier versions of the key table, are gone afterwards, which
//! is what makes erasing a file key final. It runs under the writer lock,
//! after a checkpoint, so the log holds nothing it could miss.
//!
//! Limitations: the whole history is repacked each time (time and memory
//! grow with the repository); readers in other processes holding an old
//! pack open keep reading it until they refresh.

use std::collections::{HashMap, HashSet};
use std::fs;

use git2::{Oid, Repository};

use super::{KEYS_REF, MAIN_REF};
use super::{fsx, fsync, objects, raw, wal};
use crate::vault::error::VaultError;

/// What a garbage collection did.
#[derive(Debug, Clone, Default)]
pub struct GcReport {
    /// Objects in the new pack.
    pub objects: usize,
    /// Pack files and loose objects removed.
    pub removed_files: usize,
    /// Bytes in `objects/` before and after.
    pub bytes_before: u64,
    pub bytes_after: u64,
}

/// A checkpoint that leaves more packs than this merges the smaller ones
/// (see [`merge_small_packs`]).
pub(crate) const AUTO_MERGE_PACKS: usize = 8;

/// The packs in the repository: file stem (`pack-<hex>`) and size, with
/// an index beside them, largest first.
fn packs(repo: &Repository) -> Vec<(String, u64)> {
    let dir = repo.path().join("objects/pack");
    let mut out: Vec<(String, u64)> = fs::read_dir(&dir)
        .map(|d| {
            d.filter_map(Result::ok)
                .filter_map(|e| {
                    let name = e.file_name().to_string_lossy().into_owned();
                    let stem = name.strip_suffix(".pack")?.to_string();
                    if !dir.join(format!("{stem}.idx")).exists() {
                        return None;
                    }
                    Some((stem, e.metadata().ok()?.len()))
                })
                .collect()
        })
        .unwrap_or_default();
    out.sort_by(|a, b| b.1.cmp(&a.1).then_with(|| a.0.cmp(&b.0)));
    out
}

/// Which of `sizes` (largest first) to merge: the smallest ones, rolled up
/// while the next larger pack is less than twice what is gathered, so the
/// packs that stay form a geometric progression and each byte is rewritten
/// a logarithmic number of times. At least enough to get back under
/// `limit`. Returns the index of the first pack to merge.
fn merge_from(sizes: &[u64], limit: usize) -> usize {
    let n = sizes.len();
    if n <= limit {
        return n;
    }
    let mut i = n - 1;
    let mut gathered = sizes[i];
    while i > 0 && sizes[i - 1] < gathered.saturating_mul(2) {
        i -= 1;
        gathered += sizes[i];
    }
    i.min(limit - 1)
}

/// Packs larger than this are never merged by a checkpoint (only `gc`
/// rewrites them): a mutation's worst case stays bounded however large
/// the repository grows.
pub(crate) const AUTO_MERGE_MAX_BYTES: u64 = 32 << 20;

/// [`merge_from`] over the packs a checkpoint may merge (those up to
/// [`AUTO_MERGE_MAX_BYTES`], which come last in `sizes`, largest first),
/// with the large ones counted against [`AUTO_MERGE_PACKS`].
fn auto_merge_from(sizes: &[u64]) -> usize {
    let large = sizes
        .iter()
        .take_while(|s| **s > AUTO_MERGE_MAX_BYTES)
        .count();
    let limit = AUTO_MERGE_PACKS.saturating_sub(large).max(1);
    large + merge_from(&sizes[large..], limit)
}

/// Keep reads fast without a full repack: merge the smaller packs into one
/// (no delta search) when there are more than [`AUTO_MERGE_PACKS`], never
/// touching a pack over [`AUTO_MERGE_MAX_BYTES`]. Run
/// at checkpoints, under the writer lock; the new pack is synced before
/// the old ones are deleted. Everything in the merged packs is kept
/// (pruning is `gc`'s job).
pub(crate) fn merge_small_packs(repo: &Repository) -> Result<usize, VaultError> {
    let packs = packs(repo);
    let sizes: Vec<u64> = packs.iter().map(|p| p.1).collect();
    let from = auto_merge_from(&sizes);
    if packs.len() - from < 2 {
        return Ok(0);
    }
    let pack_dir = repo.path().join("objects/pack");
    // Never merge from, write into or delete in a folder a link points to.
    fsx::check_real_dir(&pack_dir)?;
    // The packs merged are validated whole before their entries are
    // copied as they stand (a 40 MB pack that is not merged was validated
    // too, at 300 ms in the middle of a write); the others are read
    // through libgit2 only, every object checked as it is read.
    let stems: Vec<&str> = packs[from..].iter().map(|(s, _)| s.as_str()).collect();
    objects::check_packs_named(repo, &stems)?;
    let odb = repo.odb()?;
    let files = packs[from..]
        .iter()
        .map(|(stem, _)| super::pack::PackFile::open(&pack_dir, stem))
        .collect::<Result<Vec<_>, _>>()?;
    // Whole objects are copied as they stand (no inflate, no deflate), and
    // so are offset deltas whose base is copied before them (re-pointed);
    // other deltas (from an earlier gc) are resolved and written whole.
    // An id in more than one pack is copied from a whole entry that
    // checks out against it: a copy that does not (a damaged or planted
    // pack) must not push out the good one, which the merge deletes.
    let mut seen_in = HashMap::new();
    for f in &files {
        for id in f.ids() {
            *seen_in.entry(id).or_insert(0u32) += 1;
        }
    }
    let mut resolved = Vec::new();
    let mut entries = Vec::new();
    let mut copied = HashSet::new();
    let mut unchecked = Vec::new();
    for f in &files {
        for e in f.entries() {
            match e {
                super::pack::Read::Whole { id, crc, bytes } => {
                    if seen_in.get(&id).is_some_and(|&n| n > 1) {
                        if copied.contains(&id) {
                            continue;
                        }
                        if !super::pack::whole_entry_holds(id, bytes) {
                            // Kept only if no copy checks out (below).
                            unchecked.push(super::pack::Entry::Raw { id, crc, bytes });
                            continue;
                        }
                    }
                    copied.insert(id);
                    entries.push(super::pack::Entry::Raw { id, crc, bytes })
                }
                super::pack::Read::OfsDelta {
                    id,
                    base,
                    size,
                    zdata,
                } if copied.contains(&base) => {
                    copied.insert(id);
                    entries.push(super::pack::Entry::RawOfsDelta {
                        id,
                        base,
                        size,
                        zdata,
                    })
                }
                super::pack::Read::OfsDelta { id, .. } | super::pack::Read::Delta(id) => {
                    let o = objects::read(&odb, repo, id)?;
                    resolved.push(raw::Object {
                        kind: o.kind(),
                        id,
                        data: o.data().to_vec(),
                    });
                }
            }
        }
    }
    entries.extend(resolved.iter().map(super::pack::Entry::Object));
    // Every copy of these failed its check: keep one as it stands (reads
    // of it fail their hash check, as they did before the merge).
    entries.extend(unchecked);
    let name = super::pack::write_entries(&pack_dir, &entries, &Default::default())?;
    fsync::sync_path(&pack_dir)?;
    // Copies of validated packs' entries (duplicates checked above).
    objects::trust_written_pack(repo, &name);
    let keep = format!("pack-{name}");
    for (stem, _) in &packs[from..] {
        if *stem != keep {
            // The index first: a reader that lists packs then finds none.
            let _ = fs::remove_file(pack_dir.join(format!("{stem}.idx")));
            let _ = fs::remove_file(pack_dir.join(format!("{stem}.pack")));
        }
    }
    fsync::sync_path(&pack_dir)?;
    wal::install_odb(repo)?;
    Ok(packs.len() - from)
}

/// The bytes of every file below `dir` (links counted as themselves).
pub(crate) fn dir_bytes(dir: &std::path::Path) -> u64 {
    let mut total = 0;
    if let Ok(rd) = fs::read_dir(dir) {
        for e in rd.filter_map(Result::ok) {
            match e.file_type() {
                Ok(t) if t.is_dir() => total += dir_bytes(&e.path()),
                Ok(_) => total += e.metadata().map(|m| m.len()).unwrap_or(0),
                Err(_) => {}
            }
        }
    }
    total
}

/// Insert a tree and everything below it not inserted yet, each under
/// its path.
fn insert_tree(
    repo: &Repository,
    pb: &mut git2::PackBuilder<'_>,
    seen: &mut HashSet<Oid>,
    id: Oid,
    path: &str,
) -> Result<(), VaultError> {
    if !seen.insert(id) {
        return Ok(());
    }
    // The pack builder reads every object it is given: each is checked.
    let tree = objects::find_tree(repo, id)?;
    pb.insert_object(id, Some(path))?;
    for e in tree.iter() {
        let Ok(name) = e.name() else { continue };
        let child = if path.is_empty() {
            name.to_string()
        } else {
            format!("{path}/{name}")
        };
        match e.kind() {
            Some(git2::ObjectType::Tree) => insert_tree(repo, pb, seen, e.id(), &child)?,
            Some(git2::ObjectType::Blob) if seen.insert(e.id()) => {
                objects::check(repo, e.id())?;
                pb.insert_object(e.id(), Some(&child))?
            }
            _ => {}
        }
    }
    Ok(())
}

/// Delete what an interrupted write left in the object store (the caller
/// holds the writer lock, so no write of this vault is under way): the
/// temporary files of a checkpoint's pack or loose object
/// (`tmp_mv_*`), libgit2's of a `gc` (`pack_git2_*`, `*.lock`), and a
/// pack without its index or an index without its pack. git reads none
/// of them, but they hold whole objects: old key states, with keyslots
/// since removed and file keys since destroyed. Also the file count's
/// temporary files. Returns how many.
pub(crate) fn remove_leftovers(objects_dir: &std::path::Path) -> std::io::Result<usize> {
    let mut removed = 0;
    let mut remove = |path: &std::path::Path| -> std::io::Result<()> {
        match fs::remove_file(path) {
            Ok(()) => {
                removed += 1;
                Ok(())
            }
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
            Err(e) => Err(e),
        }
    };
    let pack_dir = objects_dir.join("pack");
    if let Ok(rd) = fs::read_dir(&pack_dir) {
        for e in rd.filter_map(Result::ok) {
            // Neither followed nor descended into (`file_type` does not
            // follow a link).
            if e.file_type().is_ok_and(|t| t.is_dir()) {
                continue;
            }
            let n = e.file_name().to_string_lossy().into_owned();
            let orphan = |own: &str, other: &str| {
                n.strip_suffix(own)
                    .is_some_and(|stem| !pack_dir.join(format!("{stem}{other}")).exists())
            };
            let leftover = n.starts_with("tmp_")
                || n.starts_with("pack_git2_")
                || n.ends_with(".lock")
                || (n.starts_with("pack-") && (orphan(".pack", ".idx") || orphan(".idx", ".pack")));
            if leftover {
                remove(&e.path())?;
            }
        }
    }
    for d in fs::read_dir(objects_dir)?.filter_map(Result::ok) {
        let n = d.file_name().to_string_lossy().into_owned();
        let real_dir = d.file_type().is_ok_and(|t| t.is_dir());
        if real_dir && n.len() == 2 && n.bytes().all(|b| b.is_ascii_hexdigit()) {
            for f in fs::read_dir(d.path())?.filter_map(Result::ok) {
                if f.file_name().to_string_lossy().starts_with("tmp_") {
                    remove(&f.path())?;
                }
            }
        }
    }
    // And the file count's temporary files a process killed while it
    // wrote one left (`memvault/file-count.<pid>.tmp`: no content, but
    // one per kill). One being written now only goes unsaved.
    if let Some(state) = objects_dir.parent().map(|d| d.join("memvault"))
        && let Ok(rd) = fs::read_dir(&state)
    {
        for e in rd.filter_map(Result::ok) {
            let n = e.file_name().to_string_lossy().into_owned();
            let file = e.file_type().is_ok_and(|t| t.is_file());
            if file && n.starts_with("file-count.") && n.ends_with(".tmp") {
                remove(&e.path())?;
            }
        }
    }
    Ok(removed)
}

/// The repack (the caller holds the writer lock and has checkpointed).
pub(crate) fn repack_locked(repo: &Repository) -> Result<GcReport, VaultError> {
    let objects_dir = repo.path().join("objects");
    let pack_dir = objects_dir.join("pack");
    fsx::check_real_dir(&objects_dir)?;
    fsx::mkdir_private(&pack_dir)?;
    let mut report = GcReport {
        bytes_before: dir_bytes(&objects_dir),
        ..Default::default()
    };
    let mut pb = repo.packbuilder()?;
    pb.set_threads(1);
    // Objects go in with their paths, newest commits first, as git does:
    // the delta search groups objects by path, so each directory's trees
    // are compared with that directory's earlier versions (libgit2's own
    // walk names no tree, and found almost no tree deltas).
    objects::check_packs(repo)?;
    let mut seen = HashSet::new();
    // Main newest first (every parent, in case it is not linear), then
    // the key state; each commit checked before libgit2 reads it.
    let mut commits: Vec<Oid> = Vec::new();
    let mut stack: Vec<Oid> = repo.refname_to_id(MAIN_REF).into_iter().collect();
    let mut queued: HashSet<Oid> = stack.iter().copied().collect();
    while let Some(id) = stack.pop() {
        commits.push(id);
        for p in objects::find_commit(repo, id)?.parent_ids() {
            if queued.insert(p) {
                stack.push(p);
            }
        }
    }
    // The key state and the states it chains to (see `keys`: every one
    // of them holds only keys that still exist).
    let mut stack: Vec<Oid> = repo.refname_to_id(KEYS_REF).into_iter().collect();
    while let Some(id) = stack.pop() {
        if queued.insert(id) {
            commits.push(id);
            stack.extend(objects::find_commit(repo, id)?.parent_ids());
        }
    }
    for id in commits {
        if seen.insert(id) {
            let tree = objects::find_commit(repo, id)?.tree_id();
            pb.insert_object(id, None)?;
            insert_tree(repo, &mut pb, &mut seen, tree, "")?;
        }
    }
    report.objects = pb.object_count();
    // libgit2 takes the umask off this mode; it has no group or other
    // bits to begin with.
    pb.write(&pack_dir, fsx::OBJECT_MODE)?;
    let name = pb
        .name()?
        .ok_or_else(|| crate::vault::error::damaged("the new pack has no name"))?
        .to_string();
    let keep = format!("pack-{name}.");
    for ext in ["pack", "idx"] {
        fsync::sync_path(&pack_dir.join(format!("{keep}{ext}")))?;
    }
    fsync::sync_path(&pack_dir)?;
    // Only now delete: every other pack, what interrupted writes left,
    // then every loose object.
    for e in fs::read_dir(&pack_dir)?.filter_map(Result::ok) {
        let n = e.file_name().to_string_lossy().into_owned();
        if n.starts_with("pack-") && !n.starts_with(&keep) {
            fs::remove_file(e.path())?;
            report.removed_files += 1;
        }
    }
    report.removed_files += remove_leftovers(&objects_dir)?;
    for d in fs::read_dir(&objects_dir)?.filter_map(Result::ok) {
        let n = d.file_name().to_string_lossy().into_owned();
        // A link is not followed (`file_type` does not follow it).
        let real_dir = d.file_type().is_ok_and(|t| t.is_dir());
        if real_dir && n.len() == 2 && n.bytes().all(|b| b.is_ascii_hexdigit()) {
            for f in fs::read_dir(d.path())?.filter_map(Result::ok) {
                fs::remove_file(f.path())?;
                report.removed_files += 1;
            }
            let _ = fs::remove_dir(d.path());
        }
    }
    fsync::sync_path(&pack_dir)?;
    fsync::sync_path(&objects_dir)?;
    wal::install_odb(repo)?;
    report.bytes_after = dir_bytes(&objects_dir);
    Ok(report)
}

#[cfg(test)]
mod tests {
    use super::merge_from;

    /// A planted pack that claims a genuine object's id, and sorts first,
    /// does not push the genuine copy out when checkpoint packs merge: it
    /// fails its validation, so the merge refuses it as damage and
    /// deletes nothing.
    #[test]
    fn a_merge_refuses_a_planted_pack_and_deletes_nothing() {
        use super::super::pack::{Entry, write, write_entries};
        use super::super::raw::Object;
        use git2::{ObjectType, Oid, Repository};
        let tmp = tempfile::tempdir().unwrap();
        let repo = Repository::init_bare(tmp.path()).unwrap();
        let pack_dir = tmp.path().join("objects/pack");
        std::fs::create_dir_all(&pack_dir).unwrap();
        let blob = |data: Vec<u8>| Object {
            kind: ObjectType::Blob,
            id: Oid::hash_object(ObjectType::Blob, &data).unwrap(),
            data,
        };
        let genuine = blob(vec![7; 2000]);
        // Nine ordinary checkpoint packs, the genuine object in the last.
        for i in 0..9u8 {
            let other = blob(vec![i; 2000]);
            let mut objects = vec![&other];
            if i == 8 {
                objects.push(&genuine);
            }
            write(&pack_dir, &objects).unwrap();
        }
        // The planted pack: the genuine id over other bytes (a stored
        // zlib block of 2,000 other bytes), a little larger than the rest
        // so it comes first.
        let mut planted = vec![0x30 | (2000 & 0x0f) as u8 | 0x80, (2000 >> 4) as u8];
        let mut z = flate2::write::ZlibEncoder::new(Vec::new(), flate2::Compression::none());
        std::io::Write::write_all(&mut z, &[9; 2000]).unwrap();
        planted.extend(z.finish().unwrap());
        let padding = blob(vec![1; 9000]);
        let planted_name = write_entries(
            &pack_dir,
            &[
                Entry::Raw {
                    id: genuine.id,
                    crc: 0,
                    bytes: &planted,
                },
                Entry::Object(&padding),
            ],
            &Default::default(),
        )
        .unwrap();
        let packs = |dir: &std::path::Path| std::fs::read_dir(dir).unwrap().count();
        let before = packs(&pack_dir);
        match super::merge_small_packs(&repo) {
            Err(e @ crate::vault::VaultError::Object(_)) => {
                assert!(e.to_string().contains("pack"), "{e}")
            }
            other => panic!("the planted pack was merged: {other:?}"),
        }
        assert_eq!(packs(&pack_dir), before);
        // Without it, the genuine object merges and reads as itself.
        for ext in ["idx", "pack"] {
            std::fs::remove_file(pack_dir.join(format!("pack-{planted_name}.{ext}"))).unwrap();
        }
        assert_eq!(super::merge_small_packs(&repo).unwrap(), 9);
        let repo = Repository::open_bare(tmp.path()).unwrap();
        let odb = repo.odb().unwrap();
        assert_eq!(odb.read(genuine.id).unwrap().data(), &genuine.data[..]);
    }

    #[test]
    fn merges_roll_up_the_small_packs() {
        // Under the limit: nothing.
        assert_eq!(merge_from(&[100, 4, 4], 8), 3);
        // A big gc pack and nine checkpoint packs: the checkpoints merge.
        let mut s = vec![1000];
        s.extend([4; 9]);
        assert_eq!(merge_from(&s, 8), 1);
        // A geometric series (factor 3) stays; the small tail merges.
        assert_eq!(merge_from(&[2000, 600, 200, 60, 20, 6, 2, 1, 1], 8), 5);
        // Similar sizes all merge.
        assert_eq!(merge_from(&[5; 10], 8), 0);
    }

    #[test]
    fn a_checkpoint_never_merges_a_large_pack() {
        use super::{AUTO_MERGE_MAX_BYTES as MAX, auto_merge_from};
        let mib = 1 << 20;
        // A 400 MiB gc pack and nine small packs that together pass half
        // of it: only the small ones merge.
        let mut s = vec![400 * mib];
        s.extend([30 * mib; 9]);
        assert_eq!(auto_merge_from(&s), 1);
        // Large packs count against the limit: with 7 of them, the two
        // small ones are merged into one.
        let mut s = vec![MAX + 1; 7];
        s.extend([4 * mib, 4 * mib]);
        assert_eq!(auto_merge_from(&s), 7);
        // Only large packs: nothing to merge, however many.
        assert_eq!(auto_merge_from(&[MAX + 1; 12]), 12);
        // Few packs: nothing.
        assert_eq!(auto_merge_from(&[MAX + 1, 4 * mib]), 2);
    }
}
