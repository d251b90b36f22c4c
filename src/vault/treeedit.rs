//! Tree edits built in Rust: the same trees `git_tree_create_updated`
//! builds, with the bytes of every new tree kept for the log record.
//!
//! libgit2's tree update copies each changed tree into a hash map, sorts
//! it again and writes it; the record then read every new tree and blob
//! back from the object database (hashing each again). A mutation here
//! takes each base tree's entries from [`Caches::tree_entries`] (usually
//! the tree the previous mutation wrote), applies its edits to the sorted
//! list and writes the result, and the record takes the bytes it already
//! has.
//!
//! Edits of main's tree ([`TreeEdits::memory`], format 9) name entries by
//! their encrypted names and leave where they sit under their directory's
//! buckets to this module: found where the base tree holds them, new
//! ones placed where a lookup looks, and a tree past
//! [`FLAT_MAX`](super::tree::FLAT_MAX) entries split a bucket level down.
//! Plain edits (the key state's tree) are libgit2's, byte for byte.

use std::collections::BTreeMap;
use std::sync::Arc;

use git2::{ObjectType, Oid, Repository};

use super::engine::raw::Object;
use super::tree::{
    Caches, FANOUT_LEVELS, FLAT_MAX, MODE_TREE, Seek, TreeEntry as Entry, buckets, find_entry,
    git_order, is_bucket,
};

/// The mode of every file memvault stores.
pub(crate) const MODE_BLOB: i32 = 0o100644;

/// What happens at one name of a tree.
enum Edit {
    /// Point the name at this blob.
    Set(Oid),
    /// Remove the name (file or whole directory).
    Remove,
    /// Edit the directory at the name.
    Dir(BTreeMap<Vec<u8>, Edit>),
    /// Point the name at this object, of this mode (an entry moved into
    /// a bucket, see [`Writer::split`]).
    Put(i32, Oid),
}

/// A set of edits to one tree, by slash-separated git path.
#[derive(Default)]
pub(crate) struct TreeEdits {
    root: BTreeMap<Vec<u8>, Edit>,
    /// One update names a path twice, or as a file and a directory (as
    /// libgit2's tree update, this refuses the whole update).
    conflict: bool,
    /// Edits of the memory tree (see [`TreeEdits::memory`]).
    memory: bool,
}

/// A tree update that cannot be made (the memory layer checks paths first,
/// so this means a damaged tree or a bug).
fn invalid(what: &str) -> git2::Error {
    git2::Error::from_str(&format!("tree update: {what}"))
}

impl TreeEdits {
    /// Edits of a tree of memory files (main's), whose directories hold
    /// their entries under bucket trees (see
    /// [`Caches::seek_in_dir`]). A path names entries by their encrypted
    /// names, its bucket segments ignored: each entry is edited where
    /// the base tree holds it, and a new one goes where a lookup looks
    /// for it. A tree of a directory or bucket left holding more than
    /// [`FLAT_MAX`] entries directly (above the deepest bucket level)
    /// has them moved into the buckets of their next digit (format 9).
    pub(crate) fn memory() -> Self {
        TreeEdits {
            memory: true,
            ..Default::default()
        }
    }

    /// Point `path` at the blob `id` (replacing what was there).
    pub(crate) fn upsert(&mut self, path: &str, id: Oid) {
        self.put(path, Edit::Set(id));
    }

    /// Remove `path`, a file or a whole directory.
    pub(crate) fn remove(&mut self, path: &str) {
        self.put(path, Edit::Remove);
    }

    fn put(&mut self, path: &str, edit: Edit) {
        let memory = self.memory;
        let mut parts: Vec<&[u8]> = path
            .split('/')
            .map(str::as_bytes)
            .filter(|p| !(memory && is_bucket(p)))
            .collect();
        let last = parts.pop().unwrap_or_default().to_vec();
        let mut level = &mut self.root;
        for part in parts {
            let node = level
                .entry(part.to_vec())
                .or_insert_with(|| Edit::Dir(BTreeMap::new()));
            let Edit::Dir(children) = node else {
                // Written or removed as a whole, and written into.
                self.conflict = true;
                return;
            };
            level = children;
        }
        if level.contains_key(&last) {
            // Written into, then written or removed as a whole (or named
            // twice).
            self.conflict = true;
            return;
        }
        level.insert(last, edit);
    }

    /// Write the edited tree of `base` (None: the empty tree) and return
    /// its id. Every tree written is appended to `out` (trees that come
    /// out unchanged are not written again).
    pub(crate) fn write(
        &self,
        repo: &Repository,
        caches: &Caches,
        base: Option<Oid>,
        out: &mut Vec<Object>,
    ) -> Result<Oid, git2::Error> {
        if self.conflict {
            return Err(invalid("one path is both a file and a directory"));
        }
        let w = Writer { repo, caches };
        let placed;
        let (edits, depth) = if self.memory {
            placed = w.place(base, &self.root)?;
            (&placed, Some(0))
        } else {
            (&self.root, None)
        };
        match w.level(base, edits, out, depth)? {
            Some(id) => Ok(id),
            // Everything was removed: the root is the empty tree.
            None => w.tree(Vec::new(), base, out),
        }
    }
}

/// Whether a memory tree's entry is a bucket tree.
fn is_bucket_tree(e: &Entry) -> bool {
    e.mode == MODE_TREE && is_bucket(&e.name)
}

struct Writer<'a> {
    repo: &'a Repository,
    caches: &'a Caches,
}

impl Writer<'_> {
    /// The edits of a memory tree's directory `dir` (None: new), by
    /// encrypted name, as edits of its trees: each under the buckets where
    /// `dir` holds the entry, or where a lookup would look for a new one.
    fn place(
        &self,
        dir: Option<Oid>,
        edits: &BTreeMap<Vec<u8>, Edit>,
    ) -> Result<BTreeMap<Vec<u8>, Edit>, git2::Error> {
        let mut placed = BTreeMap::new();
        for (name, edit) in edits {
            let (sub, found) = match dir {
                Some(dir) => match self.caches.seek_in_dir(self.repo, dir, name)? {
                    Seek::Found(id, mode, sub) => (sub, Some((id, mode))),
                    Seek::Absent(sub) => (sub, None),
                },
                None => (String::new(), None),
            };
            let edit = match edit {
                Edit::Set(id) => Edit::Set(*id),
                Edit::Remove => Edit::Remove,
                Edit::Put(mode, id) => Edit::Put(*mode, *id),
                Edit::Dir(children) => {
                    let sub_dir = match found {
                        Some((id, MODE_TREE)) => Some(id),
                        Some(_) => return Err(invalid("a file cannot be replaced by a directory")),
                        None => None,
                    };
                    Edit::Dir(self.place(sub_dir, children)?)
                }
            };
            // The bucket digits before the name.
            let mut level = &mut placed;
            for digit in sub.split('/').filter(|s| s.len() == 1) {
                let node = level
                    .entry(digit.as_bytes().to_vec())
                    .or_insert_with(|| Edit::Dir(BTreeMap::new()));
                let Edit::Dir(children) = node else {
                    return Err(invalid("a bucket is named as an entry"));
                };
                level = children;
            }
            level.insert(name.clone(), edit);
        }
        Ok(placed)
    }

    /// Apply `edits` to the tree `base` (None: empty). Returns the new tree's
    /// id, or None if it came out empty (its parent drops it, as libgit2 does).
    /// `depth`: in a memory tree, how many bucket levels `base` is below
    /// its directory (see [`TreeEdits::memory`]); None elsewhere.
    fn level(
        &self,
        base: Option<Oid>,
        edits: &BTreeMap<Vec<u8>, Edit>,
        out: &mut Vec<Object>,
        depth: Option<usize>,
    ) -> Result<Option<Oid>, git2::Error> {
        let mut entries: Vec<Entry> = match base {
            Some(id) => self
                .caches
                .tree_entries(self.repo, id)?
                .iter()
                .map(|e| Entry {
                    name: e.name.clone(),
                    mode: e.mode,
                    id: e.id,
                })
                .collect(),
            None => Vec::new(),
        };
        // Entries keep their places (and so their order) until the end:
        // removed ones are marked, new ones kept apart.
        let mut removed = vec![false; entries.len()];
        let mut added: Vec<Entry> = Vec::new();
        for (name, edit) in edits {
            let at = find_entry(&entries, name).filter(|&i| !removed[i]);
            let new = match edit {
                Edit::Set(id) => {
                    if at.is_some_and(|i| entries[i].mode == MODE_TREE) {
                        return Err(invalid("a directory cannot be replaced by a file"));
                    }
                    Some((MODE_BLOB, *id))
                }
                Edit::Remove => {
                    let Some(i) = at else {
                        return Err(invalid("removing a name that is not in the tree"));
                    };
                    removed[i] = true;
                    continue;
                }
                Edit::Put(mode, id) => Some((*mode, *id)),
                Edit::Dir(children) => {
                    if at.is_some_and(|i| entries[i].mode != MODE_TREE) {
                        return Err(invalid("a file cannot be replaced by a directory"));
                    }
                    let sub_base = at.map(|i| entries[i].id);
                    let sub_depth = depth.map(|k| if is_bucket(name) { k + 1 } else { 0 });
                    self.level(sub_base, children, out, sub_depth)?
                        .map(|id| (MODE_TREE, id))
                }
            };
            match (at, new) {
                // Same kind (checked above): the entry keeps its place.
                (Some(i), Some((mode, id))) => {
                    entries[i].mode = mode;
                    entries[i].id = id;
                }
                (Some(i), None) => removed[i] = true,
                (None, Some((mode, id))) => added.push(Entry {
                    name: Arc::from(name.as_slice()),
                    mode,
                    id,
                }),
                (None, None) => {}
            }
        }
        let mut i = 0;
        entries.retain(|_| {
            i += 1;
            !removed[i - 1]
        });
        if !added.is_empty() {
            entries.append(&mut added);
            entries.sort_by(git_order);
        }
        if let Some(k) = depth.filter(|&k| k < FANOUT_LEVELS)
            && entries.iter().filter(|e| !is_bucket_tree(e)).count() > FLAT_MAX
        {
            entries = self.split(entries, k, out)?;
        }
        if entries.is_empty() {
            return Ok(None);
        }
        self.tree(entries, base, out).map(Some)
    }

    /// The entries of a memory tree `depth` bucket levels below its
    /// directory, with those it holds directly moved into the buckets of
    /// their next digit (each bucket split in turn if it then holds too
    /// many).
    fn split(
        &self,
        entries: Vec<Entry>,
        depth: usize,
        out: &mut Vec<Object>,
    ) -> Result<Vec<Entry>, git2::Error> {
        let mut groups: BTreeMap<u8, BTreeMap<Vec<u8>, Edit>> = BTreeMap::new();
        let mut kept = Vec::new();
        for e in entries {
            if is_bucket_tree(&e) {
                kept.push(e);
                continue;
            }
            let digit = buckets(&String::from_utf8_lossy(&e.name))[depth];
            groups
                .entry(digit)
                .or_default()
                .insert(e.name.to_vec(), Edit::Put(e.mode, e.id));
        }
        for (digit, group) in groups {
            let at = kept
                .iter()
                .position(|e| is_bucket_tree(e) && e.name[0] == digit);
            let base = at.map(|i| kept[i].id);
            let Some(id) = self.level(base, &group, out, Some(depth + 1))? else {
                return Err(invalid("a bucket came out empty"));
            };
            match at {
                Some(i) => kept[i].id = id,
                None => kept.push(Entry {
                    name: Arc::from(&[digit][..]),
                    mode: MODE_TREE,
                    id,
                }),
            }
        }
        kept.sort_by(git_order);
        Ok(kept)
    }

    fn tree(
        &self,
        entries: Vec<Entry>,
        base: Option<Oid>,
        out: &mut Vec<Object>,
    ) -> Result<Oid, git2::Error> {
        let mut data = Vec::with_capacity(entries.iter().map(|e| e.name.len() + 28).sum());
        for e in &entries {
            push_mode(&mut data, e.mode);
            data.push(b' ');
            data.extend_from_slice(&e.name);
            data.push(0);
            data.extend_from_slice(e.id.as_bytes());
        }
        // Writing an object the database has is a lookup, no write.
        let written = super::engine::objects::write_object(self.repo, ObjectType::Tree, &data)?;
        if Some(written) == base {
            return Ok(written);
        }
        self.caches.remember_tree(written, Arc::new(entries));
        out.push(Object {
            kind: ObjectType::Tree,
            id: written,
            data,
        });
        Ok(written)
    }
}

/// `mode` in octal without leading zeros, as git writes a tree entry's
/// mode (and as `{:o}` shows an i32: its bits).
fn push_mode(out: &mut Vec<u8>, mode: i32) {
    let bits = u64::from(mode as u32);
    out.extend_from_slice(super::engine::pack::digits(bits, 8, &mut [0; 22]));
}

#[cfg(test)]
mod tests {
    use super::*;
    use git2::FileMode;
    use git2::build::TreeUpdateBuilder;

    #[test]
    fn modes_are_written_in_octal_as_git_writes_them() {
        for mode in [
            0,
            7,
            8,
            0o40000,
            0o100644,
            0o100755,
            0o120000,
            0o160000,
            -1,
            i32::MAX,
        ] {
            let mut out = Vec::new();
            push_mode(&mut out, mode);
            assert_eq!(out, format!("{mode:o}").into_bytes());
        }
    }

    /// Repeatable choices (see `crate::test_rand`).
    struct Rng(u64);
    impl Rng {
        fn pick(&mut self, n: usize) -> usize {
            crate::test_rand(&mut self.0, n)
        }
    }

    fn repo() -> (tempfile::TempDir, Repository) {
        crate::vault::fsync::enable();
        let dir = tempfile::tempdir().unwrap();
        let repo = Repository::init_bare(dir.path()).unwrap();
        (dir, repo)
    }

    /// Paths under a few directories, names that test git's order
    /// ("a" / "a.b" / "a-b", where a directory sorts as "a/").
    fn random_path(rng: &mut Rng) -> String {
        const NAMES: [&str; 6] = ["a", "a.b", "a-b", "b", "a0", "zz"];
        let depth = 1 + rng.pick(3);
        (0..depth)
            .map(|_| NAMES[rng.pick(NAMES.len())])
            .collect::<Vec<_>>()
            .join("/")
    }

    /// Every edit sequence libgit2's tree update accepts gives the same
    /// tree here, byte for byte (same id), and every new tree is in `out`.
    #[test]
    fn same_trees_as_libgit2() {
        let (_dir, repo) = repo();
        let caches = Caches::default();
        let mut rng = Rng(0x9e37_79b9_7f4a_7c15);
        let mut base: Option<Oid> = None;
        let (mut checked, mut refused) = (0, 0);
        for round in 0..400 {
            let blob = repo.blob(format!("blob {round}").as_bytes()).unwrap();
            let mut ours = TreeEdits::default();
            let mut theirs = TreeUpdateBuilder::new();
            let n = 1 + rng.pick(3);
            let mut ops = Vec::new();
            for _ in 0..n {
                let path = random_path(&mut rng);
                let remove = rng.pick(3) == 0;
                ops.push((path, remove));
            }
            ops.sort();
            // One update that names a path twice, or a path and something
            // inside it, is refused whole (libgit2's answer to those
            // depends on its traversal order; memvault never makes one).
            let conflicting = ops.iter().enumerate().any(|(i, (p, _))| {
                ops.iter()
                    .enumerate()
                    .any(|(j, (q, _))| i != j && (p == q || q.starts_with(&format!("{p}/"))))
            });
            for (path, remove) in &ops {
                if *remove {
                    ours.remove(path);
                    theirs.remove(path);
                } else {
                    ours.upsert(path, blob);
                    theirs.upsert(path, blob, FileMode::Blob);
                }
            }
            if conflicting {
                let mut out = Vec::new();
                assert!(
                    ours.write(&repo, &caches, base, &mut out).is_err(),
                    "{ops:?}"
                );
                assert!(out.is_empty());
                refused += 1;
                continue;
            }
            let base_tree = match base {
                Some(b) => repo.find_tree(b).unwrap(),
                None => repo
                    .find_tree(repo.treebuilder(None).unwrap().write().unwrap())
                    .unwrap(),
            };
            let theirs = theirs.create_updated(&repo, &base_tree);
            let Ok(expected) = theirs else {
                // libgit2 refuses (a missing name removed, a file put
                // where a directory is or the other way): so must we.
                refused += 1;
                let mut out = Vec::new();
                assert!(
                    ours.write(&repo, &caches, base, &mut out).is_err(),
                    "round {round}: {ops:?}"
                );
                continue;
            };
            let mut out = Vec::new();
            let got = ours
                .write(&repo, &caches, base, &mut out)
                .unwrap_or_else(|e| panic!("round {round}: {ops:?}: {e}"));
            assert_eq!(got, expected, "round {round}: {ops:?}");
            for o in &out {
                assert_eq!(repo.odb().unwrap().read(o.id).unwrap().data(), &o.data[..]);
            }
            if got != base_tree.id() {
                assert!(out.iter().any(|o| o.id == got), "the new root is recorded");
            }
            checked += 1;
            base = Some(got);
        }
        assert!(
            checked > 100 && refused > 20,
            "only {checked} rounds were comparable, {refused} refused"
        );
    }

    /// A name shaped as an encrypted one: 52 base32 characters.
    fn enc_name(rng: &mut Rng) -> String {
        const B32: &[u8] = b"abcdefghijklmnopqrstuvwxyz234567";
        (0..52).map(|_| char::from(B32[rng.pick(32)])).collect()
    }

    /// Check the memory tree `root` against `model` (git path of names
    /// without buckets -> blob): every file found by a lookup where it is,
    /// nothing else held, every entry under the first of its own bucket
    /// digits, no tree above the deepest level holding more than
    /// `FLAT_MAX` entries directly. Returns the deepest bucket depth seen.
    fn check_memory_tree(
        repo: &Repository,
        caches: &Caches,
        root: Oid,
        model: &BTreeMap<String, Oid>,
    ) -> usize {
        // Walk: (tree, path of names, bucket digits above it in its dir).
        let mut held = BTreeMap::new();
        let mut deepest = 0;
        let mut stack = vec![(root, String::new(), String::new())];
        while let Some((id, dir, digits)) = stack.pop() {
            let entries = caches.tree_entries(repo, id).unwrap();
            let direct = entries.iter().filter(|e| !is_bucket_tree(e)).count();
            assert!(
                digits.len() == FANOUT_LEVELS || direct <= FLAT_MAX,
                "{direct} entries directly at depth {}",
                digits.len()
            );
            deepest = deepest.max(digits.len());
            for e in entries.iter() {
                let name = String::from_utf8(e.name.to_vec()).unwrap();
                if is_bucket_tree(e) {
                    assert!(digits.len() < FANOUT_LEVELS, "a bucket too deep");
                    stack.push((e.id, dir.clone(), format!("{digits}{name}")));
                    continue;
                }
                assert!(
                    buckets(&name).starts_with(digits.as_bytes()),
                    "{name} under {digits}"
                );
                let path = if dir.is_empty() {
                    name
                } else {
                    format!("{dir}/{name}")
                };
                if e.mode == MODE_TREE {
                    stack.push((e.id, path, String::new()));
                } else {
                    assert!(held.insert(path, e.id).is_none(), "a name held twice");
                }
            }
        }
        assert_eq!(&held, model);
        // And each is found by the lookup readers use.
        for (path, blob) in model {
            let mut at = root;
            let names: Vec<&str> = path.split('/').collect();
            for (i, name) in names.iter().enumerate() {
                match caches.seek_in_dir(repo, at, name.as_bytes()).unwrap() {
                    Seek::Found(id, _, _) if i + 1 == names.len() => assert_eq!(id, *blob),
                    Seek::Found(id, _, _) => at = id,
                    Seek::Absent(_) => panic!("{path} not found"),
                }
            }
        }
        deepest
    }

    /// Memory-tree edits (format 9) over random creates, rewrites,
    /// deletes and directory moves, with paths given with or without
    /// buckets: the tree always holds exactly the model's files, where a
    /// lookup finds them, each tree within its size; directories grow
    /// bucket levels as they fill.
    #[test]
    fn memory_trees_place_split_and_find_every_entry() {
        let (_dir, repo) = repo();
        let caches = Caches::default();
        let mut rng = Rng(0x005e_ed0f_7ee5);
        let dirs: Vec<String> = (0..3).map(|_| enc_name(&mut rng)).collect();
        let mut model: BTreeMap<String, Oid> = BTreeMap::new();
        let mut base: Option<Oid> = None;
        let mut deepest = 0;
        for round in 0..300 {
            let blob = repo.blob(format!("blob {round}").as_bytes()).unwrap();
            let mut edits = TreeEdits::memory();
            let mut next = model.clone();
            // Several changes per update, as an import or a merge makes.
            let mut touched = std::collections::BTreeSet::new();
            for _ in 0..1 + rng.pick(if round % 50 == 0 { 400 } else { 4 }) {
                let existing: Vec<String> = next.keys().cloned().collect();
                let pick = rng.pick(10);
                if pick < 6 || existing.is_empty() {
                    // A new file in one of the directories (a file at the
                    // root now and then).
                    let name = enc_name(&mut rng);
                    let path = match rng.pick(8) {
                        0 => name,
                        d => format!("{}/{name}", dirs[d % dirs.len()]),
                    };
                    if !touched.insert(path.clone()) {
                        continue;
                    }
                    // Given in format 3's form half of the time.
                    let given = if rng.pick(2) == 0 {
                        super::super::tree::fanned_git_path(&path)
                    } else {
                        path.clone()
                    };
                    edits.upsert(&given, blob);
                    next.insert(path, blob);
                } else {
                    let path = existing[rng.pick(existing.len())].clone();
                    if !touched.insert(path.clone()) {
                        continue;
                    }
                    if pick < 8 {
                        edits.upsert(&path, blob);
                        next.insert(path, blob);
                    } else {
                        edits.remove(&super::super::tree::fanned_git_path(&path));
                        next.remove(&path);
                    }
                }
            }
            let mut out = Vec::new();
            let tree = edits
                .write(&repo, &caches, base, &mut out)
                .unwrap_or_else(|e| panic!("round {round}: {e}"));
            for o in &out {
                assert_eq!(repo.odb().unwrap().read(o.id).unwrap().data(), &o.data[..]);
            }
            model = next;
            deepest = deepest.max(check_memory_tree(&repo, &caches, tree, &model));
            base = Some(tree);
        }
        assert!(model.len() > 1000, "{}", model.len());
        assert!(deepest >= 2, "the directories never grew two bucket levels");
        // A whole directory moved (a rename): removed, and its files put
        // under a new name, found there.
        let moved = enc_name(&mut rng);
        let mut edits = TreeEdits::memory();
        edits.remove(&dirs[1]);
        let below: Vec<(String, Oid)> = model
            .iter()
            .filter(|(p, _)| p.starts_with(&format!("{}/", dirs[1])))
            .map(|(p, b)| (p.clone(), *b))
            .collect();
        assert!(below.len() > 100);
        for (p, b) in &below {
            let to = format!("{moved}/{}", &p[dirs[1].len() + 1..]);
            edits.upsert(&to, *b);
            model.remove(p);
            model.insert(to, *b);
        }
        let tree = edits.write(&repo, &caches, base, &mut Vec::new()).unwrap();
        check_memory_tree(&repo, &caches, tree, &model);
    }

    /// A tree holding one file (a blob "x") at `path`.
    fn one_file(repo: &Repository, caches: &Caches, path: &str, out: &mut Vec<Object>) -> Oid {
        let mut add = TreeEdits::default();
        add.upsert(path, repo.blob(b"x").unwrap());
        add.write(repo, caches, None, out).unwrap()
    }

    #[test]
    fn removing_everything_leaves_the_empty_tree() {
        let (_dir, repo) = repo();
        let caches = Caches::default();
        let mut out = Vec::new();
        let t = one_file(&repo, &caches, "d/e/f", &mut out);
        assert_eq!(out.len(), 3);
        let mut rm = TreeEdits::default();
        rm.remove("d/e/f");
        let mut out = Vec::new();
        let empty = rm.write(&repo, &caches, Some(t), &mut out).unwrap();
        assert_eq!(
            empty,
            Oid::hash_object(ObjectType::Tree, b"").unwrap(),
            "empty directories are dropped up to the root"
        );
    }

    /// The cache answers for trees written through it, and stays within
    /// its byte budget (a huge tree is simply not kept).
    #[test]
    fn the_tree_cache_answers_and_stays_bounded() {
        let (_dir, repo) = repo();
        let caches = Caches::default();
        let t = one_file(&repo, &caches, "d/f", &mut Vec::new());
        let blob = repo.blob(b"x").unwrap();
        let root = caches.tree_entries(&repo, t).unwrap();
        assert_eq!(root.len(), 1);
        assert_eq!(&root[0].name[..], b"d");
        assert_eq!(caches.tree_bytes(), 2 * (1 + 64), "two trees of one entry");
        let names: Vec<String> = (0..200_000).map(|i| format!("{i:080}")).collect();
        let mut big = TreeEdits::default();
        for n in &names {
            big.upsert(n, blob);
        }
        let b = big.write(&repo, &caches, None, &mut Vec::new()).unwrap();
        assert!(caches.tree_bytes() <= 16 << 20);
        // Read back through libgit2 (too big to keep): still right.
        assert_eq!(caches.tree_entries(&repo, b).unwrap().len(), names.len());
    }
}
