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

use std::collections::BTreeMap;
use std::io::Write as _;
use std::sync::Arc;

use git2::{ObjectType, Oid, Repository};

use super::engine::raw::Object;
use super::tree::{Caches, MODE_TREE, TreeEntry as Entry, find_entry, git_order};

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
}

/// A set of edits to one tree, by slash-separated git path.
#[derive(Default)]
pub(crate) struct TreeEdits {
    root: BTreeMap<Vec<u8>, Edit>,
    /// One update names a path twice, or as a file and a directory (as
    /// libgit2's tree update, this refuses the whole update).
    conflict: bool,
}

/// A tree update that cannot be made (the memory layer checks paths first,
/// so this means a damaged tree or a bug).
fn invalid(what: &str) -> git2::Error {
    git2::Error::from_str(&format!("tree update: {what}"))
}

impl TreeEdits {
    /// Point `path` at the blob `id` (replacing what was there).
    pub(crate) fn upsert(&mut self, path: &str, id: Oid) {
        self.put(path, Edit::Set(id));
    }

    /// Remove `path`, a file or a whole directory.
    pub(crate) fn remove(&mut self, path: &str) {
        self.put(path, Edit::Remove);
    }

    fn put(&mut self, path: &str, edit: Edit) {
        let mut parts: Vec<&[u8]> = path.split('/').map(str::as_bytes).collect();
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
        match w.level(base, &self.root, out)? {
            Some(id) => Ok(id),
            // Everything was removed: the root is the empty tree.
            None => w.tree(Vec::new(), base, out),
        }
    }
}

struct Writer<'a> {
    repo: &'a Repository,
    caches: &'a Caches,
}

impl Writer<'_> {
    /// Apply `edits` to the tree `base` (None: empty). Returns the new tree's
    /// id, or None if it came out empty (its parent drops it, as libgit2 does).
    fn level(
        &self,
        base: Option<Oid>,
        edits: &BTreeMap<Vec<u8>, Edit>,
        out: &mut Vec<Object>,
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
                Edit::Dir(children) => {
                    if at.is_some_and(|i| entries[i].mode != MODE_TREE) {
                        return Err(invalid("a file cannot be replaced by a directory"));
                    }
                    let sub_base = at.map(|i| entries[i].id);
                    self.level(sub_base, children, out)?
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
        if entries.is_empty() {
            return Ok(None);
        }
        self.tree(entries, base, out).map(Some)
    }

    fn tree(
        &self,
        entries: Vec<Entry>,
        base: Option<Oid>,
        out: &mut Vec<Object>,
    ) -> Result<Oid, git2::Error> {
        let mut data = Vec::with_capacity(entries.iter().map(|e| e.name.len() + 28).sum());
        for e in &entries {
            write!(data, "{:o} ", e.mode).expect("writing to a Vec cannot fail");
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

#[cfg(test)]
mod tests {
    use super::*;
    use git2::FileMode;
    use git2::build::TreeUpdateBuilder;

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
