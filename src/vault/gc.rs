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

use std::fs;

use git2::Repository;

use super::{MAIN_REF, Vault, VaultError, checkpoint_locked, fsync, keys::KEYS_REF, wal};

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

/// Repack when a checkpoint leaves more packs than this.
pub(crate) const AUTO_GC_PACKS: usize = 24;

impl Vault {
    /// Checkpoint, then repack everything reachable into one pack and
    /// delete every other pack and loose object. Takes the writer lock.
    pub fn gc(&mut self) -> Result<GcReport, VaultError> {
        let lock = self.lock.try_clone()?;
        lock.lock()?;
        let _guard = super::LockGuard(&lock);
        checkpoint_locked(&self.repo, &mut self.wal)?;
        self.dirty = false;
        repack_locked(&self.repo)
    }
}

/// Number of packs in the repository.
pub(crate) fn pack_count(repo: &Repository) -> usize {
    fs::read_dir(repo.path().join("objects/pack"))
        .map(|d| {
            d.filter_map(Result::ok)
                .filter(|e| e.file_name().to_string_lossy().ends_with(".pack"))
                .count()
        })
        .unwrap_or(0)
}

fn dir_bytes(dir: &std::path::Path) -> u64 {
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

/// The repack (the caller holds the writer lock and has checkpointed).
pub(crate) fn repack_locked(repo: &Repository) -> Result<GcReport, VaultError> {
    let objects_dir = repo.path().join("objects");
    let pack_dir = objects_dir.join("pack");
    fs::create_dir_all(&pack_dir)?;
    let mut report = GcReport {
        bytes_before: dir_bytes(&objects_dir),
        ..Default::default()
    };
    let mut pb = repo.packbuilder()?;
    pb.set_threads(1);
    let mut walk = repo.revwalk()?;
    if let Ok(main) = repo.refname_to_id(MAIN_REF) {
        walk.push(main)?;
    }
    pb.insert_walk(&mut walk)?;
    if let Ok(keys) = repo.refname_to_id(KEYS_REF) {
        pb.insert_commit(keys)?;
    }
    report.objects = pb.object_count();
    pb.write(&pack_dir, 0o444)?;
    let name = pb
        .name()?
        .ok_or_else(|| super::damaged("the new pack has no name"))?
        .to_string();
    let keep = format!("pack-{name}.");
    for ext in ["pack", "idx"] {
        fsync::sync_path(&pack_dir.join(format!("{keep}{ext}")))?;
    }
    fsync::sync_path(&pack_dir)?;
    // Only now delete: every other pack, then every loose object.
    for e in fs::read_dir(&pack_dir)?.filter_map(Result::ok) {
        let n = e.file_name().to_string_lossy().into_owned();
        if n.starts_with("pack-") && !n.starts_with(&keep) {
            fs::remove_file(e.path())?;
            report.removed_files += 1;
        }
    }
    for d in fs::read_dir(&objects_dir)?.filter_map(Result::ok) {
        let n = d.file_name().to_string_lossy().into_owned();
        if n.len() == 2 && n.bytes().all(|b| b.is_ascii_hexdigit()) {
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
