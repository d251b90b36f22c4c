//! Expiry and purge: deletion that really deletes, by crypto-erasure.
//!
//! Destroying a file key makes every version of that file, in every
//! commit, unreadable, while the commits and their hashes stay: the audit
//! trail holds. One sweep or purge is:
//!
//! 1. under the writer lock, write `memvault/erase-pending` (the doomed key
//!    ids, sealed) durably;
//! 2. in one log record, commit the new tree (files removed; live files
//!    that shared a doomed key re-encrypted under new keys), marked
//!    `expire` or `purge`, with the erased key ids in its metadata (the
//!    tombstone), and the key state without the doomed keys;
//! 3. prune the replaced key-state objects (and repack if any was
//!    packed) so the destroyed keys are physically gone, then delete the
//!    marker.
//!
//! A crash after 1 leaves the marker until the prune is done: the next
//! writer finishes the job, erasing (in a commit of its own, `erase`) only
//! doomed keys that no file at the tip uses, and pruning. So a crash before 2 applies none of the
//! sweep (but the erasure of keys no live file uses), and one after 2 all
//! of it.

use std::collections::{BTreeSet, HashSet};
use std::fs;

use git2::{ObjectType, Oid};
use zeroize::Zeroizing;

use super::access::{Access, Kind};
use crate::crypto::{self, FileKey, FileKeyId};
use crate::memory::{MemoryPath, NodeKind, Snapshot};
use crate::vault::CommitMeta;
use crate::vault::keys::{GARBAGE_FILE, KEYS_REF};
use crate::vault::tree::VaultSnapshot;
use crate::vault::treeedit::TreeEdits;
use crate::vault::{
    KeyChange, Rev, Vault, VaultError, damaged, now_ms, stage_blob, sync_dir, write_durable,
};

pub(crate) const MARKER: &str = "memvault/erase-pending";
/// git's empty tree.
pub(crate) const EMPTY_TREE: &str = "4b825dc642cb6eb9a060e54bf8d69288fbee4904";
const MARKER_AAD: &[u8] = b"memvault erase pending v1\0";

/// A file the sweep removes (or would, with `--dry-run`).
#[derive(Debug, Clone)]
pub struct Expired {
    pub path: MemoryPath,
    pub access: Access,
}

/// What `expire` did or would do.
#[derive(Debug, Default)]
pub struct SweepReport {
    pub expired: Vec<Expired>,
    /// Files with no access record: kept, and counted from now on.
    pub unrecorded: Vec<MemoryPath>,
    pub kept: usize,
    pub commit: Option<Rev>,
    pub erased_keys: usize,
    /// Live files re-encrypted because they shared a destroyed key.
    pub rekeyed: Vec<MemoryPath>,
    pub pruned_objects: usize,
    /// Committed, but the prune that deletes the destroyed keys from the
    /// disk failed (why): the next writer finishes it.
    pub unfinished: Option<String>,
}

/// What `purge` did.
#[derive(Debug, Default)]
pub struct PurgeReport {
    pub removed: Vec<MemoryPath>,
    pub rekeyed: Vec<MemoryPath>,
    pub erased_keys: usize,
    pub commit: Option<Rev>,
    pub pruned_objects: usize,
    /// As [`SweepReport::unfinished`].
    pub unfinished: Option<String>,
}

/// What an erasure committed.
#[derive(Default)]
struct Erased {
    commit: Option<Oid>,
    rekeyed: Vec<MemoryPath>,
    erased: usize,
    unfinished: Option<String>,
}

/// A live file: path, git path and key id.
#[derive(Clone)]
struct LiveFile {
    path: MemoryPath,
    git_path: String,
    key: FileKeyId,
}

/// Test hook (`test-hooks` builds only): `MEMVAULT_TEST_CRASH=<point>`
/// aborts the process there, so crash tests can stop a sweep (or a
/// format migration) at each step.
#[cfg(feature = "test-hooks")]
pub(crate) fn test_crash(point: &str) {
    if std::env::var("MEMVAULT_TEST_CRASH").is_ok_and(|p| p == point) {
        std::process::abort();
    }
}

#[cfg(not(feature = "test-hooks"))]
pub(crate) fn test_crash(_point: &str) {}

impl Vault {
    /// Every file at `tip` with its key id.
    fn live_files(&self, tip: Option<Oid>) -> Result<Vec<LiveFile>, VaultError> {
        let snap = self.snapshot_of(tip)?;
        Ok(snap
            .files_with_keys()?
            .into_iter()
            .map(|(path, git_path, key)| LiveFile {
                path,
                git_path,
                key,
            })
            .collect())
    }

    /// Remove `expired` files from the tip (and re-key live files sharing a
    /// doomed key), destroy the doomed keys, prune. Holds the writer lock.
    #[allow(clippy::too_many_arguments)]
    fn erase_locked(
        &mut self,
        tip: Option<Oid>,
        live: &[LiveFile],
        removals: &[&LiveFile],
        mut keep_current: Vec<LiveFile>,
        doomed: BTreeSet<FileKeyId>,
        mut meta: CommitMeta,
    ) -> Result<Erased, VaultError> {
        let removing: HashSet<&str> = removals.iter().map(|f| f.git_path.as_str()).collect();
        // Live files outside the removal that use a doomed key keep their
        // present content under a new key.
        for f in live {
            if doomed.contains(&f.key)
                && !removing.contains(f.git_path.as_str())
                && !keep_current.iter().any(|k| k.git_path == f.git_path)
            {
                keep_current.push(f.clone());
            }
        }
        if removals.is_empty() && keep_current.is_empty() && doomed.is_empty() {
            return Ok(Erased::default());
        }
        // 1. The marker, durable before anything changes.
        let mut plain = Zeroizing::new(Vec::new());
        for id in &doomed {
            plain.extend_from_slice(&id.0);
        }
        let sealed = self.keys.seal_access(MARKER_AAD, &plain);
        write_durable(&self.dir.join(MARKER), &sealed)?;
        test_crash("after-marker");

        // 2. The new tree and its commit.
        let mut new_keys: Vec<(FileKeyId, Option<FileKey>)> = Vec::new();
        let mut rekeyed = Vec::new();
        let mut update = TreeEdits::memory();
        let mut objects = Vec::new();
        let mut access_moves: Vec<(FileKeyId, FileKeyId)> = Vec::new();
        {
            let snap = self.snapshot_of(tip)?;
            for f in removals {
                update.remove(f.git_path.as_str());
            }
            for f in &keep_current {
                let content = snap.read(&f.path)?;
                let id = FileKeyId::generate();
                let key = FileKey::generate();
                let sealed = crypto::seal_blob(&key, &id, f.path.as_str(), &content);
                let blob = stage_blob(&self.repo, sealed, &mut objects)?;
                update.upsert(f.git_path.as_str(), blob);
                new_keys.push((id, Some(key)));
                access_moves.push((f.key, id));
                rekeyed.push(f.path.clone());
            }
        }
        // The edit reads the trees on each path: check them first.
        if let Some(base) = self.tree_of(tip)? {
            for f in removals.iter().copied().chain(&keep_current) {
                crate::vault::objects::check_path(&self.repo, base, &f.git_path)?;
            }
        }
        let tree = self.edit_tree(tip, &update, &mut objects)?;
        // The keys still in use at the new tip: the files kept as they were.
        let changed: HashSet<&str> = removing
            .iter()
            .copied()
            .chain(keep_current.iter().map(|f| f.git_path.as_str()))
            .collect();
        let in_use: HashSet<FileKeyId> = live
            .iter()
            .filter(|f| !changed.contains(f.git_path.as_str()))
            .map(|f| f.key)
            .collect();
        let erase = self.erasable(&doomed, &in_use)?;
        let erased = erase.len();
        new_keys.extend(erase);
        meta.erased_keys = doomed.iter().map(FileKeyId::to_hex).collect();
        // Read by merges on other machines: an edit made there meanwhile to
        // a file kept here follows it to its new key.
        meta.details.extend(access_moves.iter().map(|(old, new)| {
            format!(
                "{}{} -> {}",
                crate::vault::sync::REKEYED,
                old.to_hex(),
                new.to_hex()
            )
        }));
        let commit = self.publish(tip, tree, KeyChange::files(new_keys), &meta, objects)?;
        test_crash("after-commit");
        // Committed: what fails from here on (a full disk, say) leaves the
        // erasure made and its prune owed (the marker stays; the next
        // writer finishes it), said as such rather than as a failure that
        // changed nothing.
        let finished = self
            .finish_erasure(Some(commit), &doomed, Some(in_use))
            .and_then(|_| {
                // Access records follow re-keyed files; erased keys are
                // dropped.
                let mut table = self.access_table()?;
                for (old, new) in access_moves {
                    if let Some(a) = table.get(&old).copied() {
                        table.insert(new, a);
                    }
                }
                table.retain(|id, _| !doomed.contains(id));
                self.compact_access(&table)
            });
        Ok(Erased {
            commit: Some(commit),
            rekeyed,
            erased,
            unfinished: finished.err().map(|e| {
                if e.is_disk_full() {
                    "the disk is full".to_string()
                } else {
                    e.to_string()
                }
            }),
        })
    }

    /// The doomed keys the table still holds and no file at the tip uses,
    /// as key-table removals.
    fn erasable(
        &self,
        doomed: &BTreeSet<FileKeyId>,
        in_use: &HashSet<FileKeyId>,
    ) -> Result<Vec<(FileKeyId, Option<FileKey>)>, VaultError> {
        let mut erase = Vec::new();
        for id in doomed.iter().filter(|id| !in_use.contains(id)) {
            if self
                .key_state
                .file_key(&self.repo, &self.keys, id)?
                .is_some()
            {
                erase.push((*id, None));
            }
        }
        Ok(erase)
    }

    /// Erase the doomed keys that no file at `tip` uses (if a crash left
    /// any), remove the marker, prune. Returns how many keys were erased.
    fn finish_erasure(
        &mut self,
        tip: Option<Oid>,
        doomed: &BTreeSet<FileKeyId>,
        in_use: Option<HashSet<FileKeyId>>,
    ) -> Result<usize, VaultError> {
        let in_use: HashSet<FileKeyId> = match in_use {
            Some(u) => u,
            None => self.live_files(tip)?.into_iter().map(|f| f.key).collect(),
        };
        let erase = self.erasable(doomed, &in_use)?;
        let n = erase.len();
        if !erase.is_empty() {
            // Only after a crash: the tombstone commit never made it.
            let mut meta = self.new_meta("erase");
            meta.erased_keys = erase.iter().map(|(id, _)| id.to_hex()).collect();
            self.publish_key_change(tip, KeyChange::files(erase), meta)?;
        }
        // The erasure is durable, and the replaced key states that held
        // the destroyed keys are gone, before its marker goes: a crash
        // anywhere before leaves the marker, and the next writer prunes.
        self.sync_now()?;
        test_crash("after-erase");
        self.prune_key_garbage()?;
        match fs::remove_file(self.dir.join(MARKER)) {
            Ok(()) => sync_dir(&self.dir.join("memvault")),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(e) => return Err(e.into()),
        }
        Ok(n)
    }

    /// Before a change that destroys keys other than by a sweep (a sync
    /// that brings an erasure): the marker with no doomed key of its own,
    /// so that a crash before the prune that follows leaves it, and the
    /// next writer prunes. The caller holds the writer lock.
    pub(crate) fn mark_prune_pending(&mut self) -> Result<(), VaultError> {
        let sealed = self.keys.seal_access(MARKER_AAD, &[]);
        write_durable(&self.dir.join(MARKER), &sealed)?;
        Ok(())
    }

    /// For `verify`: the erasure marker, if one is there: Err when it
    /// does not read or open (damaged or planted: every write is refused
    /// until it is removed), else Ok(Some) when an erasure was cut short
    /// and its prune is owed (the destroyed keys may still be on the disk
    /// until the next command that writes).
    pub(crate) fn erase_marker_state(&self) -> Result<Option<String>, String> {
        match self.erase_marker() {
            Ok(None) => Ok(None),
            Ok(Some(_)) => Ok(Some(
                "an erasure (purge, expire, or one a sync brought) was cut short before its prune: the keys it destroyed may still be on the disk; the next command that writes finishes it (`memvault gc` will do)".into(),
            )),
            Err(e) => Err(format!("{e}: every write is refused until it is removed")),
        }
    }

    /// The erasure marker's content (the doomed key ids), if there is one:
    /// read within its bound and opened.
    fn erase_marker(&self) -> Result<Option<Zeroizing<Vec<u8>>>, VaultError> {
        let sealed =
            match crate::vault::fsx::read_max(&self.dir.join(MARKER), crate::vault::fsx::TABLE) {
                Ok(b) => b,
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
                Err(e) => return Err(e.into()),
            };
        self.keys
            .open_access(MARKER_AAD, &sealed)
            .map(Some)
            .map_err(|_| damaged("memvault/erase-pending does not open"))
    }

    /// Finish an erasure a crash interrupted (see the module docs). The
    /// caller holds the writer lock.
    pub(crate) fn finish_pending_erasure(&mut self, tip: Option<Oid>) -> Result<(), VaultError> {
        let Some(plain) = self.erase_marker()? else {
            return Ok(());
        };
        let doomed: BTreeSet<FileKeyId> = plain
            .chunks_exact(16)
            .map(|c| {
                let mut id = [0u8; 16];
                id.copy_from_slice(c);
                FileKeyId(id)
            })
            .collect();
        self.finish_erasure(tip, &doomed, None)?;
        Ok(())
    }

    /// `expire`: remove every file not viewed or written within
    /// `older_than_ms` of `now`, in one commit, and destroy their keys.
    pub fn expire(&mut self, older_than_ms: u64, dry_run: bool) -> Result<SweepReport, VaultError> {
        let now = now_ms();
        self.with_writer_lock(|vault, tip| vault.expire_locked(tip, now, older_than_ms, dry_run))
    }

    fn expire_locked(
        &mut self,
        tip: Option<Oid>,
        now: u64,
        older_than_ms: u64,
        dry_run: bool,
    ) -> Result<SweepReport, VaultError> {
        let live = self.live_files(tip)?;
        let table = self.access_table()?;
        let cutoff = now.saturating_sub(older_than_ms);
        let mut report = SweepReport::default();
        let mut removals: Vec<&LiveFile> = Vec::new();
        let mut seed = Vec::new();
        for f in &live {
            let access = table.get(&f.key).copied().unwrap_or_default();
            match access.last_active() {
                None => {
                    report.unrecorded.push(f.path.clone());
                    seed.push((f.key, Kind::Written, now));
                }
                Some(t) if t < cutoff => {
                    report.expired.push(Expired {
                        path: f.path.clone(),
                        access,
                    });
                    removals.push(f);
                }
                Some(_) => report.kept += 1,
            }
        }
        report.kept += report.unrecorded.len();
        if dry_run {
            return Ok(report);
        }
        self.append_access(&seed);
        if removals.is_empty() {
            return Ok(report);
        }
        let doomed: BTreeSet<FileKeyId> = removals.iter().map(|f| f.key).collect();
        let meta = CommitMeta {
            time_ms: now,
            files: removals
                .iter()
                .map(|f| f.path.as_str().to_string())
                .collect(),
            ..self.new_meta("expire")
        };
        let done = self.erase_locked(tip, &live, &removals, Vec::new(), doomed, meta)?;
        report.commit = done.commit.map(Rev::from_oid);
        report.rekeyed = done.rekeyed;
        report.erased_keys = done.erased;
        report.unfinished = done.unfinished;
        Ok(report)
    }

    /// `purge`: erase a file or directory from all of history by
    /// destroying the keys of every version ever stored at or below
    /// `path`. With `keep_current` the present files stay, re-encrypted
    /// under new keys, so only the past is erased.
    pub fn purge(
        &mut self,
        path: &MemoryPath,
        keep_current: bool,
    ) -> Result<PurgeReport, VaultError> {
        let path = path.clone();
        self.with_writer_lock(|vault, tip| vault.purge_locked(tip, &path, keep_current))
    }

    fn purge_locked(
        &mut self,
        tip: Option<Oid>,
        path: &MemoryPath,
        keep_current: bool,
    ) -> Result<PurgeReport, VaultError> {
        if path.is_root() {
            return Err(VaultError::Refused(
                "purge names a file or directory below /memories, not the whole memory".into(),
            ));
        }
        // Every key ever used at or below the path, over all of history.
        let mut doomed = BTreeSet::new();
        let mut seen_trees = HashSet::new();
        let mut seen_blobs = HashSet::new();
        let mut next = tip;
        let mut commits = 0usize;
        while let Some(id) = next {
            let (tree, parent, _) = self.read_commit(id)?;
            next = parent;
            commits += 1;
            // Wherever that tree holds it: flat (format 2), under all its
            // buckets (format 3) or some (format 9).
            let snap = VaultSnapshot::new(
                &self.repo,
                &self.keys,
                &self.key_state,
                &self.caches,
                Some(tree),
            );
            let Some((oid, kind)) = snap.locate(path)?.1 else {
                continue;
            };
            let kind = match kind {
                NodeKind::Dir => ObjectType::Tree,
                NodeKind::File => ObjectType::Blob,
            };
            self.collect_keys(
                oid,
                Some(kind),
                &mut seen_trees,
                &mut seen_blobs,
                &mut doomed,
            )?;
        }
        let _ = commits;
        let live = self.live_files(tip)?;
        let below: Vec<&LiveFile> = live.iter().filter(|f| f.path.starts_with(path)).collect();
        if doomed.is_empty() && below.is_empty() {
            return Err(VaultError::Refused(format!(
                "{} never held a file; nothing to purge",
                path.as_str()
            )));
        }
        // Purged before: every key it names is destroyed already (a second
        // purge would only add an empty tombstone).
        if below.is_empty() && doomed.iter().all(|k| self.key_state.erased.contains(k)) {
            return Err(VaultError::Refused(format!(
                "every version ever stored at or below {} is erased already; nothing to purge",
                path.as_str()
            )));
        }
        let (removals, keep): (Vec<&LiveFile>, Vec<LiveFile>) = if keep_current {
            (Vec::new(), below.iter().map(|f| (*f).clone()).collect())
        } else {
            (below.clone(), Vec::new())
        };
        let meta = CommitMeta {
            path: Some(path.as_str().to_string()),
            files: below.iter().map(|f| f.path.as_str().to_string()).collect(),
            ..self.new_meta("purge")
        };
        let done = self.erase_locked(tip, &live, &removals, keep, doomed, meta)?;
        Ok(PurgeReport {
            removed: removals.iter().map(|f| f.path.clone()).collect(),
            rekeyed: done.rekeyed,
            erased_keys: done.erased,
            commit: done.commit.map(Rev::from_oid),
            pruned_objects: 0,
            unfinished: done.unfinished,
        })
    }

    fn collect_keys(
        &self,
        oid: Oid,
        kind: Option<ObjectType>,
        seen_trees: &mut HashSet<Oid>,
        seen_blobs: &mut HashSet<Oid>,
        out: &mut BTreeSet<FileKeyId>,
    ) -> Result<(), VaultError> {
        match kind {
            Some(ObjectType::Blob) if seen_blobs.insert(oid) => {
                self.check_object(oid)?;
                let blob = self.repo.find_blob(oid)?;
                if let Ok(id) = crypto::blob_key_id(blob.content()) {
                    out.insert(id);
                }
            }
            Some(ObjectType::Tree) if seen_trees.insert(oid) => {
                self.check_object(oid)?;
                let tree = self.repo.find_tree(oid)?;
                let children: Vec<(Oid, Option<ObjectType>)> =
                    tree.iter().map(|e| (e.id(), e.kind())).collect();
                for (id, k) in children {
                    self.collect_keys(id, k, seen_trees, seen_blobs, out)?;
                }
            }
            _ => {}
        }
        Ok(())
    }

    /// Delete the objects of replaced key-state commits that the current
    /// key state does not share (they hold keys that may since have been
    /// destroyed). Loose objects are removed; if any was packed, the
    /// repository is repacked from its refs. Returns the objects removed.
    pub fn prune_key_garbage(&mut self) -> Result<usize, VaultError> {
        // The write-ahead log still holds the objects of recent key states:
        // checkpoint it first (its objects go to git, the log starts over),
        // then remove the replaced ones from git.
        self.checkpoint_locked()?;
        // The log file keeps earlier records' bytes until overwritten
        // (it is preallocated): zero them, replaced key tables among them.
        self.wal.scrub()?;
        // What an interrupted write left holds whole objects, replaced key
        // states among them: gone first, garbage list or not.
        let swept = crate::vault::gc::remove_leftovers(&self.dir.join("objects"))?;
        let list_path = self.dir.join(GARBAGE_FILE);
        let text = match crate::vault::fsx::read_to_string(&list_path, crate::vault::fsx::TABLE) {
            Ok(t) => t,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(swept),
            Err(e) => return Err(e.into()),
        };
        let current = self
            .repo
            .refname_to_id(KEYS_REF)
            .map_err(|_| damaged("the key state (refs/memvault/keys) is missing"))?;
        let mut live = HashSet::new();
        self.collect_objects(current, &mut live);
        // The only object a key state can share with main: the empty tree
        // (an empty `table` of the first key state is the init commit's
        // tree). Key-state trees have plain names and main's encrypted
        // ones, and every sealed blob has a random nonce, so nothing else
        // is shared; deleting the empty tree broke main (`git fsck`).
        live.insert(Oid::from_str(EMPTY_TREE).expect("a valid id"));
        // The list is a plain file: whoever can write the vault directory
        // can write it (round 41d listed main's commits in it, and a purge
        // deleted them). Only key-state commits of this vault (its MAC, a
        // key-state header) and what they alone reach are ever deleted.
        let mut doomed = HashSet::new();
        for line in text.lines() {
            if let Ok(id) = Oid::from_str(line.trim())
                && id != current
            {
                self.collect_key_state_objects(id, &mut doomed);
            }
        }
        let mut removed = swept;
        let mut packed = false;
        let odb = self.repo.odb()?;
        for oid in doomed.difference(&live) {
            let hex = oid.to_string();
            let loose = self.dir.join("objects").join(&hex[..2]).join(&hex[2..]);
            match fs::remove_file(&loose) {
                Ok(()) => removed += 1,
                Err(_) if odb.exists(*oid) => packed = true,
                Err(_) => {}
            }
        }
        drop(odb);
        if packed {
            crate::vault::gc::repack_locked(&self.repo)?;
        }
        test_crash("mid-prune");
        write_durable(&list_path, b"")?;
        Ok(removed)
    }

    /// The ids of a key-state commit, the states it chains to (its
    /// parents, see `keys`), their trees and everything below (best
    /// effort: objects already gone are skipped).
    fn collect_objects(&self, commit: Oid, out: &mut HashSet<Oid>) {
        self.collect_from(commit, out, false);
    }

    /// The same, for a commit named by the garbage list: only commits that
    /// are key states of this vault (its MAC and a key-state header) are
    /// taken, each one checked, and the walk stops at any other.
    fn collect_key_state_objects(&self, commit: Oid, out: &mut HashSet<Oid>) {
        self.collect_from(commit, out, true);
    }

    fn collect_from(&self, commit: Oid, out: &mut HashSet<Oid>, checked: bool) {
        let is_key_state = |id: Oid| {
            crate::vault::keys::verify_commit_mac(&self.repo, &self.keys, id)
                && crate::vault::keys::read_header(&self.repo, id).is_ok()
        };
        let mut commits = vec![commit];
        let mut stack = Vec::new();
        while let Some(id) = commits.pop() {
            if out.contains(&id) || (checked && !is_key_state(id)) {
                continue;
            }
            out.insert(id);
            if let Ok(c) = crate::vault::objects::find_commit(&self.repo, id) {
                stack.push(c.tree_id());
                commits.extend(c.parent_ids());
            }
        }
        while let Some(t) = stack.pop() {
            if !out.insert(t) {
                continue;
            }
            let Ok(tree) = crate::vault::objects::find_tree(&self.repo, t) else {
                continue;
            };
            for e in tree.iter() {
                match e.kind() {
                    Some(ObjectType::Tree) => stack.push(e.id()),
                    _ => {
                        out.insert(e.id());
                    }
                }
            }
        }
    }
}

/// Durations as people write them: `90s`, `30m`, `12h`, `30d`, `2w`.
#[cfg(feature = "cli")]
pub fn parse_duration_ms(s: &str) -> Option<u64> {
    let s = s.trim();
    let unit = s.chars().last()?;
    let n: u64 = s[..s.len() - unit.len_utf8()].parse().ok()?;
    let ms = match unit {
        's' => 1_000,
        'm' => 60_000,
        'h' => 3_600_000,
        'd' => 86_400_000,
        'w' => 604_800_000,
        _ => return None,
    };
    n.checked_mul(ms).filter(|&v| v > 0)
}
