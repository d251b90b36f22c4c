//! Merging two histories of one vault, on decrypted files.
//!
//! A file's identity is its file key id (kept by edits and renames, on
//! every machine), so the merge pairs the files of the base, this side
//! ("ours") and the remote's ("theirs") by it:
//!
//! - changed on one side only: that side's version (path and content);
//! - changed on both: the path follows a rename made on either side (both
//!   renamed to different names: each side's version keeps its name,
//!   theirs as a conflict copy); the content is a three-way merge of the decrypted
//!   text. A clean merge gives one file. A conflict keeps ours at the path
//!   and puts theirs beside it as a new file,
//!   `<name>.conflict-<n>.<ext>` (n from 1), which the model sees in a
//!   `view` and `resume` lists until it is deleted or renamed;
//! - deleted on one side, edited on the other: the edit survives; deleted
//!   on one side and unchanged (or only renamed) on the other: deleted;
//! - two different files at one path (both sides created it, or a rename
//!   onto a new file): ours keeps the path, theirs goes to a conflict copy,
//!   unless their texts are the same: then they are one file, ours (for a
//!   file of theirs that is not itself a conflict copy made here).
//!
//! The key state merges as a union of file keys; an id erased on either
//! side is erased in the result (erasure wins); keyslots are the union,
//! less every slot a commit of either side since the base removed or
//! replaced (revocation wins); settings follow the side that changed them
//! (both: ours); the counter is past both.

use std::collections::{BTreeMap, BTreeSet, HashSet};

use git2::{Oid, Repository};
use zeroize::Zeroizing;

use super::super::keys::{KeyChange, KeyState};
use super::super::tree::git_path;
use super::super::treeedit::TreeEdits;
use super::super::{CommitMeta, Vault, VaultError, VaultSnapshot, damaged, objects, stage_blob};
use crate::crypto::{self, FileKey, FileKeyId, VaultKeys};
use crate::memory::{MemoryPath, NodeKind};

/// How a merge's history records an edit kept over an expiry under a new
/// key: `rekeyed OLD -> NEW` (file key ids, hex).
pub(crate) const REKEYED: &str = "rekeyed ";

/// What one side's erasures since the last meeting did.
#[derive(Default)]
struct Erasures {
    /// Keys its expiries destroyed (less those a purge destroyed too).
    expired: HashSet<FileKeyId>,
    /// Keys its purges destroyed.
    purged: HashSet<FileKeyId>,
    /// (old, new): an edit kept over an expiry under a new key.
    rekeyed: Vec<(FileKeyId, FileKeyId)>,
    /// (old, new): a file its purges kept, under a new key (`--keep-current`,
    /// or a file that shared a purged key).
    purge_kept: Vec<(FileKeyId, FileKeyId)>,
}

/// What a pull's merge step did.
#[derive(Default)]
pub(crate) struct Merged {
    pub what: &'static str,
    pub files: Vec<String>,
    pub conflicts: Vec<(String, String)>,
    pub erased: usize,
    /// Keys the fetched key state holds that this side erased: that state
    /// (and what it chains to) came into this repository with the fetch,
    /// and is pruned.
    pub stale: usize,
    /// Files the other side wrote (not knowing) at or below a path this
    /// side purged or expired since the two last met: kept, and said.
    pub under_erased: Vec<String>,
    /// Files one side expired and the other edited since the two last
    /// met: the edit kept under a new key, and said.
    pub kept_over_expiry: Vec<String>,
    /// Files whose merged text held a secret, with the kinds redacted.
    pub redacted: Vec<(String, Vec<(String, u32)>)>,
}

/// The key-state side of a merge.
pub(crate) struct KeyMerge {
    /// The change to apply over `ours` (merge) .
    pub change: KeyChange,
    /// Keys of `ours` that `theirs` lacks and did not erase.
    pub keep: Vec<(FileKeyId, FileKey)>,
    /// Keys `ours` holds that `theirs` erased.
    pub erased: usize,
    /// Keys `theirs` holds that `ours` erased.
    pub stale: usize,
    /// Their ids (a fast-forward, which takes `theirs` as it is, erases
    /// them again: an erasure here wins).
    pub stale_ids: Vec<FileKeyId>,
}

/// What `theirs` adds to `ours`: its keys this side lacks (unless this
/// side erased them), its erasures of keys this side holds or never had.
/// And the keys of ours that theirs lacks (kept by a fast-forward).
pub(crate) fn key_change(
    repo: &Repository,
    keys: &VaultKeys,
    ours: &KeyState,
    theirs: &KeyState,
) -> Result<KeyMerge, VaultError> {
    // The keys each side holds where the two tables differ: a shard with
    // the same blob on both sides holds the same keys.
    let (our_keys, their_keys) = match ours.differing_shards(repo, theirs)? {
        Some(shards) => {
            let (mut o, mut t) = (Vec::new(), Vec::new());
            for n in shards {
                o.extend(ours.shard_keys(repo, keys, n)?);
                t.extend(theirs.shard_keys(repo, keys, n)?);
            }
            (o, t)
        }
        None => (ours.all_keys(repo, keys)?, theirs.all_keys(repo, keys)?),
    };
    let our_ids: HashSet<FileKeyId> = our_keys.iter().map(|(id, _)| *id).collect();
    let their_ids: HashSet<FileKeyId> = their_keys.iter().map(|(id, _)| *id).collect();
    let mut files = Vec::new();
    let mut stale = 0;
    let mut stale_ids = Vec::new();
    for (id, key) in their_keys {
        if ours.erased.contains(&id) {
            stale += 1;
            stale_ids.push(id);
        } else if !our_ids.contains(&id) {
            files.push((id, Some(key)));
        }
    }
    let mut erased = 0;
    for id in &theirs.erased {
        if ours.erased.contains(id) {
            continue;
        }
        if ours.file_key(repo, keys, id)?.is_some() {
            erased += 1;
        }
        files.push((*id, None));
    }
    let mut keep = Vec::new();
    for (id, key) in our_keys {
        if !their_ids.contains(&id) && !theirs.erased.contains(&id) {
            keep.push((id, key));
        }
    }
    Ok(KeyMerge {
        change: KeyChange::files(files),
        keep,
        erased,
        stale,
        stale_ids,
    })
}

/// One file of one side.
#[derive(Clone)]
struct At {
    path: MemoryPath,
    blob: Oid,
    /// The file key it is sealed with: the file's own, or, for a version
    /// of a file the other side's purge kept under a new key, the key
    /// that purge destroyed (see `follow_purge_keeps`).
    key: FileKeyId,
}

/// What ends up at a path.
enum Pick {
    /// A stored blob, sealed for `sealed_at` with the key `sealed_with`
    /// (re-sealed if the path or the key differs).
    Blob {
        oid: Oid,
        sealed_at: MemoryPath,
        sealed_with: FileKeyId,
    },
    /// New content (a merged text, or a conflict copy).
    Text(Zeroizing<Vec<u8>>),
}

struct Final {
    id: FileKeyId,
    /// A new file key (a conflict copy, or an edit kept over an expiry).
    new_key: bool,
    /// A conflict copy: placed beside the file it conflicts with.
    copy: bool,
    /// That file's path (a copy's name may hold a shortened stem).
    beside: Option<MemoryPath>,
    path: MemoryPath,
    pick: Pick,
    /// Ours holds this path (it keeps it over theirs).
    ours: bool,
    /// The secrets the filter took out of a merged text: what neither
    /// side wrote alone, so neither side's filter saw it.
    redacted: Vec<(String, u32)>,
}

type Side = BTreeMap<(FileKeyId, u32), At>;

impl Vault {
    /// The files at `commit`, by (file key id, rank among that id's
    /// paths): all of them (`others` None), or only those whose entry is
    /// not the same in every tree of `others` (see
    /// [`VaultSnapshot::files_differing`]).
    fn side(
        &self,
        commit: Option<Oid>,
        ks: &KeyState,
        others: Option<&[Option<Oid>]>,
    ) -> Result<Side, VaultError> {
        let tree = self.tree_of(commit)?;
        let snap = VaultSnapshot::new(&self.repo, &self.keys, ks, &self.caches, tree);
        let mut files = match others {
            None => snap
                .files_with_blobs()?
                .into_iter()
                .map(|(path, _, id, blob)| (path, id, blob))
                .collect(),
            Some(others) => snap.files_differing(others)?,
        };
        files.sort_by(|a, b| a.0.as_str().cmp(b.0.as_str()));
        let mut out = Side::new();
        let mut rank: BTreeMap<FileKeyId, u32> = BTreeMap::new();
        for (path, id, blob) in files {
            let r = rank.entry(id).or_default();
            out.insert(
                (id, *r),
                At {
                    path,
                    blob,
                    key: id,
                },
            );
            *r += 1;
        }
        Ok(out)
    }

    /// Whether `path` is taken in the tree of `commit`: something is at
    /// it, or a file is at one of its ancestors.
    fn taken_in(&self, commit: Oid, ks: &KeyState, path: &MemoryPath) -> Result<bool, VaultError> {
        let tree = self.tree_of(Some(commit))?;
        let snap = VaultSnapshot::new(&self.repo, &self.keys, ks, &self.caches, tree);
        if snap.entry(path)?.is_some() {
            return Ok(true);
        }
        for a in path.ancestors() {
            if matches!(snap.entry(&a)?, Some((_, NodeKind::File))) {
                return Ok(true);
            }
        }
        Ok(false)
    }

    /// The plaintext of `blob`, sealed for `path` with the key `id` (found
    /// in this side's key state or theirs).
    fn plaintext(
        &self,
        theirs: &KeyState,
        id: &FileKeyId,
        path: &MemoryPath,
        blob: Oid,
    ) -> Result<Zeroizing<Vec<u8>>, VaultError> {
        let key = match self.key_state.file_key(&self.repo, &self.keys, id)? {
            Some(k) => k,
            None => theirs
                .file_key(&self.repo, &self.keys, id)?
                .ok_or_else(|| damaged("a merged file's key is in neither key state"))?,
        };
        objects::check(&self.repo, blob)?;
        let b = self
            .repo
            .find_blob(blob)
            .map_err(|_| damaged("a stored file is unreadable"))?;
        crypto::open_blob(key, path.as_str(), b.content())
            .map_err(|_| damaged("a stored file failed to decrypt"))
    }

    /// The plaintext of what a merge puts at a path.
    fn pick_text(&self, theirs: &KeyState, pick: &Pick) -> Result<Zeroizing<Vec<u8>>, VaultError> {
        match pick {
            Pick::Blob {
                oid,
                sealed_at,
                sealed_with,
            } => self.plaintext(theirs, sealed_with, sealed_at, *oid),
            Pick::Text(t) => Ok(t.clone()),
        }
    }

    /// The plaintext of the version `at`.
    fn text_of(&self, theirs: &KeyState, at: &At) -> Result<Zeroizing<Vec<u8>>, VaultError> {
        self.plaintext(theirs, &at.key, &at.path, at.blob)
    }

    fn same_content(&self, theirs: &KeyState, a: &At, b: &At) -> Result<bool, VaultError> {
        if a.blob == b.blob {
            return Ok(true);
        }
        Ok(self.text_of(theirs, a)? == self.text_of(theirs, b)?)
    }

    /// Merge `theirs` (the remote's main, checked and stored) into `ours`
    /// from `base`: one MAC'd commit with two parents, with the merged key
    /// state, in one log record. The caller holds the writer lock. Over
    /// the files that differ between the three trees (a file the same in
    /// all three stays as it is), or over every file (`full`: when a path
    /// is a file on one side and a directory on the other, the tree is
    /// built whole).
    #[allow(clippy::too_many_arguments)]
    pub(super) fn merge_commits(
        &mut self,
        remote: &str,
        ours: Oid,
        theirs: Oid,
        base: Option<Oid>,
        their_keys: KeyState,
        new: &BTreeSet<Oid>,
        full: bool,
    ) -> Result<Merged, VaultError> {
        let (mut b, mut o, mut t) = if full {
            (
                self.side(base, &self.key_state, None)?,
                self.side(Some(ours), &self.key_state, None)?,
                self.side(Some(theirs), &their_keys, None)?,
            )
        } else {
            let (rb, ro, rt) = (
                self.tree_of(base)?,
                self.tree_of(Some(ours))?,
                self.tree_of(Some(theirs))?,
            );
            (
                self.side(base, &self.key_state, Some(&[ro, rt]))?,
                self.side(Some(ours), &self.key_state, Some(&[rb, rt]))?,
                self.side(Some(theirs), &their_keys, Some(&[rb, ro]))?,
            )
        };
        let mut finals: Vec<Final> = Vec::new();
        // A file one side expired (judged unused) that the other side
        // edited before it heard: the edit shows it was in use, so it is
        // kept, sealed under a new key; the expired key is destroyed on
        // both sides as the expiry said. A purge still wins outright.
        // This side's commits since the two last met (read again below for
        // the keyslots and settings).
        let stop = self.known_before(new, base)?;
        let own_line = self.own_line(ours, &stop, 1_000_000)?;
        let (ours_erasures, theirs_erasures) = (
            self.erasures_in(own_line.iter().copied())?,
            self.erasures_in(new.iter().copied())?,
        );
        follow_purge_keeps(&theirs_erasures.purge_kept, &t, &mut o, &mut b);
        follow_purge_keeps(&ours_erasures.purge_kept, &o, &mut t, &mut b);
        let expired = (&ours_erasures.expired, &theirs_erasures.expired);
        // A file one side purged that the other side's merge had kept over
        // an expiry, under a new key: that key goes with the purge.
        let purged_since: HashSet<FileKeyId> = theirs_erasures
            .rekeyed
            .iter()
            .filter(|(old, _)| ours_erasures.purged.contains(old))
            .chain(
                ours_erasures
                    .rekeyed
                    .iter()
                    .filter(|(old, _)| theirs_erasures.purged.contains(old)),
            )
            .map(|(_, new)| *new)
            .collect();
        let mut kept_over_expiry: Vec<(String, FileKeyId, FileKeyId)> = Vec::new();
        // Files renamed apart: (ours' key, the key of theirs' copy).
        let mut renamed_apart: Vec<(FileKeyId, FileKeyId, String)> = Vec::new();
        let idents: BTreeSet<(FileKeyId, u32)> = o.keys().chain(t.keys()).copied().collect();
        for ident in idents {
            let id = ident.0;
            match (o.get(&ident), t.get(&ident), b.get(&ident)) {
                (Some(x), None, None) => finals.push(keep(id, x, true)),
                (None, Some(y), None) => finals.push(keep(id, y, false)),
                (Some(x), None, Some(base)) | (None, Some(x), Some(base)) => {
                    // One side deleted it: an edit on the other survives.
                    // Against an expiry on the deleting side, a rename is
                    // use too.
                    let ours = o.contains_key(&ident);
                    let (erased, expired_there) = if ours {
                        (&their_keys.erased, &expired.1)
                    } else {
                        (&self.key_state.erased, &expired.0)
                    };
                    let edited = !self.same_content(&their_keys, x, base)?;
                    if erased.contains(&id)
                        && expired_there.contains(&id)
                        && (edited || x.path != base.path)
                    {
                        let f = self.rekeyed(&their_keys, x, ours)?;
                        kept_over_expiry.push((x.path.as_str().to_string(), id, f.id));
                        finals.push(f);
                    } else if edited {
                        finals.push(keep(id, x, ours));
                    }
                }
                // Renamed on both sides, to different names: each side's
                // version keeps the name it gave, theirs as a conflict copy
                // under a key of its own (as git keeps both names of a
                // rename/rename), so neither machine's agent finds its
                // file gone from where it put it.
                (Some(x), Some(y), Some(base))
                    if x.path != base.path
                        && y.path != base.path
                        && x.path != y.path
                        && !self.key_state.erased.contains(&id)
                        && !their_keys.erased.contains(&id)
                        && !purged_since.contains(&id) =>
                {
                    finals.push(keep(id, x, true));
                    let copy = FileKeyId::generate();
                    finals.push(Final {
                        id: copy,
                        new_key: true,
                        redacted: Vec::new(),
                        copy: false,
                        // Where that name is taken here, a conflict copy
                        // beside this side's file (named after it, as
                        // `resume` pairs them).
                        beside: Some(x.path.clone()),
                        path: y.path.clone(),
                        pick: Pick::Text(self.text_of(&their_keys, y)?),
                        ours: false,
                    });
                    renamed_apart.push((id, copy, y.path.as_str().to_string()));
                }
                (Some(x), Some(y), base) => {
                    let path = match base {
                        Some(base) if x.path == base.path => y.path.clone(),
                        _ => x.path.clone(),
                    };
                    self.merge_one(&their_keys, id, x, y, base, path, &mut finals)?;
                }
                (None, None, _) => {}
            }
        }
        // An erasure on either side wins: no version of an erased file
        // survives the merge, whatever the other side did to it.
        finals.retain(|f| {
            !self.key_state.erased.contains(&f.id)
                && !their_keys.erased.contains(&f.id)
                && !purged_since.contains(&f.id)
        });
        // Two files at one path with the same text (both sides created
        // it, or each resolved the same conflict into the same copy, as
        // two machines pulling one push do) are one: ours stays, theirs
        // is not made a conflict copy of itself (round 41b: three
        // machines grew pairs of identical `x.conflict-1.conflict-1.md`).
        let mut ours_at: BTreeMap<String, usize> = BTreeMap::new();
        for (i, f) in finals.iter().enumerate() {
            if f.ours && !f.copy {
                ours_at.insert(f.path.as_str().to_string(), i);
            }
        }
        let mut same = Vec::new();
        for (j, f) in finals.iter().enumerate() {
            if f.ours || f.copy || f.beside.is_some() {
                continue;
            }
            if let Some(&i) = ours_at.get(f.path.as_str())
                && self.pick_text(&their_keys, &finals[i].pick)?
                    == self.pick_text(&their_keys, &f.pick)?
            {
                same.push(j);
            }
        }
        for j in same.into_iter().rev() {
            let gone = finals.remove(j);
            // An edit kept over an expiry that turns out to be ours again
            // is not one: no key or file has its new id.
            kept_over_expiry.retain(|(_, _, new)| *new != gone.id);
        }
        // A conflict copy's name must also be free of the files the
        // merge did not look at (the same in all three trees).
        let taken = |p: &MemoryPath| -> Result<bool, VaultError> {
            Ok(!full
                && (self.taken_in(ours, &self.key_state, p)?
                    || self.taken_in(theirs, &their_keys, p)?))
        };
        let mut conflicts = place(&mut finals, &taken)?;
        // A file renamed apart is a conflict too: where each side's
        // version now is (when the other side's name was free; else
        // `place` said where its copy went).
        for (ours_id, copy, their_name) in renamed_apart {
            let at = |id: FileKeyId| {
                finals
                    .iter()
                    .find(|f| f.id == id)
                    .map(|f| f.path.as_str().to_string())
            };
            if let (Some(x), Some(y)) = (at(ours_id), at(copy))
                && y == their_name
            {
                conflicts.push((x, y));
            }
        }
        let redacted: Vec<(String, Vec<(String, u32)>)> = finals
            .iter()
            .filter(|f| !f.redacted.is_empty())
            .map(|f| (f.path.as_str().to_string(), f.redacted.clone()))
            .collect();
        // New content the other side put where this side erased since
        // they last met: erasure wins for what it destroyed, not for what
        // was written after without knowing of it. Kept, and said.
        let erased_here = self.erased_paths_since(ours, base)?;
        let under_erased: Vec<String> = finals
            .iter()
            .filter(|f| !o.keys().any(|k| k.0 == f.id))
            .filter(|f| {
                !kept_over_expiry
                    .iter()
                    .any(|(p, _, _)| p == f.path.as_str())
            })
            .filter(|f| {
                erased_here.iter().any(|(p, below)| {
                    f.path == *p
                        || (*below && f.path.as_str().starts_with(&format!("{}/", p.as_str())))
                })
            })
            .map(|f| f.path.as_str().to_string())
            .collect();
        // The new tree: edits over ours'.
        let mut edits = TreeEdits::memory();
        let mut objects_out = Vec::new();
        let mut new_keys: Vec<(FileKeyId, Option<FileKey>)> = Vec::new();
        let mut changed: BTreeSet<String> = BTreeSet::new();
        let kept: HashSet<(String, Oid)> = finals
            .iter()
            .filter_map(|f| match &f.pick {
                Pick::Blob {
                    oid,
                    sealed_at,
                    sealed_with,
                } if *sealed_at == f.path && *sealed_with == f.id => {
                    Some((f.path.as_str().to_string(), *oid))
                }
                _ => None,
            })
            .collect();
        let mut removed: Vec<String> = Vec::new();
        for at in o.values() {
            if !kept.contains(&(at.path.as_str().to_string(), at.blob)) {
                removed.push(at.path.as_str().to_string());
            }
        }
        let ours_at: HashSet<(String, Oid)> = o
            .values()
            .map(|a| (a.path.as_str().to_string(), a.blob))
            .collect();
        let mut upserts: Vec<(MemoryPath, Oid)> = Vec::new();
        for f in &finals {
            let key_holder;
            let key = if f.new_key {
                let k = FileKey::generate();
                key_holder = Some(k.duplicate());
                new_keys.push((f.id, Some(k)));
                key_holder.as_ref()
            } else {
                None
            };
            let oid = match &f.pick {
                Pick::Blob {
                    oid,
                    sealed_at,
                    sealed_with,
                } if *sealed_at == f.path && *sealed_with == f.id => *oid,
                Pick::Blob {
                    oid,
                    sealed_at,
                    sealed_with,
                } => {
                    let plain = self.plaintext(&their_keys, sealed_with, sealed_at, *oid)?;
                    self.seal(&their_keys, f.id, key, &f.path, &plain, &mut objects_out)?
                }
                Pick::Text(text) => {
                    self.seal(&their_keys, f.id, key, &f.path, text, &mut objects_out)?
                }
            };
            if !ours_at.contains(&(f.path.as_str().to_string(), oid)) {
                upserts.push((f.path.clone(), oid));
                changed.insert(f.path.as_str().to_string());
            }
        }
        let upserted: HashSet<String> = upserts
            .iter()
            .map(|(p, _)| p.as_str().to_string())
            .collect();
        for r in &removed {
            if !upserted.contains(r) {
                changed.insert(r.clone());
            }
        }
        let mut git_paths = Vec::new();
        for (path, oid) in &upserts {
            git_paths.push((
                git_path(&self.keys, path).map_err(|_| damaged("a path is too long"))?,
                *oid,
            ));
        }
        for r in removed.iter().filter(|r| !upserted.contains(*r)) {
            let path = MemoryPath::parse_stored(r).map_err(|_| damaged("a stored path"))?;
            edits.remove(&git_path(&self.keys, &path).map_err(|_| damaged("a path is too long"))?);
        }
        for (gp, oid) in &git_paths {
            edits.upsert(gp, *oid);
        }
        let tree = match self.edit_tree(Some(ours), &edits, &mut objects_out) {
            Ok(tree) => tree,
            Err(_) if !full => {
                return self.merge_commits(remote, ours, theirs, base, their_keys, new, true);
            }
            Err(_) => {
                // A path that is a file on one side and a directory on the
                // other in one update: build the whole tree instead.
                let mut all = TreeEdits::memory();
                let mut fresh = Vec::new();
                for f in &finals {
                    let gp =
                        git_path(&self.keys, &f.path).map_err(|_| damaged("a path is too long"))?;
                    let oid = match git_paths.iter().find(|(g, _)| *g == gp) {
                        Some((_, oid)) => *oid,
                        None => match &f.pick {
                            Pick::Blob { oid, .. } => *oid,
                            Pick::Text(_) => return Err(damaged("a merged file was not sealed")),
                        },
                    };
                    all.upsert(&gp, oid);
                }
                let tree = self.edit_tree(None, &all, &mut fresh)?;
                objects_out.extend(fresh);
                tree
            }
        };
        // The key state: ours, with theirs merged in.
        let mut km = key_change(&self.repo, &self.keys, &self.key_state, &their_keys)?;
        if !purged_since.is_empty() {
            // Destroyed here, whichever side held the key; a fetched key
            // state holding it is pruned.
            km.change.files.retain(|(id, _)| !purged_since.contains(id));
            km.change
                .files
                .extend(purged_since.iter().map(|id| (*id, None)));
            km.stale += 1;
        }
        // Erasures the other side's commits record (a purge, an expiry)
        // whose keys its key state still holds (put back there, or pushed
        // by a machine that had not heard of them): destroyed here all the
        // same. An erasure on either side wins, by its record too.
        let recorded: Vec<FileKeyId> = theirs_erasures
            .purged
            .iter()
            .chain(&theirs_erasures.expired)
            .filter(|id| !self.key_state.erased.contains(id) && !their_keys.erased.contains(id))
            .filter(|id| !km.change.files.iter().any(|(x, k)| x == *id && k.is_none()))
            .copied()
            .collect();
        if !recorded.is_empty() {
            km.change.files.retain(|(id, _)| !recorded.contains(id));
            km.change
                .files
                .extend(recorded.iter().map(|id| (*id, None)));
            km.erased += recorded.len();
            km.stale += 1;
        }
        let erased = km.erased;
        let stale = km.stale;
        if stale > 0 {
            // Replaced by the merged state, and holding keys erased here.
            crate::vault::keys::note_garbage(&self.repo, their_keys.commit);
        }
        let mut change = km.change;
        change.files.extend(new_keys);
        let (slots, settings, notes) =
            self.merge_slots_and_settings(&own_line, new, &their_keys)?;
        change.slots = slots;
        change.settings = settings;
        change.bump = true;
        change.merge_parent = Some(their_keys.commit);
        self.key_state.counter = self.key_state.counter.max(their_keys.counter);
        let mut meta: CommitMeta = self.new_meta("merge");
        meta.files = changed.iter().cloned().collect();
        meta.merged = self.newest_first(theirs, new)?;
        meta.details = vec![format!("from remote {remote}"), format!("merged {theirs}")];
        meta.details.extend(notes);
        for (file, copy) in &conflicts {
            meta.details.push(format!(
                "conflict: {file} kept, the other side's version at {copy}"
            ));
        }
        for file in &under_erased {
            meta.details.push(format!(
                "new from the other side where this side erased: {file}"
            ));
        }
        for (file, kinds) in &redacted {
            meta.details.push(format!(
                "secret filter: the merged text of {file} held {}, redacted",
                crate::redact::secrets_phrase(kinds)
            ));
        }
        for (file, old, new) in &kept_over_expiry {
            meta.details.push(format!(
                "edited on one side after the other expired it: {file} kept, under a new key"
            ));
            // Read back by later merges: a purge of the old key on a third
            // machine takes the new one too.
            meta.details
                .push(format!("{REKEYED}{} -> {}", old.to_hex(), new.to_hex()));
        }
        if erased > 0 || stale > 0 {
            // The prune that follows is owed even if this process dies
            // before it (see `mark_prune_pending`).
            self.mark_prune_pending()?;
        }
        self.publish_with(Some(ours), Some(theirs), tree, change, &meta, objects_out)?;
        Ok(Merged {
            what: "merged",
            files: meta.files,
            conflicts,
            erased,
            stale,
            under_erased,
            kept_over_expiry: kept_over_expiry.into_iter().map(|(p, _, _)| p).collect(),
            redacted,
        })
    }

    /// `at`, a version of the file `id` that the other side expired, as a
    /// file of its own: its text under a new file key.
    fn rekeyed(&self, theirs: &KeyState, at: &At, ours: bool) -> Result<Final, VaultError> {
        Ok(Final {
            id: FileKeyId::generate(),
            new_key: true,
            redacted: Vec::new(),
            copy: false,
            beside: None,
            path: at.path.clone(),
            pick: Pick::Text(self.text_of(theirs, at)?),
            ours,
        })
    }

    /// What the erasures among `commits` destroyed, and the keys their
    /// merges gave edits kept over an expiry.
    fn erasures_in(&self, commits: impl IntoIterator<Item = Oid>) -> Result<Erasures, VaultError> {
        let mut out = Erasures::default();
        let mut expired = HashSet::new();
        for id in commits {
            let meta = self.meta_of(id)?;
            let ids = || {
                meta.erased_keys
                    .iter()
                    .filter_map(|k| FileKeyId::from_hex(k))
            };
            match meta.op.as_str() {
                "expire" => expired.extend(ids()),
                "purge" => {
                    out.purged.extend(ids());
                    out.purge_kept.extend(rekeys(&meta.details));
                }
                "merge" => out.rekeyed.extend(rekeys(&meta.details)),
                _ => {}
            }
        }
        out.expired = expired.difference(&out.purged).copied().collect();
        Ok(out)
    }

    /// Where this side's own line stops: the merge base, and the commits
    /// the fetch did not bring that the new ones build on.
    fn known_before(
        &self,
        new: &BTreeSet<Oid>,
        base: Option<Oid>,
    ) -> Result<HashSet<Oid>, VaultError> {
        let mut stop: HashSet<Oid> = base.into_iter().collect();
        for &c in new {
            for p in self.repo.find_commit(c)?.parent_ids() {
                if !new.contains(&p) {
                    stop.insert(p);
                }
            }
        }
        Ok(stop)
    }

    /// The paths this side's purges (the path, and what is below it) and
    /// expiries (each file) name, from `ours` back to `base` (at most
    /// 100,000 commits, first parents).
    fn erased_paths_since(
        &self,
        ours: Oid,
        base: Option<Oid>,
    ) -> Result<Vec<(MemoryPath, bool)>, VaultError> {
        let mut out = Vec::new();
        let mut at = Some(ours);
        let mut steps = 0;
        while let Some(id) = at {
            if Some(id) == base || steps > 100_000 {
                break;
            }
            steps += 1;
            let meta = self.meta_of(id)?;
            match meta.op.as_str() {
                "purge" => {
                    if let Some(p) = meta
                        .path
                        .as_deref()
                        .and_then(|p| MemoryPath::parse_stored(p).ok())
                    {
                        out.push((p, true));
                    }
                }
                "expire" => out.extend(
                    meta.files
                        .iter()
                        .filter_map(|p| MemoryPath::parse_stored(p).ok())
                        .map(|p| (p, false)),
                ),
                _ => {}
            }
            at = self.first_parent(id)?;
        }
        Ok(out)
    }

    /// Both sides hold the file `id`: its merged content at `path`.
    #[allow(clippy::too_many_arguments)]
    fn merge_one(
        &self,
        their_keys: &KeyState,
        id: FileKeyId,
        x: &At,
        y: &At,
        base: Option<&At>,
        path: MemoryPath,
        finals: &mut Vec<Final>,
    ) -> Result<(), VaultError> {
        if x.path == y.path && x.blob == y.blob && path == x.path {
            // The same on both sides: nothing to read.
            finals.push(keep(id, x, true));
            return Ok(());
        }
        let ours = self.text_of(their_keys, x)?;
        let theirs = self.text_of(their_keys, y)?;
        // A side's stored blob where it sits at the merged path, else its
        // text to seal there anew.
        let side = |at: &At, text: Zeroizing<Vec<u8>>| {
            if path == at.path {
                Pick::Blob {
                    oid: at.blob,
                    sealed_at: at.path.clone(),
                    sealed_with: at.key,
                }
            } else {
                Pick::Text(text)
            }
        };
        let base_text = match base {
            Some(b) => Some(self.text_of(their_keys, b)?),
            None => None,
        };
        let mut redacted = Vec::new();
        let pick = if ours == theirs {
            if path == y.path {
                side(y, theirs)
            } else {
                side(x, ours)
            }
        } else if base_text.as_ref() == Some(&ours) {
            side(y, theirs)
        } else if base_text.as_ref() == Some(&theirs) {
            side(x, ours)
        } else {
            let empty = Zeroizing::new(Vec::new());
            // A clean merge is a text neither side wrote, so neither side's
            // filter saw it: filtered here as a whole file written at the
            // tip is (a secret completed from the two sides' parts is
            // redacted; where the filter refuses secrets, the two versions
            // stay apart, as in a conflict).
            let merged = match three_way(base_text.as_ref().unwrap_or(&empty), &ours, &theirs)? {
                Some(merged) => self.filter_merged(merged)?,
                None => None,
            };
            match merged {
                Some((merged, kinds)) => {
                    redacted = kinds;
                    Pick::Text(merged)
                }
                None => {
                    // Theirs beside it, under a new key (placed by `place`).
                    finals.push(Final {
                        id: FileKeyId::generate(),
                        new_key: true,
                        redacted: Vec::new(),
                        copy: true,
                        beside: Some(path.clone()),
                        path: conflict_name(&path, 1)?,
                        pick: Pick::Text(theirs),
                        ours: false,
                    });
                    side(x, ours)
                }
            }
        };
        finals.push(Final {
            id,
            new_key: false,
            redacted,
            copy: false,
            beside: None,
            path,
            pick,
            ours: true,
        });
        Ok(())
    }

    /// A merged text through this vault's secret filter: the text to keep
    /// (redacted if it held a secret) and the kinds taken out; None where
    /// the filter refuses text holding a secret and this one does. A text
    /// that is not UTF-8 is kept as it is (the filter reads text).
    #[allow(clippy::type_complexity)]
    fn filter_merged(
        &self,
        merged: Zeroizing<Vec<u8>>,
    ) -> Result<Option<(Zeroizing<Vec<u8>>, Vec<(String, u32)>)>, VaultError> {
        use crate::redact::{Mode, Redactor};
        let settings = &self.config().redaction;
        if settings.mode == Mode::Off {
            return Ok(Some((merged, Vec::new())));
        }
        let Ok(text) = std::str::from_utf8(&merged) else {
            return Ok(Some((merged, Vec::new())));
        };
        let filter = Redactor::new(settings)
            .map_err(|_| damaged("the secret filter's settings do not compile"))?;
        let (redacted, kinds) = filter.redact_text(text);
        if kinds.is_empty() {
            return Ok(Some((merged, kinds)));
        }
        if settings.mode == Mode::Reject {
            return Ok(None);
        }
        let redacted = Zeroizing::new(redacted.into_owned().into_bytes());
        Ok(Some((redacted, kinds)))
    }

    /// Seal `plain` for `path` with the key `id` (`key`: a new one) and
    /// stage the blob.
    fn seal(
        &self,
        theirs: &KeyState,
        id: FileKeyId,
        key: Option<&FileKey>,
        path: &MemoryPath,
        plain: &[u8],
        out: &mut Vec<super::super::wal::Object>,
    ) -> Result<Oid, VaultError> {
        let key = match key {
            Some(k) => k,
            None => match self.key_state.file_key(&self.repo, &self.keys, &id)? {
                Some(k) => k,
                None => theirs
                    .file_key(&self.repo, &self.keys, &id)?
                    .ok_or_else(|| damaged("a merged file's key is in neither key state"))?,
            },
        };
        let sealed = crypto::seal_blob(key, &id, path.as_str(), plain);
        stage_blob(&self.repo, sealed, out)
    }

    /// The keyslots and settings of a merge (None: ours unchanged), and
    /// notes for the commit.
    #[allow(clippy::type_complexity)]
    fn merge_slots_and_settings(
        &self,
        own_line: &[Oid],
        new: &BTreeSet<Oid>,
        their_keys: &KeyState,
    ) -> Result<
        (
            Option<BTreeMap<String, Vec<u8>>>,
            Option<super::super::VaultConfig>,
            Vec<String>,
        ),
        VaultError,
    > {
        let mut notes = Vec::new();
        let (our_ops, our_removed) = self.ops_of(own_line.iter().copied())?;
        let (their_ops, their_removed) = self.ops_of(new.iter().copied())?;
        let mut slots = None;
        if self.key_state.slots != their_keys.slots {
            let mut merged = self.key_state.slots.clone();
            for (name, bytes) in &their_keys.slots {
                merged.entry(name.clone()).or_insert_with(|| bytes.clone());
            }
            for gone in our_removed.iter().chain(&their_removed) {
                merged.remove(gone);
            }
            if merged.is_empty() {
                return Err(damaged("a merge would leave no keyslot"));
            }
            if merged != self.key_state.slots {
                notes.push("keyslots merged (removals on either side kept)".to_string());
                slots = Some(merged);
            }
        }
        let mut settings = None;
        if their_keys.settings != self.key_state.settings {
            let theirs_changed = their_ops.contains("config");
            let ours_changed = our_ops.contains("config");
            if theirs_changed && !ours_changed {
                settings = their_keys.settings.clone();
                notes.push("settings taken from the other side".to_string());
            } else if theirs_changed {
                notes.push("settings changed on both sides: this side's kept".to_string());
            }
        }
        Ok((slots, settings, notes))
    }

    /// The commits of `new`, from `tip` back (breadth first: newest
    /// first on each line), as hex ids.
    fn newest_first(&self, tip: Oid, new: &BTreeSet<Oid>) -> Result<Vec<String>, VaultError> {
        let mut out = Vec::new();
        let mut queue = std::collections::VecDeque::from([tip]);
        let mut seen = HashSet::from([tip]);
        while let Some(id) = queue.pop_front() {
            if !new.contains(&id) {
                continue;
            }
            out.push(id.to_string());
            objects::check(&self.repo, id)?;
            for p in self.repo.find_commit(id)?.parent_ids() {
                if seen.insert(p) {
                    queue.push_back(p);
                }
            }
        }
        Ok(out)
    }

    /// The operations of `commits`, and the keyslots they removed or
    /// replaced.
    fn ops_of(
        &self,
        commits: impl IntoIterator<Item = Oid>,
    ) -> Result<(HashSet<String>, HashSet<String>), VaultError> {
        let mut ops = HashSet::new();
        let mut removed = HashSet::new();
        for id in commits {
            let meta = self.meta_of(id)?;
            for d in &meta.details {
                if let Some(slot) = d.strip_prefix("removed keyslot ") {
                    removed.insert(slot.to_string());
                }
                if let Some(rest) = d.strip_prefix("replaced keyslot ")
                    && let Some((slot, _)) = rest.split_once(" by ")
                {
                    removed.insert(slot.to_string());
                }
            }
            ops.insert(meta.op);
        }
        Ok((ops, removed))
    }

    /// This side's commits since the merge: its first-parent line from
    /// `tip` down to `stop` (the base, or a commit theirs builds on), at
    /// most `limit`.
    fn own_line(
        &self,
        tip: Oid,
        stop: &HashSet<Oid>,
        limit: usize,
    ) -> Result<Vec<Oid>, VaultError> {
        let mut out = Vec::new();
        let mut at = Some(tip);
        while let Some(id) = at {
            if stop.contains(&id) || out.len() >= limit {
                break;
            }
            out.push(id);
            at = self.first_parent(id)?;
        }
        Ok(out)
    }
}

/// The `rekeyed OLD -> NEW` pairs among a commit's details.
fn rekeys(details: &[String]) -> impl Iterator<Item = (FileKeyId, FileKeyId)> + '_ {
    details.iter().filter_map(|d| {
        let (old, new) = d.strip_prefix(REKEYED)?.split_once(" -> ")?;
        Some((FileKeyId::from_hex(old)?, FileKeyId::from_hex(new)?))
    })
}

/// A file one side's purge kept under a new key (`kept`: old -> new),
/// as the other side and the base know it under the old key: their
/// versions are taken as versions of the new file, still sealed with the
/// old key (read with it, sealed anew), so an edit the other side made
/// meanwhile merges with the kept file (and a delete deletes it) rather
/// than going with the purged key. A version is paired with the kept
/// file at the same path in the base, or with the only one the old key
/// had there.
fn follow_purge_keeps(
    kept: &[(FileKeyId, FileKeyId)],
    purging: &Side,
    other: &mut Side,
    base: &mut Side,
) {
    // Purges of a file kept by an earlier one chain its keys (K0 -> K1,
    // then K1 -> K2), in whatever order their commits were read: followed
    // until nothing moves.
    for _ in 0..=kept.len() {
        if !follow_once(kept, purging, other, base) {
            break;
        }
    }
}

/// One pass of [`follow_purge_keeps`]: whether it moved anything.
fn follow_once(
    kept: &[(FileKeyId, FileKeyId)],
    purging: &Side,
    other: &mut Side,
    base: &mut Side,
) -> bool {
    let mut moved = false;
    for (old, new) in kept {
        let at_base: Vec<u32> = base
            .keys()
            .filter(|(id, _)| id == old)
            .map(|(_, r)| *r)
            .collect();
        let kept_path = purging.get(&(*new, 0)).map(|at| at.path.clone());
        let rank = match at_base.as_slice() {
            [only] => Some(*only),
            several => several.iter().copied().find(|r| {
                kept_path
                    .as_ref()
                    .is_some_and(|p| base.get(&(*old, *r)).is_some_and(|at| at.path == *p))
            }),
        };
        let Some(rank) = rank else { continue };
        if base.contains_key(&(*new, 0)) || other.contains_key(&(*new, 0)) {
            continue;
        }
        if let Some(at) = base.remove(&(*old, rank)) {
            base.insert((*new, 0), at);
            moved = true;
        }
        if let Some(at) = other.remove(&(*old, rank)) {
            other.insert((*new, 0), at);
            moved = true;
        }
    }
    moved
}

fn keep(id: FileKeyId, at: &At, ours: bool) -> Final {
    Final {
        id,
        new_key: false,
        redacted: Vec::new(),
        copy: false,
        beside: None,
        path: at.path.clone(),
        pick: Pick::Blob {
            oid: at.blob,
            sealed_at: at.path.clone(),
            sealed_with: at.key,
        },
        ours,
    }
}

/// A three-way merge of text: Some(merged) when clean.
fn three_way(
    base: &[u8],
    ours: &[u8],
    theirs: &[u8],
) -> Result<Option<Zeroizing<Vec<u8>>>, VaultError> {
    // git2's merge_file does not initialise libgit2 itself (in a vault
    // something always has; a process that only merges text has not).
    drop(git2::Buf::new());
    let mut a = git2::MergeFileInput::new();
    a.content(base);
    let mut o = git2::MergeFileInput::new();
    o.content(ours);
    let mut t = git2::MergeFileInput::new();
    t.content(theirs);
    let result = git2::merge_file(&a, &o, &t, None).map_err(|_| damaged("a text merge failed"))?;
    if !result.is_automergeable() {
        return Ok(None);
    }
    Ok(Some(Zeroizing::new(result.content().to_vec())))
}

/// `<dir>/<stem>.conflict-<n>.<ext>` (or `<name>.conflict-<n>` without an
/// extension). Where that name would be longer than a name or path may
/// be, the stem keeps as much of its start as fits (then the extension
/// goes too, if it alone leaves no room); refused only when the directory
/// leaves no room for a name at all.
fn conflict_name(path: &MemoryPath, n: u32) -> Result<MemoryPath, VaultError> {
    let parent = path.parent().ok_or_else(|| damaged("a file at the root"))?;
    let name = path.name().unwrap_or("file");
    let forms: Vec<(&str, String)> = match name.rsplit_once('.') {
        Some((stem, ext)) if !stem.is_empty() => vec![
            (stem, format!(".conflict-{n}.{ext}")),
            (name, format!(".conflict-{n}")),
        ],
        _ => vec![(name, format!(".conflict-{n}"))],
    };
    for (stem, tail) in &forms {
        // Whole, then cut at each character boundary from the end.
        let cuts = std::iter::once(stem.len())
            .chain(stem.char_indices().rev().map(|(at, _)| at))
            .filter(|&at| at > 0);
        for at in cuts {
            let name = format!("{}{tail}", &stem[..at]);
            // A cut can make a secret of what was none (`…AKIA…` cut
            // to twenty characters): such a name is passed over.
            if at < stem.len() && name_holds_secret(&name) {
                continue;
            }
            if let Ok(copy) = parent.join(&name) {
                return Ok(copy);
            }
        }
    }
    Err(VaultError::Refused(format!(
        "a sync needs a conflict copy of {path} and its directory leaves no room for one more name (paths are at most {} bytes): rename or move that file on either machine, then sync again; nothing was changed",
        crate::memory::path::MAX_PATH_BYTES
    )))
}

/// Whether the secret filter's built-in rules find a secret in `name`.
fn name_holds_secret(name: &str) -> bool {
    static FILTER: std::sync::OnceLock<Option<crate::redact::Redactor>> =
        std::sync::OnceLock::new();
    FILTER
        .get_or_init(|| crate::redact::Redactor::new(&crate::redact::RedactConfig::default()).ok())
        .as_ref()
        .is_some_and(|f| !f.scan(name).is_empty())
}

/// The file a conflict copy sits beside, if `path` is a conflict copy's
/// name (`<stem>.conflict-<n>.<ext>` or `<name>.conflict-<n>`).
pub(crate) fn original_of(path: &str) -> Option<String> {
    let (dir, name) = path.rsplit_once('/')?;
    let parts: Vec<&str> = name.split('.').collect();
    let at = parts.iter().position(|part| {
        part.strip_prefix("conflict-")
            .is_some_and(|n| !n.is_empty() && n.bytes().all(|b| b.is_ascii_digit()))
    })?;
    if at == 0 {
        return None;
    }
    let kept: Vec<&str> = parts
        .iter()
        .enumerate()
        .filter(|(i, _)| *i != at)
        .map(|(_, p)| *p)
        .collect();
    Some(format!("{dir}/{}", kept.join(".")))
}

/// Give every final file a path of its own: ours first, then theirs; a
/// file whose path is taken (by a file, or as a directory), or below a
/// path taken by a file, moves to a conflict copy's name. Returns the
/// (original path, copy) pairs of theirs that moved, and of each content
/// conflict.
fn place(
    finals: &mut [Final],
    taken: &dyn Fn(&MemoryPath) -> Result<bool, VaultError>,
) -> Result<Vec<(String, String)>, VaultError> {
    let mut order: Vec<usize> = (0..finals.len()).collect();
    // Ours before theirs, and a content conflict's copy after everything.
    order.sort_by_key(|&i| {
        (
            !finals[i].ours,
            finals[i].copy,
            finals[i].path.as_str().to_string(),
        )
    });
    let mut files: HashSet<String> = HashSet::new();
    let mut dirs: HashSet<String> = HashSet::new();
    let mut moves = Vec::new();
    for i in order {
        // A conflict copy: named after the file it sits beside.
        let wanted = finals[i]
            .beside
            .clone()
            .unwrap_or_else(|| finals[i].path.clone());
        let mut path = finals[i].path.clone();
        // A conflict copy's own name is already its first.
        let mut n = u32::from(finals[i].copy);
        // What holds the place it wanted: that path, or a file standing
        // where one of its folders would be (the report names it).
        let mut holder = wanted.clone();
        loop {
            // A name of its own is never taken by a file the merge did
            // not look at (that file would be at the same place on this
            // file's side); a new name may be.
            let free = !files.contains(path.as_str())
                && !dirs.contains(path.as_str())
                && !path.ancestors().any(|a| files.contains(a.as_str()))
                && (n == 0 || !taken(&path)?);
            if free {
                break;
            }
            n += 1;
            if n > 1000 {
                return Err(damaged("no free name for a conflict copy"));
            }
            // A file in the way above the wanted path: rename the topmost
            // such segment; else the file itself.
            let blocker = wanted
                .ancestors()
                .filter(|a| files.contains(a.as_str()))
                .last();
            path = match blocker {
                Some(b) => {
                    let moved = conflict_name(&b, n)?;
                    let path = wanted
                        .rebase(&b, &moved)
                        .ok_or_else(|| damaged("no room for a conflict copy's name"))?;
                    holder = b;
                    path
                }
                None => conflict_name(&wanted, n)?,
            };
        }
        if path != finals[i].path || finals[i].copy {
            moves.push((holder.as_str().to_string(), path.as_str().to_string()));
        }
        for a in path.ancestors() {
            dirs.insert(a.as_str().to_string());
        }
        files.insert(path.as_str().to_string());
        finals[i].path = path;
    }
    Ok(moves)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn conflict_copies_are_named_beside_their_file_and_recognised() {
        let p = MemoryPath::parse("/memories/notes/todo.md").unwrap();
        let c = conflict_name(&p, 1).unwrap();
        assert_eq!(c.as_str(), "/memories/notes/todo.conflict-1.md");
        assert_eq!(original_of(c.as_str()).as_deref(), Some(p.as_str()));
        let bare = conflict_name(&MemoryPath::parse("/memories/README").unwrap(), 2).unwrap();
        assert_eq!(bare.as_str(), "/memories/README.conflict-2");
        // A name at the limit keeps the start of its stem, and its
        // extension.
        let long = format!("/memories/{}é.md", "n".repeat(122));
        let c = conflict_name(&MemoryPath::parse(&long).unwrap(), 1).unwrap();
        let name = c.name().unwrap();
        assert!(name.len() <= 127, "{name}");
        assert!(
            name.starts_with("nnnn") && name.ends_with(".conflict-1.md"),
            "{name}"
        );
        assert_eq!(
            original_of(c.as_str()).unwrap().len() + ".conflict-1".len(),
            c.as_str().len()
        );
        let at_limit = format!("/memories/{}.md", "n".repeat(124));
        let c = conflict_name(&MemoryPath::parse(&at_limit).unwrap(), 1).unwrap();
        assert_eq!(
            c.name().unwrap(),
            format!("{}.conflict-1.md", "n".repeat(113))
        );
        // A cut that would leave an access key id is passed over.
        let sneaky = format!("/memories/{}-AKIAZ3MHQK7R2XW5TJ4NQQQQ7x.md", "n".repeat(92));
        assert!(!name_holds_secret(&sneaky));
        assert!(name_holds_secret(&format!(
            "{}-AKIAZ3MHQK7R2XW5TJ4N.conflict-1.md",
            "n".repeat(92)
        )));
        let c = conflict_name(&MemoryPath::parse(&sneaky).unwrap(), 1).unwrap();
        assert!(!name_holds_secret(c.name().unwrap()), "{}", c.as_str());
        assert!(c.name().unwrap().len() <= 127, "{}", c.as_str());
        // An extension that leaves no room goes too.
        let long_ext = format!("/memories/a.{}", "e".repeat(125));
        let c = conflict_name(&MemoryPath::parse(&long_ext).unwrap(), 1).unwrap();
        assert!(c.name().unwrap().ends_with(".conflict-1"), "{}", c.as_str());
        assert_eq!(
            original_of(bare.as_str()).as_deref(),
            Some("/memories/README")
        );
        assert_eq!(original_of("/memories/conflict-resolution.md"), None);
        assert_eq!(original_of("/memories/notes.conflicts-1.md"), None);
    }

    #[test]
    fn a_clean_text_merge_keeps_both_edits_and_a_clash_is_reported() {
        let base = b"one\ntwo\nthree\nfour\nfive\n";
        let ours = b"ONE\ntwo\nthree\nfour\nfive\n";
        let theirs = b"one\ntwo\nthree\nfour\nFIVE\n";
        let merged = three_way(base, ours, theirs).unwrap().unwrap();
        assert_eq!(&merged[..], b"ONE\ntwo\nthree\nfour\nFIVE\n");
        assert!(three_way(base, b"uno\n", b"eins\n").unwrap().is_none());
    }

    #[test]
    fn two_files_at_one_path_each_get_a_place() {
        let id = FileKeyId::generate;
        let p = |s: &str| MemoryPath::parse(s).unwrap();
        let blob = |s: &str| Pick::Blob {
            oid: Oid::ZERO_SHA1,
            sealed_at: p(s),
            sealed_with: FileKeyId([0; 16]),
        };
        let mut finals = vec![
            Final {
                id: id(),
                new_key: false,
                redacted: Vec::new(),
                copy: false,
                beside: None,
                path: p("/memories/a.md"),
                pick: blob("/memories/a.md"),
                ours: false,
            },
            Final {
                id: id(),
                new_key: false,
                redacted: Vec::new(),
                copy: false,
                beside: None,
                path: p("/memories/a.md"),
                pick: blob("/memories/a.md"),
                ours: true,
            },
            Final {
                id: id(),
                new_key: false,
                redacted: Vec::new(),
                copy: false,
                beside: None,
                path: p("/memories/a.md/b.md"),
                pick: blob("/memories/a.md/b.md"),
                ours: false,
            },
        ];
        let moves = place(&mut finals, &|_| Ok(false)).unwrap();
        assert_eq!(finals[1].path.as_str(), "/memories/a.md");
        assert_eq!(finals[0].path.as_str(), "/memories/a.conflict-1.md");
        assert_eq!(finals[2].path.as_str(), "/memories/a.conflict-2.md/b.md");
        assert_eq!(moves.len(), 2);
    }
}
