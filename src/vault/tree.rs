//! Reading one encrypted tree: path lookup by encrypted name, listings
//! with plaintext sizes taken from blob headers, and decryption of files.

use std::cell::RefCell;
use std::collections::HashMap;
use std::sync::Arc;

use git2::{ObjectType, Odb, Oid, Repository, Tree};
use zeroize::Zeroizing;

use super::keys::KeyState;
use super::objects;
use crate::crypto::{self, FileKey, FileKeyId, VaultKeys};
use crate::memory::{DirEntry, MemoryPath, NodeKind, Snapshot, StoreError};

/// Memo of facts that never change for a given object or name: blob and
/// tree plaintext sizes and file counts by object id (objects are content
/// addressed), and decrypted names by (parent, encrypted name). Lives as
/// long as the open vault, so a long-running `serve` lists quickly.
#[derive(Default)]
pub struct Caches {
    names: RefCell<HashMap<(String, String), String>>,
    sizes: RefCell<HashMap<Oid, u64>>,
    counts: RefCell<HashMap<Oid, usize>>,
    /// The path and file key of the last file read, for access tracking.
    pub(crate) last_read: RefCell<Option<(String, FileKeyId)>>,
    /// The file key id in each blob's header, by blob id.
    key_ids: RefCell<HashMap<Oid, FileKeyId>>,
    /// The tree of the last commit looked up (a commit may be large: an
    /// import lists every file in its metadata).
    pub(crate) commit_tree: RefCell<Option<(Oid, Oid)>>,
    /// The entries of trees this process wrote or edited lately, by id. A
    /// mutation's path lookups and tree edits start from the trees the
    /// previous one wrote: from here they are neither read back through
    /// libgit2 (which hashes every object it reads) nor parsed again.
    /// With the bytes they take, roughly.
    trees: RefCell<(HashMap<Oid, Entries>, usize)>,
}

const CACHE_LIMIT: usize = 200_000;
/// Bytes of tree entries kept in [`Caches::trees`] (a directory of 100
/// files takes about 12 KiB there).
const TREE_CACHE_BYTES: usize = 16 << 20;

/// One entry of a git tree.
pub(crate) struct TreeEntry {
    pub name: Vec<u8>,
    pub mode: i32,
    pub id: Oid,
}

/// A tree's entries, in git's order.
pub(crate) type Entries = Arc<Vec<TreeEntry>>;

/// Git's mode of a tree entry that is a directory.
pub(crate) const MODE_TREE: i32 = 0o040000;

/// Git's tree order: names compared bytewise, a directory's name as if it
/// ended in '/'.
pub(crate) fn git_order(a: &TreeEntry, b: &TreeEntry) -> std::cmp::Ordering {
    git_key(a).cmp(git_key(b))
}

fn git_key(e: &TreeEntry) -> impl Iterator<Item = &u8> + Clone {
    let tail: &'static [u8] = if e.mode == MODE_TREE { b"/" } else { b"" };
    e.name.iter().chain(tail)
}

/// The position of the entry called `name` in `entries` (in git's order,
/// as every tree memvault writes or accepts is): a binary search for it as
/// a file, then as a directory.
pub(crate) fn find_entry(entries: &[TreeEntry], name: &[u8]) -> Option<usize> {
    entries
        .binary_search_by(|e| git_key(e).cmp(name.iter()))
        .or_else(|_| entries.binary_search_by(|e| git_key(e).cmp(name.iter().chain(b"/"))))
        .ok()
}

impl Caches {
    /// Record the file count of a tree this process just built (a create
    /// adds one file to a tree whose count it checked), so the next
    /// create's limit check does not walk the changed directory again.
    pub(crate) fn remember_count(&self, tree: Oid, files: usize) {
        remember(&self.counts, tree, files);
    }

    /// Remember the entries of a tree just written.
    pub(crate) fn remember_tree(&self, tree: Oid, entries: Entries) {
        let size: usize = entries.iter().map(|e| e.name.len() + 64).sum();
        let mut m = self.trees.borrow_mut();
        if m.1 + size > TREE_CACHE_BYTES {
            m.0.clear();
            m.1 = 0;
        }
        if size <= TREE_CACHE_BYTES && m.0.insert(tree, entries).is_none() {
            m.1 += size;
        }
    }

    /// Bytes the tree cache holds (for tests).
    #[cfg(test)]
    pub(crate) fn tree_bytes(&self) -> usize {
        self.trees.borrow().1
    }

    /// The entries of tree `id`: remembered, or read through libgit2 (and
    /// remembered).
    pub(crate) fn tree_entries(
        &self,
        repo: &Repository,
        id: Oid,
    ) -> Result<Entries, objects::ObjectError> {
        if let Some(e) = self.trees.borrow().0.get(&id) {
            return Ok(e.clone());
        }
        let tree = objects::find_tree(repo, id)?;
        let entries: Entries = Arc::new(
            tree.iter()
                .map(|e| TreeEntry {
                    name: e.name_bytes().to_vec(),
                    mode: e.filemode(),
                    id: e.id(),
                })
                .collect(),
        );
        self.remember_tree(id, entries.clone());
        Ok(entries)
    }
}

fn remember<K: std::hash::Hash + Eq, V>(map: &RefCell<HashMap<K, V>>, k: K, v: V) {
    let mut m = map.borrow_mut();
    if m.len() >= CACHE_LIMIT {
        m.clear();
    }
    m.insert(k, v);
}

/// One state of the vault's tree, readable through [`Snapshot`].
pub struct VaultSnapshot<'a> {
    repo: &'a Repository,
    odb: Option<Odb<'a>>,
    keys: &'a VaultKeys,
    key_state: &'a KeyState,
    caches: &'a Caches,
    /// None: the empty tree.
    tree: Option<Tree<'a>>,
}

fn damaged(what: &str) -> StoreError {
    StoreError::Damaged(what.to_string())
}

impl<'a> VaultSnapshot<'a> {
    pub(crate) fn new(
        repo: &'a Repository,
        keys: &'a VaultKeys,
        key_state: &'a KeyState,
        caches: &'a Caches,
        tree: Option<Tree<'a>>,
    ) -> Self {
        VaultSnapshot {
            repo,
            odb: repo.odb().ok(),
            keys,
            key_state,
            caches,
            tree,
        }
    }

    /// The git path (encrypted names joined by `/`) of a memory path.
    pub(crate) fn git_path(&self, path: &MemoryPath) -> Result<String, StoreError> {
        git_path(self.keys, path)
            .map_err(|_| StoreError::Limit("a path segment is too long to store".into()))
    }

    /// The object a path names: its id and whether it is a blob or a tree.
    pub(crate) fn entry(&self, path: &MemoryPath) -> Result<Option<(Oid, NodeKind)>, StoreError> {
        let Some(tree) = &self.tree else {
            return Ok(if path.is_root() {
                Some((Oid::ZERO_SHA1, NodeKind::Dir))
            } else {
                None
            });
        };
        if path.is_root() {
            return Ok(Some((tree.id(), NodeKind::Dir)));
        }
        self.entry_at(&self.git_path(path)?)
    }

    /// The object at a (non-root) git path, as [`entry`](Self::entry)
    /// gives it, for a caller that has the git path already.
    pub(crate) fn entry_at(&self, git_path: &str) -> Result<Option<(Oid, NodeKind)>, StoreError> {
        let Some(tree) = &self.tree else {
            return Ok(None);
        };
        let mut at = (tree.id(), MODE_TREE);
        for name in git_path.split('/') {
            if at.1 != MODE_TREE {
                return Ok(None);
            }
            let entries = self.caches.tree_entries(self.repo, at.0)?;
            match find_entry(&entries, name.as_bytes()) {
                Some(i) => at = (entries[i].id, entries[i].mode),
                None => return Ok(None),
            }
        }
        match at.1 {
            MODE_TREE => Ok(Some((at.0, NodeKind::Dir))),
            // What libgit2 calls a blob: files and links.
            m if m & 0o170000 == 0o100000 || m == 0o120000 => Ok(Some((at.0, NodeKind::File))),
            _ => Err(damaged("a tree entry has an unexpected type")),
        }
    }

    fn blob_bytes(&self, oid: Oid) -> Result<Vec<u8>, StoreError> {
        let blob = objects::find_blob(self.repo, oid)?;
        Ok(blob.content().to_vec())
    }

    /// The file-key id of the file at `path`, if it is a file.
    pub fn file_key_id(&self, path: &MemoryPath) -> Result<Option<FileKeyId>, StoreError> {
        let Some((oid, NodeKind::File)) = self.entry(path)? else {
            return Ok(None);
        };
        self.blob_key_id(oid).map(Some)
    }

    /// The file-key id in the header of the stored file `oid`.
    pub(crate) fn blob_key_id(&self, oid: Oid) -> Result<FileKeyId, StoreError> {
        let bytes = self.blob_bytes(oid)?;
        crypto::blob_key_id(&bytes).map_err(|_| damaged("a stored file has a bad header"))
    }

    /// The key with this id, from the key table.
    pub(crate) fn file_key(&self, id: &FileKeyId) -> Result<&'a FileKey, StoreError> {
        self.key_state
            .file_key(id)
            .ok_or_else(|| damaged("a stored file's key is missing from the key table"))
    }

    /// Every file at or below `path`, in name order.
    pub fn files_below(&self, path: &MemoryPath) -> Result<Vec<MemoryPath>, StoreError> {
        let mut out = Vec::new();
        match self.entry(path)? {
            None => {}
            Some((_, NodeKind::File)) => out.push(path.clone()),
            Some((oid, NodeKind::Dir)) if self.tree.is_some() => {
                self.collect_files(path, oid, &mut out)?;
            }
            Some((_, NodeKind::Dir)) => {}
        }
        Ok(out)
    }

    /// Every file: its path, git path and file key id, in one pass over
    /// the tree (blob headers are read once per blob and remembered).
    pub(crate) fn files_with_keys(
        &self,
    ) -> Result<Vec<(MemoryPath, String, FileKeyId)>, StoreError> {
        let mut out = Vec::new();
        if let Some(tree) = &self.tree {
            self.walk_keys(&MemoryPath::root(), "", tree.id(), &mut out)?;
        }
        Ok(out)
    }

    fn walk_keys(
        &self,
        dir: &MemoryPath,
        git_dir: &str,
        oid: Oid,
        out: &mut Vec<(MemoryPath, String, FileKeyId)>,
    ) -> Result<(), StoreError> {
        let tree = objects::find_tree(self.repo, oid)?;
        let entries: Vec<(String, Option<ObjectType>, Oid)> = tree
            .iter()
            .map(|e| (e.name().unwrap_or_default().to_string(), e.kind(), e.id()))
            .collect();
        drop(tree);
        for (enc, kind, id) in entries {
            let cache_key = (dir.as_str().to_string(), enc.clone());
            let cached = self.caches.names.borrow().get(&cache_key).cloned();
            let name = match cached {
                Some(n) => n,
                None => {
                    let n = self
                        .keys
                        .decrypt_name(dir.as_str(), &enc)
                        .map_err(|_| damaged("a stored name failed to decrypt"))?;
                    remember(&self.caches.names, cache_key, n.clone());
                    n
                }
            };
            let path = dir
                .join(&name)
                .map_err(|_| damaged("a stored name is not a valid path"))?;
            let git_path = if git_dir.is_empty() {
                enc
            } else {
                format!("{git_dir}/{enc}")
            };
            match kind {
                Some(ObjectType::Tree) => self.walk_keys(&path, &git_path, id, out)?,
                Some(ObjectType::Blob) => {
                    let cached = self.caches.key_ids.borrow().get(&id).copied();
                    let key = match cached {
                        Some(k) => k,
                        None => {
                            let k = crypto::blob_key_id(&self.blob_bytes(id)?)
                                .map_err(|_| damaged("a stored file has a bad header"))?;
                            remember(&self.caches.key_ids, id, k);
                            k
                        }
                    };
                    out.push((path, git_path, key));
                }
                _ => return Err(damaged("a tree entry has an unexpected type")),
            }
        }
        Ok(())
    }

    fn collect_files(
        &self,
        dir: &MemoryPath,
        oid: Oid,
        out: &mut Vec<MemoryPath>,
    ) -> Result<(), StoreError> {
        for (name, kind, id) in self.children(dir, oid)? {
            let child = dir
                .join(&name)
                .map_err(|_| damaged("a stored name is not a valid path"))?;
            match kind {
                NodeKind::File => out.push(child),
                NodeKind::Dir => self.collect_files(&child, id, out)?,
            }
        }
        Ok(())
    }

    /// Decrypted children of the tree `oid` at `dir`, sorted by name.
    fn children(
        &self,
        dir: &MemoryPath,
        oid: Oid,
    ) -> Result<Vec<(String, NodeKind, Oid)>, StoreError> {
        let tree = objects::find_tree(self.repo, oid)?;
        let mut out = Vec::with_capacity(tree.len());
        for e in tree.iter() {
            let enc = e.name().map_err(|_| damaged("a stored name is not text"))?;
            let cache_key = (dir.as_str().to_string(), enc.to_string());
            let cached = self.caches.names.borrow().get(&cache_key).cloned();
            let name = match cached {
                Some(n) => n,
                None => {
                    let n = self
                        .keys
                        .decrypt_name(dir.as_str(), enc)
                        .map_err(|_| damaged("a stored name failed to decrypt"))?;
                    remember(&self.caches.names, cache_key, n.clone());
                    n
                }
            };
            let kind = match e.kind() {
                Some(ObjectType::Blob) => NodeKind::File,
                Some(ObjectType::Tree) => NodeKind::Dir,
                _ => return Err(damaged("a tree entry has an unexpected type")),
            };
            out.push((name, kind, e.id()));
        }
        out.sort_by(|a, b| a.0.as_bytes().cmp(b.0.as_bytes()));
        Ok(out)
    }

    fn blob_plain_size(&self, oid: Oid) -> Result<u64, StoreError> {
        if let Some(n) = self.caches.sizes.borrow().get(&oid) {
            return Ok(*n);
        }
        let n = self.blob_plain_size_uncached(oid)?;
        remember(&self.caches.sizes, oid, n);
        Ok(n)
    }

    fn blob_plain_size_uncached(&self, oid: Oid) -> Result<u64, StoreError> {
        let odb = self
            .odb
            .as_ref()
            .ok_or_else(|| damaged("the object database is unreadable"))?;
        let (len, kind) = objects::read_header(odb, self.repo, oid)?;
        if kind != ObjectType::Blob {
            return Err(damaged("a tree entry has an unexpected type"));
        }
        crypto::plaintext_len(len as u64).ok_or_else(|| damaged("a stored file is too short"))
    }

    fn tree_plain_size(&self, oid: Oid) -> Result<u64, StoreError> {
        if let Some(n) = self.caches.sizes.borrow().get(&oid) {
            return Ok(*n);
        }
        let tree = objects::find_tree(self.repo, oid)?;
        let mut total = 0u64;
        for e in tree.iter() {
            total += match e.kind() {
                Some(ObjectType::Blob) => self.blob_plain_size(e.id())?,
                Some(ObjectType::Tree) => self.tree_plain_size(e.id())?,
                _ => return Err(damaged("a tree entry has an unexpected type")),
            };
        }
        remember(&self.caches.sizes, oid, total);
        Ok(total)
    }

    /// Number of files in the whole tree (no decryption needed).
    pub fn count_files(&self) -> Result<usize, StoreError> {
        fn walk(repo: &Repository, caches: &Caches, oid: Oid) -> Result<usize, StoreError> {
            if let Some(n) = caches.counts.borrow().get(&oid) {
                return Ok(*n);
            }
            let tree = objects::find_tree(repo, oid)?;
            let mut n = 0;
            for e in tree.iter() {
                match e.kind() {
                    Some(ObjectType::Blob) => n += 1,
                    Some(ObjectType::Tree) => n += walk(repo, caches, e.id())?,
                    _ => {}
                }
            }
            remember(&caches.counts, oid, n);
            Ok(n)
        }
        match &self.tree {
            None => Ok(0),
            Some(t) => walk(self.repo, self.caches, t.id()),
        }
    }
}

impl Snapshot for VaultSnapshot<'_> {
    fn kind(&self, path: &MemoryPath) -> Result<Option<NodeKind>, StoreError> {
        Ok(self.entry(path)?.map(|(_, k)| k))
    }

    fn read(&self, path: &MemoryPath) -> Result<Zeroizing<Vec<u8>>, StoreError> {
        let Some((oid, NodeKind::File)) = self.entry(path)? else {
            return Err(StoreError::NotFound);
        };
        let bytes = self.blob_bytes(oid)?;
        let id =
            crypto::blob_key_id(&bytes).map_err(|_| damaged("a stored file has a bad header"))?;
        let key = match self.key_state.file_key(&id) {
            Some(k) => k,
            None if self.key_state.erased.contains(&id) => return Err(StoreError::Erased),
            None => {
                return Err(damaged("a stored file's key is missing from the key table"));
            }
        };
        *self.caches.last_read.borrow_mut() = Some((path.as_str().to_string(), id));
        crypto::open_blob(key, path.as_str(), &bytes)
            .map_err(|_| damaged("a stored file failed to decrypt (altered, truncated or moved)"))
    }

    fn list(&self, dir: &MemoryPath) -> Result<Vec<DirEntry>, StoreError> {
        let oid = match self.entry(dir)? {
            Some((oid, NodeKind::Dir)) => oid,
            _ => return Err(StoreError::NotFound),
        };
        if self.tree.is_none() {
            return Ok(Vec::new());
        }
        let mut out = Vec::new();
        for (name, kind, id) in self.children(dir, oid)? {
            let size = match kind {
                NodeKind::File => self.blob_plain_size(id)?,
                NodeKind::Dir => self.tree_plain_size(id)?,
            };
            out.push(DirEntry { name, kind, size });
        }
        Ok(out)
    }
}

/// The git path (encrypted names joined by `/`; "" for the root) of a
/// memory path: each segment's name encrypted under its parent path.
pub(crate) fn git_path(
    keys: &VaultKeys,
    path: &MemoryPath,
) -> Result<String, crate::crypto::CryptoError> {
    let mut out = String::new();
    let mut parent = MemoryPath::root();
    for seg in path.segments() {
        let enc = keys.encrypt_name(parent.as_str(), seg)?;
        if !out.is_empty() {
            out.push('/');
        }
        out.push_str(&enc);
        // A segment of a valid path always joins onto its parent.
        parent = parent
            .join(seg)
            .map_err(|_| crate::crypto::CryptoError::NameTooLong)?;
    }
    Ok(out)
}
