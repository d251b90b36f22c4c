//! Reading history: walking main lazily, naming revisions, and the files
//! one commit changed (by comparing encrypted trees, then decrypting the
//! names of what differs).

use std::collections::BTreeMap;
use std::path::Path;

use git2::{DiffOptions, Oid};

use super::index::{Entry, Index};
use crate::memory::MemoryPath;
use crate::vault::CommitMeta;
use crate::vault::objects;
use crate::vault::tree::{fanned_git_path, is_bucket};
use crate::vault::{Rev, Vault, VaultError, damaged};

/// One file whose stored blob differs between two trees.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FileChange {
    /// The decrypted memory path.
    pub path: MemoryPath,
    /// The encrypted git path (stable for a given path and vault key).
    pub(crate) git_path: String,
    /// The blob in the older tree (None: the file did not exist).
    pub(crate) old: Option<Oid>,
    /// The blob in the newer tree (None: the file does not exist).
    pub(crate) new: Option<Oid>,
}

impl FileChange {
    /// The file existed in the older tree.
    pub fn existed_before(&self) -> bool {
        self.old.is_some()
    }

    /// The file exists in the newer tree.
    pub fn exists_after(&self) -> bool {
        self.new.is_some()
    }
}

/// Commits read from git before the walk looks in the history index: a
/// first page of history never pays for loading the index.
const GIT_FIRST: usize = 256;

/// Main, newest first, one commit at a time: from git for the newest
/// commits, then from the history index once the walk reaches a commit the
/// index holds (see `index`). The metadata a walk yields has no
/// `content_hash` or `key_id`; [`Vault::commit_meta`] has them.
pub struct Walk<'v> {
    vault: &'v Vault,
    next: Option<Oid>,
    /// Commits read from git so far, newest first.
    from_git: Vec<Entry>,
    index: Option<Index>,
    /// Reading from the index: entries `..pos` are still to come.
    index_pos: Option<usize>,
    /// Commits a merge just yielded brought in from another machine, to
    /// yield next (newest first), and every one queued so far.
    merged: std::collections::VecDeque<Oid>,
    merged_seen: std::collections::HashSet<Oid>,
}

impl Walk<'_> {
    fn yield_indexed(&mut self, pos: usize) -> Option<Result<(Rev, CommitMeta), VaultError>> {
        let index = self.index.as_mut()?;
        if pos == 0 {
            self.index_pos = Some(0);
            return None;
        }
        // Each entry is yielded once: move its metadata out.
        let e = &mut index.entries[pos - 1];
        self.index_pos = Some(pos - 1);
        let id = Oid::from_str(&e.id).ok()?;
        self.next = e.parent.as_deref().and_then(|p| Oid::from_str(p).ok());
        Some(Ok((Rev::from_oid(id), std::mem::take(&mut e.meta))))
    }

    fn newest_first_to_oldest(&self) -> Vec<Entry> {
        self.from_git.iter().rev().cloned().collect()
    }

    /// After a merge: the commits it brought in, to yield next.
    fn queue_merged(&mut self, meta: &CommitMeta) {
        for c in meta.merged.iter().filter_map(|h| Oid::from_str(h).ok()) {
            if self.merged_seen.insert(c) {
                self.merged.push_back(c);
            }
        }
    }

    /// One commit a merge brought in: its metadata, opened as the walk
    /// opens every commit's.
    fn read_merged(&mut self, id: Oid) -> Result<(Rev, CommitMeta), VaultError> {
        let (tree, parent, message) = self.vault.read_commit(id)?;
        let mut meta = self.vault.open_meta_message(tree, parent, &message)?;
        meta.content_hash = None;
        meta.key_id = None;
        self.queue_merged(&meta);
        Ok((Rev::from_oid(id), meta))
    }

    /// The next commit on main's first-parent line.
    fn next_on_main(&mut self) -> Option<Result<(Rev, CommitMeta), VaultError>> {
        self.next_on_main_impl()
    }
}

impl Iterator for Walk<'_> {
    type Item = Result<(Rev, CommitMeta), VaultError>;

    /// Main's first-parent line, newest first; after each merge, the
    /// commits it brought in from the other machine (newest first).
    fn next(&mut self) -> Option<Self::Item> {
        if let Some(id) = self.merged.pop_front() {
            return Some(self.read_merged(id));
        }
        let item = self.next_on_main()?;
        if let Ok((_, meta)) = &item {
            self.queue_merged(meta);
        }
        Some(item)
    }
}

impl Walk<'_> {
    fn next_on_main_impl(&mut self) -> Option<Result<(Rev, CommitMeta), VaultError>> {
        if let Some(pos) = self.index_pos {
            return self.yield_indexed(pos);
        }
        let id = self.next.take()?;
        if self.from_git.len() >= GIT_FIRST {
            if self.index.is_none() {
                self.index = Some(self.vault.read_index());
            }
            let found = self
                .index
                .as_ref()
                .and_then(|i| i.position.get(&id).copied());
            if let Some(p) = found {
                // Reached by walking main: the index is good from here down.
                let newer = self.newest_first_to_oldest();
                if let Some(index) = &self.index {
                    self.vault.extend_index(index, p + 1, &newer);
                }
                self.from_git.clear();
                return self.yield_indexed(p + 1);
            }
        }
        let item = self
            .vault
            .read_commit(id)
            .and_then(|(tree, parent, message)| {
                // The walk relies on the metadata's AEAD, which binds it to this
                // commit's tree and parent: only a key holder can have written
                // it. The tip's MAC was checked when the walk began; `verify`
                // checks every MAC.
                let mut meta = self.vault.open_meta_message(tree, parent, &message)?;
                // Walks carry what history needs; the per-file content hash and
                // key id stay in the commit (see `commit_meta`).
                meta.content_hash = None;
                meta.key_id = None;
                self.next = parent;
                self.from_git.push(Entry {
                    id: id.to_string(),
                    parent: parent.map(|p| p.to_string()),
                    meta: meta.clone(),
                });
                if parent.is_none() && self.from_git.len() >= GIT_FIRST {
                    // All of main came from git: write the index afresh.
                    let all = self.newest_first_to_oldest();
                    let empty = self.index.take().unwrap_or_else(|| self.vault.read_index());
                    self.vault.extend_index(&empty, 0, &all);
                    self.from_git.clear();
                }
                Ok((Rev::from_oid(id), meta))
            });
        Some(item)
    }
}

impl Vault {
    /// Refuse an object libgit2 must not read (see `objects::check`).
    pub(crate) fn check_object(&self, id: Oid) -> Result<(), VaultError> {
        Ok(objects::check(&self.repo, id)?)
    }

    /// A commit's tree, first parent and message, reading the object once.
    /// Loose commits are inflated and parsed here (no second read by
    /// libgit2); packed ones are read through libgit2.
    pub(crate) fn read_commit(&self, id: Oid) -> Result<(Oid, Option<Oid>, Vec<u8>), VaultError> {
        let bad = || damaged("a commit is unreadable");
        let loose = objects::read_loose(&self.repo, id)?;
        let Some((kind, body)) = loose else {
            let c = objects::find_commit(&self.repo, id)?;
            return Ok((
                c.tree_id(),
                c.parent_ids().next(),
                c.message_bytes().to_vec(),
            ));
        };
        if kind != git2::ObjectType::Commit {
            return Err(bad());
        }
        let split = body.windows(2).position(|w| w == b"\n\n").ok_or_else(bad)?;
        let (headers, message) = (&body[..split], &body[split + 2..]);
        let mut tree = None;
        let mut parent = None;
        for line in headers.split(|&b| b == b'\n') {
            let hex = |rest: &[u8]| {
                std::str::from_utf8(rest)
                    .ok()
                    .and_then(|h| Oid::from_str(h).ok())
            };
            if let Some(rest) = line.strip_prefix(b"tree ") {
                tree = hex(rest);
            } else if let Some(rest) = line.strip_prefix(b"parent ")
                && parent.is_none()
            {
                parent = Some(hex(rest).ok_or_else(bad)?);
            }
        }
        Ok((tree.ok_or_else(bad)?, parent, message.to_vec()))
    }

    /// Open the sealed metadata in a commit message, bound to its tree and
    /// parent.
    pub(crate) fn open_meta_message(
        &self,
        tree: Oid,
        parent: Option<Oid>,
        message: &[u8],
    ) -> Result<CommitMeta, VaultError> {
        let sealed = data_encoding::BASE64
            .decode(message.trim_ascii())
            .map_err(|_| damaged("commit metadata does not decode"))?;
        let plain = self
            .keys
            .open_meta(&crate::vault::meta::meta_aad(tree, parent), &sealed)
            .map_err(|_| damaged("commit metadata failed to decrypt"))?;
        crate::vault::meta::decode(&plain).ok_or_else(|| damaged("commit metadata does not parse"))
    }

    /// Walk main from its tip, newest first.
    pub fn walk(&mut self) -> Result<Walk<'_>, VaultError> {
        let tip = self.refresh()?;
        Ok(Walk {
            vault: self,
            next: tip,
            from_git: Vec::new(),
            index: None,
            index_pos: None,
            merged: Default::default(),
            merged_seen: Default::default(),
        })
    }

    /// The first parent of a commit (main is linear).
    pub fn parent_of(&self, rev: Rev) -> Result<Option<Rev>, VaultError> {
        Ok(self.first_parent(rev.oid())?.map(Rev::from_oid))
    }

    /// [`parent_of`](Self::parent_of) by git's id.
    pub(crate) fn first_parent(&self, id: Oid) -> Result<Option<Oid>, VaultError> {
        Ok(self.read_commit(id)?.1)
    }

    /// Resolve a revision as a person types it: a commit id or a prefix of
    /// at least 4 hex digits, `HEAD`, or `HEAD~N`. It must be on main.
    pub fn resolve_rev(&mut self, rev: &str) -> Result<Rev, VaultError> {
        let bad = || VaultError::BadRevision(rev.to_string());
        // Well written, but no commit of main.
        let unknown = || VaultError::UnknownRevision(rev.to_string());
        let tip = self.refresh()?.ok_or_else(unknown)?;
        if let Some(rest) = rev.strip_prefix("HEAD") {
            let back: usize = match rest {
                "" => 0,
                r => r
                    .strip_prefix('~')
                    .filter(|n| !n.is_empty() && n.bytes().all(|b| b.is_ascii_digit()))
                    .ok_or_else(bad)?
                    // More than a count holds: well written, and no commit
                    // is that far back.
                    .parse()
                    .map_err(|_| unknown())?,
            };
            let mut id = tip;
            for _ in 0..back {
                id = self.first_parent(id)?.ok_or_else(unknown)?;
            }
            return Ok(Rev::from_oid(id));
        }
        if rev.len() < 4 || rev.len() > 40 || !rev.bytes().all(|b| b.is_ascii_hexdigit()) {
            return Err(bad());
        }
        // The full id from the index (no object is read), then the object
        // is checked before anything reads it.
        let short = Oid::from_str(&rev.to_ascii_lowercase()).map_err(|_| bad())?;
        let found = self.repo.odb()?.exists_prefix(short, rev.len());
        let id = match found {
            Ok(id) => id,
            // The prefix names more than one object (a commit and a blob
            // of its tree, say): the commits of main it names decide.
            Err(e) if e.code() == git2::ErrorCode::Ambiguous => {
                let prefix = rev.to_ascii_lowercase();
                let mut on_main = Vec::new();
                for item in self.walk()? {
                    let r = item?.0;
                    if r.to_string().starts_with(&prefix) {
                        on_main.push(r);
                    }
                }
                return match on_main.as_slice() {
                    [one] => Ok(*one),
                    [] => Err(unknown()),
                    many => Err(VaultError::Refused(format!(
                        "{rev:?} is the start of {} revisions on main; give more digits",
                        many.len()
                    ))),
                };
            }
            Err(_) => return Err(unknown()),
        };
        let kind = objects::read_header(&self.repo.odb()?, &self.repo, id)?.1;
        if kind != git2::ObjectType::Commit {
            return Err(unknown());
        }
        // On main: met walking main from the tip (main is linear), each
        // commit read through the checked path or the history index.
        let rev = Rev::from_oid(id);
        if id == tip {
            return Ok(rev);
        }
        for item in self.walk()? {
            if item?.0 == rev {
                return Ok(rev);
            }
        }
        Err(unknown())
    }

    /// The decrypted memory path of an encrypted git path.
    pub(crate) fn decrypt_git_path(&self, git_path: &str) -> Result<MemoryPath, VaultError> {
        let mut path = MemoryPath::root();
        for enc in git_path.split('/').filter(|s| !is_bucket(s.as_bytes())) {
            let name = self
                .keys
                .decrypt_name(path.as_str(), enc)
                .map_err(|_| damaged("a stored name failed to decrypt"))?;
            path = path
                .join(&name)
                .map_err(|_| damaged("a stored name is not a valid path"))?;
        }
        Ok(path)
    }

    /// The git path of a memory path ("" for the root).
    pub(crate) fn git_path_of(&self, path: &MemoryPath) -> Result<String, VaultError> {
        crate::vault::tree::git_path(&self.keys, path)
            .map_err(|_| damaged("a path segment is too long to store"))
    }

    /// The files whose blobs differ between the trees of two commits
    /// (None: the empty tree), optionally only at or below `under`, in
    /// git path order.
    pub fn changed_files(
        &self,
        old: Option<Rev>,
        new: Option<Rev>,
        under: Option<&MemoryPath>,
    ) -> Result<Vec<FileChange>, VaultError> {
        self.changed_between(old.map(Rev::oid), new.map(Rev::oid), under)
    }

    /// [`changed_files`](Self::changed_files) by git's ids.
    pub(crate) fn changed_between(
        &self,
        old: Option<Oid>,
        new: Option<Oid>,
        under: Option<&MemoryPath>,
    ) -> Result<Vec<FileChange>, VaultError> {
        // libgit2's diff reads every tree of both sides: check them first.
        for c in [old, new].into_iter().flatten() {
            objects::check_tree_deep(&self.repo, self.read_commit(c)?.0)?;
        }
        let old_tree = self.git_tree_of(old)?;
        let new_tree = self.git_tree_of(new)?;
        let mut opts = DiffOptions::new();
        opts.skip_binary_check(true);
        if let Some(p) = under.filter(|p| !p.is_root()) {
            // Where each side's tree holds it: flat (format 2), under all
            // its buckets (format 3) or some (format 9).
            let mut held = false;
            for c in [old, new] {
                if let (git_path, Some(_)) = self.snapshot_of(c)?.locate(p)? {
                    opts.pathspec(git_path);
                    held = true;
                }
            }
            if !held {
                return Ok(Vec::new());
            }
            opts.disable_pathspec_match(true);
        }
        let diff = self
            .repo
            .diff_tree_to_tree(old_tree.as_ref(), new_tree.as_ref(), Some(&mut opts))
            .map_err(|_| damaged("a tree is unreadable"))?;
        // By file, whatever the form of each side's tree: the migration to
        // format 3 moved every file under buckets and changed none.
        let mut by_file: BTreeMap<String, (Option<Oid>, Option<Oid>)> = BTreeMap::new();
        for delta in diff.deltas() {
            for (side, old) in [(delta.old_file(), true), (delta.new_file(), false)] {
                if !side.exists() {
                    continue;
                }
                let oid = side.id();
                let git_path = side
                    .path()
                    .and_then(Path::to_str)
                    .ok_or_else(|| damaged("a stored name is not text"))?;
                let slot = by_file.entry(fanned_git_path(git_path)).or_default();
                let at = if old { &mut slot.0 } else { &mut slot.1 };
                if at.replace(oid).is_some() {
                    return Err(damaged("a tree names one file twice"));
                }
            }
        }
        let mut out = Vec::new();
        for (git_path, (old, new)) in by_file {
            if old == new {
                continue;
            }
            out.push(FileChange {
                path: self.decrypt_git_path(&git_path)?,
                git_path,
                old,
                new,
            });
        }
        Ok(out)
    }

    /// The files one commit changed, compared with its parent.
    pub(crate) fn commit_changes(&self, id: Oid) -> Result<Vec<FileChange>, VaultError> {
        self.changed_between(self.first_parent(id)?, Some(id), None)
    }
}

/// A read-only [`Store`](crate::memory::Store) over the tree of one
/// revision, so `show` renders exactly as `view` does.
pub struct RevisionStore<'v> {
    vault: &'v Vault,
    rev: Option<Oid>,
}

impl Vault {
    /// The vault as it was at `rev`, read-only.
    pub fn at_revision(&self, rev: Option<Rev>) -> RevisionStore<'_> {
        RevisionStore {
            vault: self,
            rev: rev.map(Rev::oid),
        }
    }
}

impl crate::memory::Store for RevisionStore<'_> {
    fn read(
        &mut self,
        f: &mut dyn FnMut(
            &dyn crate::memory::Snapshot,
        ) -> Result<crate::memory::ToolResult, crate::memory::StoreError>,
    ) -> Result<crate::memory::ToolResult, crate::memory::StoreError> {
        let snap = self.vault.snapshot_of(self.rev)?;
        f(&snap)
    }

    fn write(
        &mut self,
        _f: &mut dyn FnMut(
            &dyn crate::memory::Snapshot,
        ) -> Result<crate::memory::Outcome, crate::memory::StoreError>,
    ) -> Result<crate::memory::ToolResult, crate::memory::StoreError> {
        Err(crate::memory::StoreError::Unavailable(
            "a past revision is read-only".into(),
        ))
    }
}
