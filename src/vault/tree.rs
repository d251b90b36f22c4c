//! Reading one encrypted tree: path lookup by encrypted name, listings
//! with plaintext sizes taken from blob headers, and decryption of files.

use std::cell::RefCell;
use std::collections::HashMap;
use std::sync::Arc;

use git2::{ObjectType, Odb, Oid, Repository};
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
    /// By parent path, then encrypted name (looked up without building a
    /// key), with the number of names held.
    names: RefCell<(NameMap, usize)>,
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
    /// The sealed bytes of blobs this process wrote lately, by id (with
    /// the bytes held), so an edit of a file just written does not read it
    /// back through libgit2.
    blobs: RefCell<(HashMap<Oid, Blob>, usize)>,
    /// Encrypted names by parent path, then name (names are encrypted
    /// deterministically: AES-SIV), with the number held.
    encrypted: RefCell<(NameMap, usize)>,
}

/// Names by parent path, then name (the other way round for encrypted).
type NameMap = HashMap<String, HashMap<String, String>>;
/// The sealed bytes of a blob.
type Blob = Arc<[u8]>;

const CACHE_LIMIT: usize = 200_000;
/// Bytes of sealed blobs kept in [`Caches::blobs`].
const BLOB_CACHE_BYTES: usize = 8 << 20;
/// Bytes of tree entries kept in [`Caches::trees`] (a directory of 100
/// files takes about 12 KiB there).
const TREE_CACHE_BYTES: usize = 16 << 20;

/// One entry of a git tree.
pub(crate) struct TreeEntry {
    pub name: Arc<[u8]>,
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

/// Levels of bucket trees between a directory and its entries (vault
/// format 3): an entry whose encrypted name is `enc` sits at
/// `b1/b2/b3/enc` under its directory, the buckets being one hex digit
/// each, taken from the first three characters of `enc` (the start of its
/// SIV tag, so uniformly spread). A mutation then rewrites four trees of
/// at most 16 entries per directory on its path, plus one leaf of about
/// n/4096 entries, whatever the directory's size n.
pub(crate) const FANOUT_LEVELS: usize = 3;

/// The most entries a tree of a directory, or a bucket tree above the
/// deepest level, holds directly in format 9: a write that leaves more
/// moves them into the buckets of their next digit (see
/// [`Caches::seek_in_dir`]). A directory of up to 16 entries is then one
/// tree, one of 100 a tree of 16 buckets and buckets of about 6, one of
/// 10,000 three levels of buckets: a mutation writes one or two trees per
/// directory on its path, more only in directories of thousands, where
/// format 3 wrote four in every directory. Each tree holds at most about
/// 1.4 KB: a tree touched once between two checkpoints is stored whole in
/// the checkpoint's pack, so this bounds what a mutation adds before `gc`
/// (32 let a create in a directory of 5,000 files add 4.2 KiB).
pub(crate) const FLAT_MAX: usize = 16;

/// Whether a tree entry's name is a bucket: one lowercase hex digit (an
/// encrypted name is at least 52 characters long).
pub(crate) fn is_bucket(name: &[u8]) -> bool {
    matches!(name, [b'0'..=b'9' | b'a'..=b'f'])
}

/// The bucket digits of the encrypted name `enc`: its first three base32
/// characters, each halved (32 values to 16).
pub(crate) fn buckets(enc: &str) -> [u8; FANOUT_LEVELS] {
    const HEX: &[u8; 16] = b"0123456789abcdef";
    let mut out = [b'0'; FANOUT_LEVELS];
    for (o, c) in out.iter_mut().zip(enc.bytes()) {
        let v = match c {
            b'a'..=b'z' => c - b'a',
            b'2'..=b'7' => c - b'2' + 26,
            _ => 0,
        };
        *o = HEX[usize::from(v >> 1)];
    }
    out
}

/// Append `enc` under its buckets to a git path being built.
fn push_fanned(out: &mut String, enc: &str) {
    if !out.is_empty() {
        out.push('/');
    }
    for b in buckets(enc) {
        out.push(char::from(b));
        out.push('/');
    }
    out.push_str(enc);
}

/// A git path without its bucket segments: the form of format 2, and the
/// key that names one file in either form.
#[cfg(test)]
pub(crate) fn flat_git_path(git_path: &str) -> String {
    git_path
        .split('/')
        .filter(|s| !is_bucket(s.as_bytes()))
        .collect::<Vec<_>>()
        .join("/")
}

/// A git path of either form in the form this version writes.
pub(crate) fn fanned_git_path(git_path: &str) -> String {
    let mut out = String::with_capacity(git_path.len() + 32);
    for seg in git_path.split('/').filter(|s| !is_bucket(s.as_bytes())) {
        push_fanned(&mut out, seg);
    }
    out
}

/// One entry of a directory, found through its bucket trees: the entry,
/// and its git path below the directory (buckets included).
pub(crate) struct DirEntryAt {
    pub name: Vec<u8>,
    pub mode: i32,
    pub id: Oid,
    pub sub_path: String,
}

impl Caches {
    /// The entries of the directory whose tree is `id`, through its bucket
    /// trees (a format-2 directory has none), in no particular order, with
    /// their git paths below the directory. A bucket nested deeper than
    /// [`FANOUT_LEVELS`] is damage.
    pub(crate) fn dir_entries(
        &self,
        repo: &Repository,
        id: Oid,
    ) -> Result<Vec<DirEntryAt>, objects::ObjectError> {
        let mut out = Vec::new();
        self.for_each_in_dir(repo, id, &mut |e, buckets| {
            let name = String::from_utf8_lossy(&e.name);
            out.push(DirEntryAt {
                name: e.name.to_vec(),
                mode: e.mode,
                id: e.id,
                sub_path: format!("{buckets}{name}"),
            });
        })?;
        Ok(out)
    }

    /// Call `f` with each entry of the directory whose tree is `id` (see
    /// [`dir_entries`](Self::dir_entries)) and the bucket digits above it
    /// (`"a/b/c/"`, or "" in a format-2 directory).
    pub(crate) fn for_each_in_dir(
        &self,
        repo: &Repository,
        id: Oid,
        f: &mut dyn FnMut(&TreeEntry, &str),
    ) -> Result<(), objects::ObjectError> {
        let mut prefix = String::new();
        self.visit_dir(repo, id, &mut prefix, 0, f)
    }

    fn visit_dir(
        &self,
        repo: &Repository,
        id: Oid,
        prefix: &mut String,
        depth: usize,
        f: &mut dyn FnMut(&TreeEntry, &str),
    ) -> Result<(), objects::ObjectError> {
        let entries = self.tree_entries(repo, id)?;
        for e in entries.iter() {
            if e.mode == MODE_TREE && is_bucket(&e.name) {
                if depth >= FANOUT_LEVELS {
                    // Buckets nested deeper than any vault writes them.
                    return Err(objects::ObjectError::Corrupt(e.id));
                }
                let len = prefix.len();
                prefix.push(char::from(e.name[0]));
                prefix.push('/');
                self.visit_dir(repo, e.id, prefix, depth + 1, f)?;
                prefix.truncate(len);
            } else {
                f(e, prefix);
            }
        }
        Ok(())
    }

    /// Where the entry called `enc` is in the directory tree `dir`, or
    /// where a write puts it. An entry sits directly in its directory's
    /// tree or in a bucket tree below it, at any depth up to
    /// [`FANOUT_LEVELS`], each bucket being the next of its [`buckets`]
    /// digits (format 9; format 3 put every entry at the full depth,
    /// format 2 at none, and both read the same way). The search looks in
    /// each tree on the way down, then follows the bucket of the name's
    /// next digit while there is one; a new entry goes where that stops
    /// ([`TreeEdits`](super::treeedit::TreeEdits) splits a tree that then
    /// holds more than [`FLAT_MAX`] entries).
    pub(crate) fn seek_in_dir(
        &self,
        repo: &Repository,
        dir: Oid,
        enc: &[u8],
    ) -> Result<Seek, objects::ObjectError> {
        let mut sub = String::new();
        let mut level = self.tree_entries(repo, dir)?;
        let name = String::from_utf8_lossy(enc);
        for b in buckets(&name) {
            if let Some(i) = find_entry(&level, enc) {
                sub.push_str(&name);
                return Ok(Seek::Found(level[i].id, level[i].mode, sub));
            }
            match find_entry(&level, &[b]) {
                Some(i) if level[i].mode == MODE_TREE => {
                    sub.push(char::from(b));
                    sub.push('/');
                    level = self.tree_entries(repo, level[i].id)?;
                }
                _ => {
                    sub.push_str(&name);
                    return Ok(Seek::Absent(sub));
                }
            }
        }
        let found = find_entry(&level, enc).map(|i| (level[i].id, level[i].mode));
        sub.push_str(&name);
        Ok(match found {
            Some((id, mode)) => Seek::Found(id, mode, sub),
            None => Seek::Absent(sub),
        })
    }
}

/// What [`Caches::seek_in_dir`] found: the entry (id, mode, git path below
/// the directory), or the git path a write gives it.
pub(crate) enum Seek {
    Found(Oid, i32, String),
    Absent(String),
}

impl Caches {
    /// Record the file count of a tree this process just built (a create
    /// adds one file to a tree whose count it checked), so the next
    /// create's limit check does not walk the changed directory again.
    pub(crate) fn remember_count(&self, tree: Oid, files: usize) {
        remember(&self.counts, tree, files);
    }

    /// The file count of `tree`, if this process has it.
    pub(crate) fn count_of(&self, tree: Oid) -> Option<usize> {
        self.counts.borrow().get(&tree).copied()
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

    /// Remember the sealed bytes of a blob just written.
    pub(crate) fn remember_blob(&self, id: Oid, bytes: &[u8]) {
        let mut m = self.blobs.borrow_mut();
        if m.1 + bytes.len() > BLOB_CACHE_BYTES {
            m.0.clear();
            m.1 = 0;
        }
        if bytes.len() <= BLOB_CACHE_BYTES / 8 && m.0.insert(id, Arc::from(bytes)).is_none() {
            m.1 += bytes.len();
        }
    }

    /// The encrypted name of `name` in the directory `parent`
    /// (remembered).
    fn encrypt_name(
        &self,
        keys: &VaultKeys,
        parent: &str,
        name: &str,
    ) -> Result<String, crate::crypto::CryptoError> {
        if let Some(e) = self
            .encrypted
            .borrow()
            .0
            .get(parent)
            .and_then(|m| m.get(name))
        {
            return Ok(e.clone());
        }
        let enc = keys.encrypt_name(parent, name)?;
        let mut m = self.encrypted.borrow_mut();
        if m.1 >= CACHE_LIMIT {
            *m = Default::default();
        }
        m.1 += 1;
        m.0.entry(parent.to_string())
            .or_default()
            .insert(name.to_string(), enc.clone());
        Ok(enc)
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
        let entries: Entries = Arc::new(
            objects::tree_entries(repo, id)?
                .into_iter()
                .map(|(name, mode, id)| TreeEntry { name, mode, id })
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
/// What a path names in a tree: its object and kind, if anything.
type Located = Option<(Oid, NodeKind)>;

pub struct VaultSnapshot<'a> {
    repo: &'a Repository,
    odb: Option<Odb<'a>>,
    keys: &'a VaultKeys,
    key_state: &'a KeyState,
    caches: &'a Caches,
    /// The root tree's id (None: the empty tree).
    tree: Option<Oid>,
    /// The last path [`entry`](Self::entry) answered, and its answer (a
    /// view asks for the kind, then reads: one walk of the tree).
    last_entry: RefCell<Option<(MemoryPath, Located)>>,
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
        tree: Option<Oid>,
    ) -> Self {
        VaultSnapshot {
            repo,
            odb: repo.odb().ok(),
            keys,
            key_state,
            caches,
            tree,
            last_entry: RefCell::new(None),
        }
    }

    /// The object a path names: its id and whether it is a blob or a tree.
    pub(crate) fn entry(&self, path: &MemoryPath) -> Result<Option<(Oid, NodeKind)>, StoreError> {
        if let Some((p, at)) = &*self.last_entry.borrow()
            && p == path
        {
            return Ok(*at);
        }
        let at = self.locate(path)?.1;
        *self.last_entry.borrow_mut() = Some((path.clone(), at));
        Ok(at)
    }

    /// Where `path` is in this tree: its git path there and what it names.
    /// For a path that is not there, the git path a write gives it: the
    /// part of it that exists where it is, the rest under its buckets. A
    /// directory of format 2 (no buckets) is read and written into as it
    /// is.
    pub(crate) fn locate(
        &self,
        path: &MemoryPath,
    ) -> Result<(String, Option<(Oid, NodeKind)>), StoreError> {
        if path.is_root() {
            let at = match self.tree {
                Some(tree) => (tree, NodeKind::Dir),
                None => (Oid::ZERO_SHA1, NodeKind::Dir),
            };
            return Ok((String::new(), Some(at)));
        }
        let mut encs = Vec::new();
        let mut parent = MemoryPath::root();
        for seg in path.segments() {
            encs.push(
                self.caches
                    .encrypt_name(self.keys, parent.as_str(), seg)
                    .map_err(|_| too_long())?,
            );
            parent = parent.join(seg).map_err(|_| too_long())?;
        }
        self.locate_encs(&encs)
    }

    fn locate_encs(
        &self,
        encs: &[String],
    ) -> Result<(String, Option<(Oid, NodeKind)>), StoreError> {
        let mut git = String::new();
        // Directories a write makes are new and hold their entries
        // directly.
        let rest = |mut git: String, rest: &[String]| {
            for e in rest {
                if !git.is_empty() {
                    git.push('/');
                }
                git.push_str(e);
            }
            git
        };
        let Some(tree) = self.tree else {
            return Ok((rest(git, encs), None));
        };
        let mut at = (tree, MODE_TREE);
        for (i, enc) in encs.iter().enumerate() {
            if at.1 != MODE_TREE {
                return Ok((rest(git, &encs[i..]), None));
            }
            if !git.is_empty() {
                git.push('/');
            }
            match self.caches.seek_in_dir(self.repo, at.0, enc.as_bytes())? {
                Seek::Found(id, mode, sub) => {
                    git.push_str(&sub);
                    at = (id, mode);
                }
                Seek::Absent(sub) => {
                    git.push_str(&sub);
                    return Ok((rest(git, &encs[i + 1..]), None));
                }
            }
        }
        let kind = match at.1 {
            MODE_TREE => NodeKind::Dir,
            // What libgit2 calls a blob: files and links.
            m if m & 0o170000 == 0o100000 || m == 0o120000 => NodeKind::File,
            _ => return Err(damaged("a tree entry has an unexpected type")),
        };
        Ok((git, Some((at.0, kind))))
    }

    pub(crate) fn blob_bytes(&self, oid: Oid) -> Result<Vec<u8>, StoreError> {
        if let Some(b) = self.caches.blobs.borrow().0.get(&oid) {
            return Ok(b.to_vec());
        }
        Ok(objects::blob_content(self.repo, oid)?)
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

    /// The text of the stored version `oid`, sealed under `path`; None
    /// when it does not open (its key erased, say).
    pub(crate) fn open_version(&self, oid: Oid, path: &MemoryPath) -> Option<Zeroizing<Vec<u8>>> {
        let bytes = self.blob_bytes(oid).ok()?;
        let id = crypto::blob_key_id(&bytes).ok()?;
        let key = self.file_key(&id).ok()?;
        crypto::open_blob(key, path.as_str(), &bytes).ok()
    }

    /// The key with this id, from the key table.
    pub(crate) fn file_key(&self, id: &FileKeyId) -> Result<&'a FileKey, StoreError> {
        self.key_state
            .file_key_with(self.repo, self.keys, Some(self.caches), id)?
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
        Ok(self
            .files_with_blobs()?
            .into_iter()
            .map(|(path, git_path, key, _)| (path, git_path, key))
            .collect())
    }

    /// [`files_with_keys`](Self::files_with_keys), with each file's blob.
    pub(crate) fn files_with_blobs(
        &self,
    ) -> Result<Vec<(MemoryPath, String, FileKeyId, Oid)>, StoreError> {
        let mut out = Vec::new();
        if let Some(tree) = self.tree {
            self.walk_keys(&MemoryPath::root(), "", tree, &mut out)?;
        }
        Ok(out)
    }

    /// The files of this tree whose entry is not the same in every one of
    /// `others` (trees of the same vault; None: the empty tree), with
    /// their file key ids and blobs: a subtree (directory or bucket) with
    /// the same id in all of them is skipped unread. So a merge reads
    /// what changed on either side since the base, not the whole vault.
    pub(crate) fn files_differing(
        &self,
        others: &[Option<Oid>],
    ) -> Result<Vec<(MemoryPath, FileKeyId, Oid)>, StoreError> {
        let mut out = Vec::new();
        if let Some(tree) = self.tree {
            self.walk_differing(&MemoryPath::root(), tree, others, 0, &mut out)?;
        }
        Ok(out)
    }

    fn walk_differing(
        &self,
        dir: &MemoryPath,
        oid: Oid,
        others: &[Option<Oid>],
        bucket_depth: usize,
        out: &mut Vec<(MemoryPath, FileKeyId, Oid)>,
    ) -> Result<(), StoreError> {
        if others.iter().all(|o| *o == Some(oid)) {
            return Ok(());
        }
        let entries = self.caches.tree_entries(self.repo, oid)?;
        let mut theirs = Vec::with_capacity(others.len());
        for o in others {
            theirs.push(match o {
                Some(o) => Some(self.caches.tree_entries(self.repo, *o)?),
                None => None,
            });
        }
        for e in entries.iter() {
            // The same name's entry in each other tree.
            let same: Vec<Option<&TreeEntry>> = theirs
                .iter()
                .map(|t| {
                    t.as_ref()
                        .and_then(|t| find_entry(t, &e.name).map(|i| &t[i]))
                })
                .collect();
            if same
                .iter()
                .all(|s| s.is_some_and(|s| s.id == e.id && s.mode == e.mode))
            {
                continue;
            }
            let subtrees: Vec<Option<Oid>> = same
                .iter()
                .map(|s| s.filter(|s| s.mode == MODE_TREE).map(|s| s.id))
                .collect();
            if e.mode == MODE_TREE && is_bucket(&e.name) {
                if bucket_depth >= FANOUT_LEVELS {
                    return Err(objects::ObjectError::Corrupt(e.id).into());
                }
                self.walk_differing(dir, e.id, &subtrees, bucket_depth + 1, out)?;
                continue;
            }
            let enc =
                std::str::from_utf8(&e.name).map_err(|_| damaged("a stored name is not text"))?;
            let path = dir
                .join(&self.name_of(dir, enc)?)
                .map_err(|_| damaged("a stored name is not a valid path"))?;
            match kind_of(e.mode)? {
                NodeKind::Dir => self.walk_differing(&path, e.id, &subtrees, 0, out)?,
                NodeKind::File => out.push((path, self.key_id_of(e.id)?, e.id)),
            }
        }
        Ok(())
    }

    /// The file key id in the header of the blob `oid` (remembered).
    fn key_id_of(&self, oid: Oid) -> Result<FileKeyId, StoreError> {
        if let Some(k) = self.caches.key_ids.borrow().get(&oid).copied() {
            return Ok(k);
        }
        let k = crypto::blob_key_id(&self.blob_bytes(oid)?)
            .map_err(|_| damaged("a stored file has a bad header"))?;
        remember(&self.caches.key_ids, oid, k);
        Ok(k)
    }

    fn walk_keys(
        &self,
        dir: &MemoryPath,
        git_dir: &str,
        oid: Oid,
        out: &mut Vec<(MemoryPath, String, FileKeyId, Oid)>,
    ) -> Result<(), StoreError> {
        for e in self.caches.dir_entries(self.repo, oid)? {
            let enc =
                std::str::from_utf8(&e.name).map_err(|_| damaged("a stored name is not text"))?;
            let name = self.name_of(dir, enc)?;
            let path = dir
                .join(&name)
                .map_err(|_| damaged("a stored name is not a valid path"))?;
            let git_path = if git_dir.is_empty() {
                e.sub_path
            } else {
                format!("{git_dir}/{}", e.sub_path)
            };
            match kind_of(e.mode)? {
                NodeKind::Dir => self.walk_keys(&path, &git_path, e.id, out)?,
                NodeKind::File => out.push((path, git_path, self.key_id_of(e.id)?, e.id)),
            }
        }
        Ok(())
    }

    /// The decrypted name `enc` in `dir` (remembered).
    fn name_of(&self, dir: &MemoryPath, enc: &str) -> Result<String, StoreError> {
        if let Some(n) = self
            .caches
            .names
            .borrow()
            .0
            .get(dir.as_str())
            .and_then(|m| m.get(enc))
        {
            return Ok(n.clone());
        }
        let n = self
            .keys
            .decrypt_name(dir.as_str(), enc)
            .map_err(|_| damaged("a stored name failed to decrypt"))?;
        let mut names = self.caches.names.borrow_mut();
        if names.1 >= CACHE_LIMIT {
            *names = Default::default();
        }
        names.1 += 1;
        names
            .0
            .entry(dir.as_str().to_string())
            .or_default()
            .insert(enc.to_string(), n.clone());
        Ok(n)
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
        let mut out = Vec::new();
        let mut failed = None;
        self.caches.for_each_in_dir(self.repo, oid, &mut |e, _| {
            if failed.is_some() {
                return;
            }
            let named = std::str::from_utf8(&e.name)
                .map_err(|_| damaged("a stored name is not text"))
                .and_then(|enc| Ok((self.name_of(dir, enc)?, kind_of(e.mode)?, e.id)));
            match named {
                Ok(c) => out.push(c),
                Err(err) => failed = Some(err),
            }
        })?;
        if let Some(err) = failed {
            return Err(err);
        }
        out.sort_by(|a, b| a.0.as_bytes().cmp(b.0.as_bytes()));
        Ok(out)
    }

    pub(crate) fn blob_plain_size(&self, oid: Oid) -> Result<u64, StoreError> {
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
        // Through the tree cache: a listing sizes every directory it
        // shows, and the views that follow it (an agent views its memory
        // directory first) then find their trees read.
        let mut total = 0u64;
        for e in self.caches.tree_entries(self.repo, oid)?.iter() {
            total += match kind_of(e.mode)? {
                NodeKind::File => self.blob_plain_size(e.id)?,
                NodeKind::Dir => self.tree_plain_size(e.id)?,
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
            let mut n = 0;
            // Read once, not kept in the tree cache (a walk of every tree).
            for (_, mode, id) in objects::tree_entries(repo, oid)? {
                match mode {
                    MODE_TREE => n += walk(repo, caches, id)?,
                    // A submodule (git's commit mode) is no file.
                    0o160000 => {}
                    _ => n += 1,
                }
            }
            remember(&caches.counts, oid, n);
            Ok(n)
        }
        match self.tree {
            None => Ok(0),
            Some(t) => walk(self.repo, self.caches, t),
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
        let key =
            match self
                .key_state
                .file_key_with(self.repo, self.keys, Some(self.caches), &id)?
            {
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

fn too_long() -> StoreError {
    StoreError::Limit("a path segment is too long to store".into())
}

/// What a tree entry's mode says it is.
fn kind_of(mode: i32) -> Result<NodeKind, StoreError> {
    match mode {
        MODE_TREE => Ok(NodeKind::Dir),
        m if m & 0o170000 == 0o100000 => Ok(NodeKind::File),
        _ => Err(damaged("a tree entry has an unexpected type")),
    }
}

/// Each segment of a memory path, encrypted under its parent path.
fn encrypted_segments(
    keys: &VaultKeys,
    path: &MemoryPath,
) -> Result<Vec<String>, crate::crypto::CryptoError> {
    let mut out = Vec::new();
    let mut parent = MemoryPath::root();
    for seg in path.segments() {
        out.push(keys.encrypt_name(parent.as_str(), seg)?);
        // A segment of a valid path always joins onto its parent.
        parent = parent
            .join(seg)
            .map_err(|_| crate::crypto::CryptoError::NameTooLong)?;
    }
    Ok(out)
}

/// The git path ("" for the root) of a memory path, in the form this
/// version writes: each segment encrypted under its parent path, under
/// its [`buckets`].
pub(crate) fn git_path(
    keys: &VaultKeys,
    path: &MemoryPath,
) -> Result<String, crate::crypto::CryptoError> {
    let mut out = String::new();
    for enc in encrypted_segments(keys, path)? {
        push_fanned(&mut out, &enc);
    }
    Ok(out)
}
