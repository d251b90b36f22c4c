//! [`MemStore`]: an in-memory [`Store`], for tests and fuzzing.
//!
//! It keeps every contract of [`super::store`]: `/memories` is always a
//! directory, directories exist exactly when a file lies below them, a
//! mutation is applied whole or not at all (every change is checked before
//! anything is touched), and each applied mutation counts as one commit.
//! Content is held in [`Zeroizing`] buffers, so it is wiped when replaced
//! or dropped. It is not durable and takes no lock: it is for one process.

use std::collections::BTreeMap;
use std::ops::Bound;

use zeroize::Zeroizing;

use super::path::MemoryPath;
use super::result::ToolResult;
use super::store::{
    Change, ChangeFacts, DirEntry, NodeKind, Op, Outcome, Snapshot, Store, StoreError,
};

/// The files of a [`MemStore`], keyed by canonical path.
#[derive(Default)]
struct Files(BTreeMap<String, Zeroizing<Vec<u8>>>);

impl Files {
    /// Every file strictly below `dir`, in byte order of their paths.
    fn below<'a>(
        &'a self,
        dir: &MemoryPath,
    ) -> impl Iterator<Item = (&'a String, &'a Zeroizing<Vec<u8>>)> + 'a {
        let prefix = format!("{}/", dir.as_str());
        self.0
            .range::<str, _>((Bound::Included(prefix.as_str()), Bound::Unbounded))
            .take_while(move |(k, _)| k.starts_with(&prefix))
    }

    fn node(&self, path: &MemoryPath) -> Option<NodeKind> {
        if path.is_root() {
            Some(NodeKind::Dir)
        } else if self.0.contains_key(path.as_str()) {
            Some(NodeKind::File)
        } else if self.below(path).next().is_some() {
            Some(NodeKind::Dir)
        } else {
            None
        }
    }

    /// The nearest ancestor of `path` that is a file, if any.
    fn file_ancestor(&self, path: &MemoryPath) -> Option<MemoryPath> {
        path.ancestors().find(|a| self.0.contains_key(a.as_str()))
    }

    /// Checks `change` against the current tree; nothing is modified.
    fn check(&self, change: &Change) -> Result<(), StoreError> {
        match change {
            Change::Write { path, .. } => {
                if self.node(path) == Some(NodeKind::Dir) {
                    return Err(StoreError::Limit(format!(
                        "cannot write {path}: it is a directory"
                    )));
                }
                if let Some(a) = self.file_ancestor(path) {
                    return Err(StoreError::Limit(format!(
                        "cannot write {path}: {a} is a file"
                    )));
                }
            }
            Change::Delete { path } => {
                if path.is_root() {
                    return Err(StoreError::Limit("cannot delete /memories itself".into()));
                }
                if self.node(path).is_none() {
                    return Err(StoreError::NotFound);
                }
            }
            Change::Rename { from, to } => {
                if from.is_root() || to.is_root() {
                    return Err(StoreError::Limit("cannot move /memories itself".into()));
                }
                let Some(kind) = self.node(from) else {
                    return Err(StoreError::NotFound);
                };
                if self.node(to).is_some() {
                    return Err(StoreError::Limit(format!("cannot move to {to}: it exists")));
                }
                if to.starts_with(from) {
                    return Err(StoreError::Limit(format!("cannot move {from} into itself")));
                }
                if let Some(a) = self.file_ancestor(to) {
                    return Err(StoreError::Limit(format!(
                        "cannot move to {to}: {a} is a file"
                    )));
                }
                if kind == NodeKind::Dir {
                    for (key, _) in self.below(from) {
                        let rebased = MemoryPath::parse_stored(key)
                            .ok()
                            .and_then(|p| p.rebase(from, to));
                        if rebased.is_none() {
                            return Err(StoreError::Limit(format!(
                                "cannot move {from} to {to}: a path below it would break the path limits"
                            )));
                        }
                    }
                }
            }
        }
        Ok(())
    }

    /// Applies a change that [`Files::check`] accepted.
    fn apply(&mut self, change: Change) {
        match change {
            Change::Write { path, content } => {
                self.0.insert(path.as_str().to_owned(), content);
            }
            Change::Delete { path } => {
                self.0.remove(path.as_str());
                let keys: Vec<String> = self.below(&path).map(|(k, _)| k.clone()).collect();
                for key in keys {
                    self.0.remove(&key);
                }
            }
            Change::Rename { from, to } => {
                if let Some(content) = self.0.remove(from.as_str()) {
                    self.0.insert(to.as_str().to_owned(), content);
                    return;
                }
                let keys: Vec<String> = self.below(&from).map(|(k, _)| k.clone()).collect();
                let cut = from.as_str().len();
                for key in keys {
                    if let (Some(content), Some(rest)) = (self.0.remove(&key), key.get(cut..)) {
                        self.0.insert(format!("{}{rest}", to.as_str()), content);
                    }
                }
            }
        }
    }
}

impl Snapshot for Files {
    fn kind(&self, path: &MemoryPath) -> Result<Option<NodeKind>, StoreError> {
        Ok(self.node(path))
    }

    fn read(&self, path: &MemoryPath) -> Result<Zeroizing<Vec<u8>>, StoreError> {
        self.0
            .get(path.as_str())
            .map(|c| Zeroizing::new(c.to_vec()))
            .ok_or(StoreError::NotFound)
    }

    fn list(&self, dir: &MemoryPath) -> Result<Vec<DirEntry>, StoreError> {
        if self.node(dir) != Some(NodeKind::Dir) {
            return Err(StoreError::NotFound);
        }
        let cut = dir.as_str().len() + 1;
        let mut children: BTreeMap<&str, (NodeKind, u64)> = BTreeMap::new();
        for (key, content) in self.below(dir) {
            let rest = key.get(cut..).unwrap_or_default();
            let (name, kind) = match rest.split_once('/') {
                None => (rest, NodeKind::File),
                Some((name, _)) => (name, NodeKind::Dir),
            };
            let size = u64::try_from(content.len()).unwrap_or(u64::MAX);
            let entry = children.entry(name).or_insert((kind, 0));
            entry.1 = entry.1.saturating_add(size);
        }
        Ok(children
            .into_iter()
            .map(|(name, (kind, size))| DirEntry {
                name: name.to_owned(),
                kind,
                size,
            })
            .collect())
    }
}

/// An in-memory store (see the module docs).
#[derive(Default)]
pub struct MemStore {
    files: Files,
    log: Vec<(Op, ChangeFacts)>,
    viewed: Vec<MemoryPath>,
    unavailable: Option<String>,
}

impl MemStore {
    /// An empty store: just `/memories`.
    pub fn new() -> MemStore {
        MemStore::default()
    }

    /// How many mutations were applied (one per successful write).
    pub fn commits(&self) -> usize {
        self.log.len()
    }

    /// The operation and audit facts of every applied mutation, in order.
    pub fn log(&self) -> &[(Op, ChangeFacts)] {
        &self.log
    }

    /// Puts a file in place without a commit, for setting up tests. The
    /// same checks as a write apply.
    pub fn seed(
        &mut self,
        path: &MemoryPath,
        content: impl Into<Vec<u8>>,
    ) -> Result<(), StoreError> {
        let change = Change::Write {
            path: path.clone(),
            content: Zeroizing::new(content.into()),
        };
        self.files.check(&change)?;
        self.files.apply(change);
        Ok(())
    }

    /// The content of the file at `path`.
    pub fn get(&self, path: &MemoryPath) -> Option<&[u8]> {
        self.files.0.get(path.as_str()).map(|c| c.as_slice())
    }

    /// Every file path, in byte order.
    pub fn paths(&self) -> impl Iterator<Item = &str> {
        self.files.0.keys().map(String::as_str)
    }

    /// The paths passed to [`Store::note_viewed`], in order.
    pub fn viewed(&self) -> &[MemoryPath] {
        &self.viewed
    }

    /// Makes every later read and write fail with
    /// [`StoreError::Unavailable`] (`Some(reason)`), or work again (`None`).
    pub fn set_unavailable(&mut self, reason: Option<String>) {
        self.unavailable = reason;
    }

    fn available(&self) -> Result<(), StoreError> {
        match &self.unavailable {
            Some(reason) => Err(StoreError::Unavailable(reason.clone())),
            None => Ok(()),
        }
    }
}

impl Store for MemStore {
    fn read(
        &mut self,
        f: &mut dyn FnMut(&dyn Snapshot) -> Result<ToolResult, StoreError>,
    ) -> Result<ToolResult, StoreError> {
        self.available()?;
        f(&self.files)
    }

    fn write(
        &mut self,
        f: &mut dyn FnMut(&dyn Snapshot) -> Result<Outcome, StoreError>,
    ) -> Result<ToolResult, StoreError> {
        self.available()?;
        let outcome = f(&self.files)?;
        if let Some(mutation) = outcome.mutation {
            self.files.check(&mutation.change)?;
            self.files.apply(mutation.change);
            self.log.push((mutation.op, mutation.facts));
        }
        Ok(outcome.result)
    }

    fn note_viewed(&mut self, path: &MemoryPath) {
        self.viewed.push(path.clone());
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::memory::store::Mutation;

    fn p(s: &str) -> MemoryPath {
        MemoryPath::parse(s).unwrap()
    }

    fn apply(store: &mut MemStore, op: Op, change: Change) -> Result<ToolResult, StoreError> {
        let mut change = Some(change);
        store.write(&mut |_| {
            Ok(Outcome {
                result: ToolResult::ok("done"),
                mutation: change.take().map(|change| Mutation {
                    op,
                    change,
                    facts: ChangeFacts::default(),
                }),
            })
        })
    }

    fn write(path: &str, content: &str) -> Change {
        Change::Write {
            path: p(path),
            content: Zeroizing::new(content.as_bytes().to_vec()),
        }
    }

    #[test]
    fn root_always_exists_and_dirs_are_implicit() {
        let mut s = MemStore::new();
        let snap = &s.files;
        assert_eq!(snap.kind(&MemoryPath::root()).unwrap(), Some(NodeKind::Dir));
        assert!(snap.list(&MemoryPath::root()).unwrap().is_empty());
        apply(&mut s, Op::Create, write("/memories/a/b/c.txt", "hello")).unwrap();
        let snap = &s.files;
        assert_eq!(snap.kind(&p("/memories/a")).unwrap(), Some(NodeKind::Dir));
        assert_eq!(snap.kind(&p("/memories/a/b")).unwrap(), Some(NodeKind::Dir));
        assert_eq!(
            snap.kind(&p("/memories/a/b/c.txt")).unwrap(),
            Some(NodeKind::File)
        );
        assert_eq!(snap.kind(&p("/memories/a/b/c")).unwrap(), None);
        assert_eq!(snap.kind(&p("/memories/a/b/c.txt/d")).unwrap(), None);
        assert!(matches!(
            snap.read(&p("/memories/a")),
            Err(StoreError::NotFound)
        ));
        assert!(matches!(
            snap.list(&p("/memories/a/b/c.txt")),
            Err(StoreError::NotFound)
        ));
        assert_eq!(s.commits(), 1);
        apply(
            &mut s,
            Op::Delete,
            Change::Delete {
                path: p("/memories/a/b/c.txt"),
            },
        )
        .unwrap();
        assert_eq!(
            s.files.kind(&p("/memories/a")).unwrap(),
            None,
            "no empty dirs"
        );
        assert_eq!(s.commits(), 2);
    }

    #[test]
    fn list_gives_sorted_children_with_recursive_sizes() {
        let mut s = MemStore::new();
        s.seed(&p("/memories/b.txt"), "12345").unwrap();
        s.seed(&p("/memories/a/x"), "123").unwrap();
        s.seed(&p("/memories/a/.h/y"), "1234567").unwrap();
        s.seed(&p("/memories/a b"), "1").unwrap();
        s.seed(&p("/memories/a-"), "").unwrap();
        let entries = s.files.list(&MemoryPath::root()).unwrap();
        let got: Vec<(&str, NodeKind, u64)> = entries
            .iter()
            .map(|e| (e.name.as_str(), e.kind, e.size))
            .collect();
        assert_eq!(
            got,
            [
                ("a", NodeKind::Dir, 10),
                ("a b", NodeKind::File, 1),
                ("a-", NodeKind::File, 0),
                ("b.txt", NodeKind::File, 5)
            ]
        );
        assert_eq!(s.commits(), 0, "seeding is not a commit");
    }

    #[test]
    fn refused_changes_change_nothing() {
        let mut s = MemStore::new();
        s.seed(&p("/memories/f"), "x").unwrap();
        s.seed(&p("/memories/d/g"), "y").unwrap();
        let bad = [
            write("/memories/d", "over a dir"),
            write("/memories/f/under", "below a file"),
            Change::Delete {
                path: MemoryPath::root(),
            },
            Change::Delete {
                path: p("/memories/nope"),
            },
            Change::Rename {
                from: p("/memories/nope"),
                to: p("/memories/z"),
            },
            Change::Rename {
                from: p("/memories/f"),
                to: p("/memories/d/g"),
            },
            Change::Rename {
                from: p("/memories/d"),
                to: p("/memories/d/e"),
            },
            Change::Rename {
                from: p("/memories/d"),
                to: p("/memories/f/e"),
            },
            Change::Rename {
                from: MemoryPath::root(),
                to: p("/memories/r"),
            },
        ];
        for change in bad {
            assert!(apply(&mut s, Op::Create, change).is_err());
        }
        assert_eq!(s.commits(), 0);
        assert_eq!(
            s.paths().collect::<Vec<_>>(),
            ["/memories/d/g", "/memories/f"]
        );
    }

    #[test]
    fn rename_moves_a_whole_directory() {
        let mut s = MemStore::new();
        s.seed(&p("/memories/d/a"), "1").unwrap();
        s.seed(&p("/memories/d/s/b"), "2").unwrap();
        s.seed(&p("/memories/d2"), "3").unwrap();
        apply(
            &mut s,
            Op::Rename,
            Change::Rename {
                from: p("/memories/d"),
                to: p("/memories/n/e/w"),
            },
        )
        .unwrap();
        assert_eq!(
            s.paths().collect::<Vec<_>>(),
            ["/memories/d2", "/memories/n/e/w/a", "/memories/n/e/w/s/b"]
        );
        assert_eq!(s.get(&p("/memories/n/e/w/s/b")), Some(&b"2"[..]));
    }

    #[test]
    fn rename_refuses_to_break_path_limits() {
        let mut s = MemStore::new();
        let deep = format!("/memories/d{}", "/a".repeat(19));
        s.seed(&p(&deep), "x").unwrap();
        let r = apply(
            &mut s,
            Op::Rename,
            Change::Rename {
                from: p("/memories/d"),
                to: p("/memories/x/y"),
            },
        );
        assert!(matches!(r, Err(StoreError::Limit(_))));
        assert_eq!(s.commits(), 0);
    }

    #[test]
    fn unavailable_store_fails_reads_and_writes() {
        let mut s = MemStore::new();
        s.set_unavailable(Some("disk gone".into()));
        let r = s.read(&mut |_| Ok(ToolResult::ok("x")));
        assert_eq!(
            r.unwrap_err().to_string(),
            "the vault could not complete the operation (disk gone); nothing was changed"
        );
        assert!(apply(&mut s, Op::Create, write("/memories/a", "x")).is_err());
        s.set_unavailable(None);
        assert!(apply(&mut s, Op::Create, write("/memories/a", "x")).is_ok());
    }
}
