//! Undo without rewriting history: `revert` of one commit or of a whole
//! session, and `restore` of a path as it was at a revision. Each is one
//! new commit, marked with what it undoes.
//!
//! Stored blobs are bound to their path and file key, and encrypted names
//! are deterministic, so putting an old blob back at its own git path
//! restores the old content exactly, with no re-encryption; except when a
//! file the undo leaves in place holds that key (the file was renamed
//! since): the version is then sealed again under a new key, so that no
//! two files share one.
//!
//! Conflicts: a revert refuses when a later commit (not being undone)
//! changed a file the revert would change, unless the file now holds the
//! version, or the text, the undone commits left; a restore refuses when it would
//! overwrite or delete content written after the revision. `force`
//! applies the undo anyway. A path whose parent is now a file, or which is
//! now a directory, or (for a revert) which now holds another file, with
//! another key, that others made, cannot be put back and is refused
//! (skipped with `force`, what stands there left as it is), unless an
//! undone commit made what stands there: that goes first. A version whose file key was erased cannot be put back and is
//! skipped, and said so.

use std::collections::{BTreeMap, BTreeSet};

use git2::{ObjectType, Oid};
use zeroize::Zeroizing;

use crate::crypto;
use crate::memory::MemoryPath;
use crate::vault::CommitMeta;
use crate::vault::tree::{MODE_TREE, Seek, is_bucket};
use crate::vault::treeedit::TreeEdits;
use crate::vault::{KeyChange, Rev, Vault, VaultError, damaged};

/// What to undo.
#[derive(Debug, Clone)]
pub enum UndoTarget {
    /// One commit on main.
    Commit(Rev),
    /// Every commit one session made.
    Session(String),
    /// A file or directory, as it was at a revision.
    Restore { path: MemoryPath, at: Rev },
}

/// A later change that touched a file the undo would change.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Conflict {
    pub rev: Rev,
    pub path: MemoryPath,
}

/// What an undo did, or why it did nothing.
#[derive(Debug)]
pub enum UndoOutcome {
    /// One new commit.
    Done {
        commit: Rev,
        changed: Vec<MemoryPath>,
        skipped_erased: Vec<MemoryPath>,
        skipped_blocked: Vec<MemoryPath>,
        /// Files the undone changes moved away from a path now taken: left
        /// where they are, since nothing can go back there.
        kept_in_place: Vec<MemoryPath>,
    },
    /// Nothing changed: the files are already as the undo would leave
    /// them, or what it would change was erased or cannot go back.
    Nothing {
        skipped_erased: Vec<MemoryPath>,
        skipped_blocked: Vec<MemoryPath>,
        kept_in_place: Vec<MemoryPath>,
    },
    /// Refused; nothing was changed.
    Refused {
        conflicts: Vec<Conflict>,
        blocked: Vec<MemoryPath>,
        kept_in_place: Vec<MemoryPath>,
    },
}

/// A conflict with the merge `id` at `git_path`, if `side` (the files the
/// merge differs from a parent in) holds it.
fn conflict_at(
    side: &BTreeMap<String, MemoryPath>,
    git_path: &str,
    id: Oid,
    conflicts: &mut Vec<(String, Conflict)>,
) {
    if let Some(path) = side.get(git_path) {
        conflicts.push((
            git_path.to_string(),
            Conflict {
                rev: Rev::from_oid(id),
                path: path.clone(),
            },
        ));
    }
}

/// How a commit of an undo's chain counts.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Step {
    /// Its changes against its first parent.
    Plain,
    /// A commit the merge at chain index `.0` brought in: its changes
    /// against its own first parent.
    Brought(usize),
    /// A merge on main whose brought-in commits follow it in the chain:
    /// it touched a file the undo would set if its content there differs
    /// from the side the file's undone change came from (the brought-in
    /// side, for a change among its own brought-in commits; else main's).
    Merge,
    /// A merge among another merge's brought-in commits, its own also
    /// listed: the files that differ from both its parents.
    Nested(usize),
}

/// Main for an undo, newest first.
type Chain = Vec<(Oid, Step)>;

/// One file the undo wants to set: its path and the blob to put back
/// (None: remove it).
struct Target {
    path: MemoryPath,
    desired: Option<Oid>,
    /// The chain index of the merge that brought in the undone change
    /// that set this target (None: a change made on main itself).
    via: Option<usize>,
    /// The undone commit that set it (None: a restore).
    by: Option<Oid>,
    /// The path `desired` is sealed under, where a later rename by
    /// another moved the file since (None: `path` itself): the version
    /// is sealed again under `path`, with its own key, when put back.
    sealed_at: Option<MemoryPath>,
}

impl Vault {
    /// Undo `target` as one new commit (see the module docs).
    pub fn undo(&mut self, target: UndoTarget, force: bool) -> Result<UndoOutcome, VaultError> {
        if let UndoTarget::Commit(c) = &target {
            let op = self.meta_of(c.oid())?.op;
            let how = match op.as_str() {
                "config" => Some(
                    "set the setting back with `memvault config set KEY VALUE` (`memvault history --op config` shows each change, from what to what)",
                ),
                "keyslot" | "passwd" | "rekey" => Some(
                    "keyslots and keys change with `memvault key add`, `key remove` and `passwd`",
                ),
                "init" | "migrate" => Some("it changed no memory file"),
                "purge" => Some(
                    "the versions it erased cannot come back, and the files it kept hold the same text (sealed under new keys)",
                ),
                _ => None,
            };
            if let Some(how) = how {
                return Err(VaultError::Refused(format!(
                    "revision {} is a `{op}`, which revert does not undo: {how}",
                    c.short()
                )));
            }
        }
        self.with_writer_lock(|vault, tip| vault.undo_locked(tip, &target, force))
    }

    /// The chain of main from the tip back to (and including) `oldest`,
    /// newest first.
    fn chain_to(&self, tip: Oid, oldest: Oid) -> Result<Vec<Oid>, VaultError> {
        let mut chain = Vec::new();
        let mut next = Some(tip);
        while let Some(id) = next {
            chain.push(id);
            if id == oldest {
                return Ok(chain);
            }
            next = self.first_parent(id)?;
        }
        Err(damaged("a revision is not on main"))
    }

    /// For a revert: main from `tip` back to the oldest commit `target`
    /// names, newest first, and the set of those it names. After a merge
    /// that says what it brought in from another machine come those
    /// commits (children before parents), each with its own changes; the
    /// merge then counts only what it changed itself (`true`: files that
    /// differ from both its parents, where two sides were combined), so a
    /// session that ran on another machine is undone here commit by
    /// commit, and a change made on this side since conflicts. A merge is
    /// never part of a session's undo (it is the sync, not the session's
    /// own work); it is undone whole only when named itself.
    fn undo_chain(
        &self,
        tip: Oid,
        target: &UndoTarget,
    ) -> Result<(Chain, BTreeSet<Oid>), VaultError> {
        let named = |id: Oid| matches!(target, UndoTarget::Commit(c) if c.oid() == id);
        // Whether the session made any commit at all.
        let seen = std::cell::Cell::new(false);
        let member = |id: Oid| -> Result<bool, VaultError> {
            Ok(match target {
                UndoTarget::Commit(c) => c.oid() == id,
                UndoTarget::Session(s) => {
                    // Its changes to memory files: settings and keyslot
                    // changes are not a revert's to undo (as for one
                    // revision, above).
                    let meta = self.meta_of(id)?;
                    if meta.session == *s {
                        seen.set(true);
                    }
                    meta.session == *s
                        && !matches!(
                            meta.op.as_str(),
                            "init"
                                | "merge"
                                | "migrate"
                                | "purge"
                                | "config"
                                | "keyslot"
                                | "passwd"
                                | "rekey"
                        )
                }
                UndoTarget::Restore { .. } => false,
            })
        };
        let mut set = BTreeSet::new();
        let mut chain = Vec::new();
        let mut oldest_index = None;
        let mut next = Some(tip);
        'walk: while let Some(id) = next {
            let parents = self.parents_of(id)?;
            let at = chain.len();
            let mut group = vec![(id, Step::Plain)];
            if parents.len() > 1 && !named(id) {
                let brought = self.brought_in(id)?;
                if !brought.is_empty() {
                    group[0].1 = Step::Merge;
                    for c in brought {
                        let nested = !named(c)
                            && self.parents_of(c)?.len() > 1
                            && !self.meta_of(c)?.merged.is_empty();
                        group.push((
                            c,
                            if nested {
                                Step::Nested(at)
                            } else {
                                Step::Brought(at)
                            },
                        ));
                    }
                }
            }
            for (c, step) in group {
                chain.push((c, step));
                if member(c)? {
                    set.insert(c);
                    oldest_index = Some(chain.len() - 1);
                    if matches!(target, UndoTarget::Commit(_)) {
                        break 'walk;
                    }
                }
            }
            next = parents.first().copied();
        }
        let Some(oldest_index) = oldest_index else {
            return Err(match target {
                UndoTarget::Session(s) if !seen.get() => VaultError::Refused(format!(
                    "no change on main was made in session {s:?} (`memvault sessions` lists the sessions)"
                )),
                UndoTarget::Session(s) => VaultError::Refused(format!(
                    "session {s:?} made no changes to undo: a merge, a settings or keyslot change, or a purge is not a session revert's to undo (`memvault revert MERGE_REV` undoes one merge whole; `memvault config set`, `memvault key`)"
                )),
                _ => damaged("a revision is not on main"),
            });
        };
        chain.truncate(oldest_index + 1);
        Ok((chain, set))
    }

    /// A commit's parents, the object checked before libgit2 reads it.
    fn parents_of(&self, id: Oid) -> Result<Vec<Oid>, VaultError> {
        self.check_object(id)?;
        let c = self
            .repo
            .find_commit(id)
            .map_err(|_| damaged("a commit is unreadable"))?;
        Ok(c.parent_ids().collect())
    }

    /// The commits the merge `id` brought in (its metadata's list), newest
    /// first and every child before its parents.
    fn brought_in(&self, id: Oid) -> Result<Vec<Oid>, VaultError> {
        let listed: Vec<Oid> = self
            .meta_of(id)?
            .merged
            .iter()
            .map(|h| Oid::from_str(h).map_err(|_| damaged("a merge names a bad commit")))
            .collect::<Result<_, _>>()?;
        let inside: BTreeSet<Oid> = listed.iter().copied().collect();
        // Depth first, each commit after its parents (oldest first), then
        // reversed.
        let mut done = BTreeSet::new();
        let mut order = Vec::with_capacity(listed.len());
        for &start in &listed {
            let mut stack = vec![(start, false)];
            while let Some((c, parents_done)) = stack.pop() {
                if parents_done {
                    order.push(c);
                    continue;
                }
                if !done.insert(c) {
                    continue;
                }
                stack.push((c, true));
                for p in self.parents_of(c)? {
                    if inside.contains(&p) && !done.contains(&p) {
                        stack.push((p, false));
                    }
                }
            }
        }
        order.reverse();
        Ok(order)
    }

    /// The merge `id` (at chain index `index`), for the files the undo
    /// sets so far: a conflict where its content differs from the side
    /// the undone change came from. A change it brought in (kept by the
    /// merge as it came) is no conflict; one it combined with this side's,
    /// or set aside for this side's (a conflict copy), is.
    fn merge_conflicts(
        &self,
        id: Oid,
        index: usize,
        targets: &BTreeMap<String, Target>,
        conflicts: &mut Vec<(String, Conflict)>,
    ) -> Result<(), VaultError> {
        if targets.is_empty() {
            return Ok(());
        }
        let parents = self.parents_of(id)?;
        let from_main = self.differs_from(parents.first().copied(), id)?;
        let from_brought = self.differs_from(parents.get(1).copied(), id)?;
        for (git_path, t) in targets {
            let side = if t.via == Some(index) {
                &from_brought
            } else {
                &from_main
            };
            conflict_at(side, git_path, id, conflicts);
        }
        Ok(())
    }

    /// The files whose content at `id` differs from `parent`'s, by git
    /// path.
    fn differs_from(
        &self,
        parent: Option<Oid>,
        id: Oid,
    ) -> Result<BTreeMap<String, MemoryPath>, VaultError> {
        Ok(self
            .changed_between(parent, Some(id), None)?
            .into_iter()
            .map(|c| (c.git_path, c.path))
            .collect())
    }

    /// A merge `id` among the commits the merge at chain index `m` brought
    /// in, for the files set by undone commits of that same group: a
    /// conflict where its content differs from the side the undone commit
    /// is on (its second parent for one it brought in itself, its first
    /// for one of its first parent's ancestors). A change it set aside
    /// for the other side's is then a conflict, as at a merge on main.
    fn nested_merge_conflicts(
        &self,
        id: Oid,
        m: usize,
        chain: &Chain,
        targets: &BTreeMap<String, Target>,
        conflicts: &mut Vec<(String, Conflict)>,
    ) -> Result<(), VaultError> {
        let ours: Vec<(&String, Oid)> = targets
            .iter()
            .filter(|(_, t)| t.via == Some(m))
            .filter_map(|(g, t)| t.by.map(|by| (g, by)))
            .collect();
        if ours.is_empty() {
            return Ok(());
        }
        let parents = self.parents_of(id)?;
        let (Some(&first), Some(&second)) = (parents.first(), parents.get(1)) else {
            return Ok(());
        };
        let brought: BTreeSet<Oid> = self
            .meta_of(id)?
            .merged
            .iter()
            .filter_map(|h| Oid::from_str(h).ok())
            .collect();
        // The group's commits its first parent reaches.
        let group: BTreeSet<Oid> = chain
            .iter()
            .filter(|(_, s)| matches!(s, Step::Brought(x) | Step::Nested(x) if *x == m))
            .map(|(c, _)| *c)
            .collect();
        let mut first_side = BTreeSet::new();
        let mut todo = vec![first];
        while let Some(c) = todo.pop() {
            if group.contains(&c) && first_side.insert(c) {
                todo.extend(self.parents_of(c)?);
            }
        }
        let from_first = self.differs_from(Some(first), id)?;
        let from_second = self.differs_from(Some(second), id)?;
        for (git_path, by) in ours {
            let side = if brought.contains(&by) {
                &from_second
            } else if first_side.contains(&by) {
                &from_first
            } else {
                continue;
            };
            conflict_at(side, git_path, id, conflicts);
        }
        Ok(())
    }

    /// What the merge `id` changed itself: the files whose content
    /// differs from both its parents (changes compared with its first
    /// parent).
    fn merge_own_changes(&self, id: Oid) -> Result<Vec<crate::vault::FileChange>, VaultError> {
        let parents = self.parents_of(id)?;
        let mine = self.changed_between(parents.first().copied(), Some(id), None)?;
        let Some(&theirs) = parents.get(1) else {
            return Ok(mine);
        };
        let from_theirs: BTreeSet<String> = self
            .changed_between(Some(theirs), Some(id), None)?
            .into_iter()
            .map(|c| c.git_path)
            .collect();
        Ok(mine
            .into_iter()
            .filter(|c| from_theirs.contains(&c.git_path))
            .collect())
    }

    fn undo_locked(
        &mut self,
        tip: Option<Oid>,
        target: &UndoTarget,
        force: bool,
    ) -> Result<UndoOutcome, VaultError> {
        let Some(tip) = tip else {
            return Ok(UndoOutcome::Nothing {
                skipped_erased: Vec::new(),
                skipped_blocked: Vec::new(),
                kept_in_place: Vec::new(),
            });
        };
        let mut targets: BTreeMap<String, Target> = BTreeMap::new();
        let mut conflicts = Vec::new();
        let mut undoes = Vec::new();
        // Changes by others to a path the undone commits touched, with
        // the step they came at; what the undone commits left at each path
        // and the step of their last touch. A later change is no conflict
        // when the file now holds the very version the undone commits left
        // (a revert put it back): undoing then overwrites nothing.
        let mut later: Vec<(String, Conflict, usize)> = Vec::new();
        // The newest change by others (not undone) at each git path.
        let mut changed_later: BTreeMap<String, Conflict> = BTreeMap::new();
        // And the chain index of that change (a smaller one is later).
        let mut changed_at: BTreeMap<String, usize> = BTreeMap::new();
        // Created files renamed (by others) onto a path a target held.
        let mut blocked_creates: Vec<(String, MemoryPath)> = Vec::new();
        let mut left: BTreeMap<String, (Option<Oid>, usize)> = BTreeMap::new();
        // The moves the undone commits made (renames, and reverts that
        // moved a file back): the commit, where from, and where the moved
        // file or folder is now (followed through later renames by
        // others).
        let mut undone_moves: Vec<(Oid, MemoryPath, MemoryPath)> = Vec::new();
        // Paths where an undone commit made a file that others since
        // moved or deleted, after which others made a new file there:
        // that file is not the undone commit's to remove.
        let mut superseded: BTreeSet<String> = BTreeSet::new();
        match target {
            UndoTarget::Commit(_) | UndoTarget::Session(_) => {
                // The commits to undo, and main back to the oldest of them
                // (newest first), what each merge brought in included.
                let (chain, set) = self.undo_chain(tip, target)?;
                // Oldest first: the first touch by the undone set fixes the
                // state to return to; later touches by others conflict.
                for (index, &(id, step)) in chain.iter().enumerate().rev() {
                    if step == Step::Merge {
                        self.merge_conflicts(id, index, &targets, &mut conflicts)?;
                        continue;
                    }
                    if let Step::Nested(m) = step {
                        self.nested_merge_conflicts(id, m, &chain, &targets, &mut conflicts)?;
                    }
                    let changes = if matches!(step, Step::Nested(_)) {
                        self.merge_own_changes(id)?
                    } else {
                        self.commit_changes(id)?
                    };
                    let renamed = self.rename_of(id)?;
                    // Where each undone move's file is now, through this
                    // commit's rename (by others, or by the undone set).
                    if let Some((from, to)) = &renamed {
                        for (_, _, now) in &mut undone_moves {
                            if let Some(n) = now.rebase(from, to) {
                                *now = n;
                            }
                        }
                    }
                    if set.contains(&id) {
                        undoes.push(id.to_string());
                        if let Some((from, to)) = self.move_of(id)? {
                            undone_moves.push((id, from, to));
                        }
                        let via = match step {
                            Step::Brought(m) | Step::Nested(m) => Some(m),
                            _ => None,
                        };
                        // An undone rename carries along what others wrote
                        // at its source before it: their content is in the
                        // file it moved, which the undo changes.
                        if let Some((from, to)) = &renamed {
                            let carried: Vec<(String, Conflict, usize)> = later
                                .iter()
                                .filter_map(|(_, c, i)| {
                                    let moved = c.path.rebase(from, to)?;
                                    let g = self.git_path_of(&moved).ok()?;
                                    Some((
                                        g,
                                        Conflict {
                                            rev: c.rev,
                                            path: moved,
                                        },
                                        *i,
                                    ))
                                })
                                .collect();
                            later.extend(carried);
                        }
                        for c in changes {
                            left.insert(c.git_path.clone(), (c.new, index));
                            // A file others made where the undone file was
                            // (see `superseded`), changed now by the undone
                            // set: the undo returns that file to what it
                            // held before this change, and what others did
                            // there before is not in its way.
                            if superseded.remove(&c.git_path)
                                && let Some(t) = targets.get_mut(&c.git_path)
                            {
                                t.desired = c.old;
                                t.by = Some(id);
                                t.via = via;
                                later.retain(|(g, _, _)| *g != c.git_path);
                                continue;
                            }
                            targets.entry(c.git_path).or_insert(Target {
                                path: c.path,
                                desired: c.old,
                                via,
                                by: Some(id),
                                sealed_at: None,
                            });
                        }
                    } else {
                        let op = self.meta_of(id)?.op;
                        // A file a rename by others brings to a path: ours
                        // (the file an undone change made, moved on) when
                        // it comes from a path where one is to be removed.
                        let ours = |c: &crate::vault::FileChange| {
                            renamed.as_ref().is_some_and(|(from, to)| {
                                c.path.rebase(to, from).is_some_and(|src| {
                                    self.git_path_of(&src).is_ok_and(|g| {
                                        targets.get(&g).is_some_and(|t| t.desired.is_none())
                                    })
                                })
                            })
                        };
                        for c in changes {
                            // A purge that kept a file sealed the same text
                            // under a new key: not a change of its content.
                            if op == "purge" && c.old.is_some() && c.new.is_some() {
                                continue;
                            }
                            if c.old.is_none()
                                && c.new.is_some()
                                && targets
                                    .get(&c.git_path)
                                    .is_some_and(|t| t.desired.is_none() && t.by.is_some())
                            {
                                if ours(&c) || matches!(op.as_str(), "revert" | "restore") {
                                    superseded.remove(&c.git_path);
                                } else {
                                    superseded.insert(c.git_path.clone());
                                }
                            }
                            let conflict = Conflict {
                                rev: Rev::from_oid(id),
                                path: c.path,
                            };
                            if targets.contains_key(&c.git_path) {
                                later.push((c.git_path.clone(), conflict.clone(), index));
                            }
                            changed_at.insert(c.git_path.clone(), index);
                            changed_later.insert(c.git_path, conflict);
                        }
                        // A file an undone change made, renamed since by
                        // another: it is undone where it is now (the
                        // rename conflicts, as any later change). (A file
                        // an undone change edited is found where it is now
                        // by its key, below.)
                        if let Some((from, to)) = &renamed {
                            let moved: Vec<(String, MemoryPath)> = targets
                                .values()
                                .filter(|t| t.desired.is_none())
                                .filter_map(|t| {
                                    let q = t.path.rebase(from, to)?;
                                    Some((self.git_path_of(&q).ok()?, q))
                                })
                                .collect();
                            for (g, q) in moved {
                                later.push((
                                    g.clone(),
                                    Conflict {
                                        rev: Rev::from_oid(id),
                                        path: q.clone(),
                                    },
                                    index,
                                ));
                                if targets.contains_key(&g) {
                                    // Held by a file an undone change
                                    // edited, which may have moved on
                                    // (found by its key below): tried again
                                    // then.
                                    blocked_creates.push((g, q));
                                    continue;
                                }
                                targets.insert(
                                    g,
                                    Target {
                                        path: q,
                                        desired: None,
                                        via: None,
                                        by: None,
                                        sealed_at: None,
                                    },
                                );
                            }
                        }
                    }
                }
                // A file an undone change edited (or deleted), moved since
                // by others (a rename, a folder's rename, a merge that
                // brought one; not one a revert moved back): the file
                // holding its key now, elsewhere, is where the version goes
                // back, sealed again under its path; nothing comes back at
                // the old path. Each such move is a later change there.
                // The paths where the undone changes' last touch is newer
                // than any change by others: what stands there, they put.
                let theirs_last: BTreeSet<String> = left
                    .iter()
                    .filter(|(g, (_, last))| changed_at.get(*g).is_none_or(|i| i > last))
                    .map(|(g, _)| g.clone())
                    .collect();
                let followed =
                    self.follow_moved(tip, &mut targets, &changed_later, &theirs_last)?;
                for (g, conflict) in followed {
                    later.push((g, conflict, 0));
                }
                // A created file renamed onto the path of an edited one
                // that has moved on since: removed where it is now.
                for (g, q) in blocked_creates {
                    targets.entry(g).or_insert(Target {
                        path: q,
                        desired: None,
                        via: None,
                        by: None,
                        sealed_at: None,
                    });
                }
                for g in &superseded {
                    if targets
                        .get(g)
                        .is_some_and(|t| t.desired.is_none() && t.sealed_at.is_none())
                    {
                        targets.remove(g);
                    }
                }
                undoes.reverse();
                // The chain is newest first: a smaller index is later.
                let tip_tree = self.git_tree_of(Some(tip))?;
                let snap = self.snapshot_of(Some(tip))?;
                // The text of a stored version, if its key is still held.
                let text = |oid: Oid, path: &MemoryPath| snap.open_version(oid, path);
                for (git_path, conflict, index) in later {
                    let settled = left.get(&git_path).is_some_and(|&(leaves, last)| {
                        let now = self.entry_at(tip_tree.as_ref(), &git_path)
                            .filter(|(_, k)| *k == ObjectType::Blob)
                            .map(|(id, _)| id);
                        // The same version, or the same text sealed anew
                        // (a file rewritten with what it held).
                        index < last
                            && (now == leaves
                                || matches!((now, leaves), (Some(n), Some(l))
                                    if text(n, &conflict.path).is_some_and(|t| Some(t) == text(l, &conflict.path))))
                    });
                    if !settled {
                        conflicts.push((git_path, conflict));
                    }
                }
            }
            UndoTarget::Restore { path, at } => {
                for c in self.changed_between(Some(tip), Some(at.oid()), Some(path))? {
                    targets.insert(
                        c.git_path,
                        Target {
                            path: c.path,
                            desired: c.new,
                            via: None,
                            by: None,
                            sealed_at: None,
                        },
                    );
                }
                // Content written after `at` that the restore would discard.
                let at_risk: BTreeSet<String> = {
                    let tip_tree = self.git_tree_of(Some(tip))?;
                    targets
                        .keys()
                        .filter(|g| self.entry_at(tip_tree.as_ref(), g).is_some())
                        .cloned()
                        .collect()
                };
                if !at_risk.is_empty() {
                    let chain = self.chain_to(tip, at.oid())?;
                    for &id in chain.iter().rev().skip(1) {
                        for c in self.commit_changes(id)? {
                            if at_risk.contains(&c.git_path) {
                                conflicts.push((
                                    c.git_path,
                                    Conflict {
                                        rev: Rev::from_oid(id),
                                        path: c.path,
                                    },
                                ));
                            }
                        }
                    }
                }
            }
        }

        // Keep only what would really change.
        let tip_tree = self.git_tree_of(Some(tip))?;
        // The trees on each path are read below, and by the tree update.
        if let Some(t) = &tip_tree {
            for git_path in targets.keys() {
                crate::vault::objects::check_path(&self.repo, t.id(), git_path)?;
            }
        }
        // The targets whose file holds the text to put back already
        // (sealed anew since: edited away and back, restored before):
        // nothing to change there.
        let same_text: BTreeSet<&str> = {
            let snap = self.snapshot_of(Some(tip))?;
            let text_of = |oid: Oid, path: &MemoryPath| snap.open_version(oid, path);
            targets
                .iter()
                .filter(|(g, t)| {
                    let Some(blob) = t.desired else {
                        return false;
                    };
                    let Some((now, ObjectType::Blob)) = self.entry_at(tip_tree.as_ref(), g) else {
                        return false;
                    };
                    now != blob
                        && text_of(blob, t.sealed_at.as_ref().unwrap_or(&t.path)).is_some_and(
                            |want| text_of(now, &t.path).is_some_and(|have| have == want),
                        )
                })
                .map(|(g, _)| g.as_str())
                .collect()
        };
        // Files the undo would remove that must stay (see the end of the
        // loop).
        let mut unremovable: BTreeSet<MemoryPath> = BTreeSet::new();
        let (
            mut edits,
            sealed_at,
            mut put_back,
            skipped_erased,
            blocked,
            kept_in_place,
            clearing,
            not_back,
        ) = loop {
            let mut edits = Vec::new();
            // The versions a later rename moved, by the git path they go back
            // to: the path they are sealed under, and their key.
            let mut sealed_at = BTreeMap::new();
            // The versions put back: their edit and key (for expiry, below).
            let mut put_back = Vec::new();
            let mut skipped_erased = Vec::new();
            let mut blocked = Vec::new();
            // The file keys of the versions that cannot be put back.
            let mut blocked_keys = BTreeSet::new();
            let mut kept_in_place = Vec::new();
            // The files a revert removes because an undone commit made them:
            // a file or folder of them standing where a version goes back is
            // cleared first (`clearing`, by path), not an obstacle. Anything
            // else standing there (written by others since, or, for a
            // restore, written after the revision) stays as it is, files and
            // all, and the version is skipped.
            let removing: BTreeSet<&MemoryPath> = targets
                .iter()
                .filter(|(g, t)| {
                    t.desired.is_none()
                        && t.by.is_some()
                        && !unremovable.contains(&t.path)
                        && self
                            .entry_at(tip_tree.as_ref(), g)
                            .is_some_and(|(_, k)| k == ObjectType::Blob)
                })
                .map(|(_, t)| &t.path)
                .collect();
            let mut clearing: BTreeSet<MemoryPath> = BTreeSet::new();
            // Files standing where a folder's files would go back, that stay.
            let mut blocking_files: BTreeSet<MemoryPath> = BTreeSet::new();
            // Versions an undone change replaced that cannot go back (erased,
            // or blocked), with that change.
            let mut not_back: Vec<(MemoryPath, Oid)> = Vec::new();
            for (git_path, t) in &targets {
                let current = self.entry_at(tip_tree.as_ref(), git_path);
                if current.map(|(id, _)| id) == t.desired
                    && current.is_none_or(|(_, k)| k == ObjectType::Blob)
                {
                    continue;
                }
                if same_text.contains(git_path.as_str()) {
                    continue;
                }
                if let Some(blob) = t.desired {
                    // Another file (another key) that others made where a
                    // revert would put this version back (an undone
                    // rename's source, taken since) is in the way as a
                    // folder is, `--force` or not: overwriting it would
                    // lose it at the tip.
                    let other_file =
                        matches!(target, UndoTarget::Commit(_) | UndoTarget::Session(_))
                            && changed_later.contains_key(git_path)
                            && match current {
                                Some((now, ObjectType::Blob)) => {
                                    self.key_id_of(now)? != self.key_id_of(blob)?
                                }
                                _ => false,
                            };
                    let obstacle =
                        if current.is_some_and(|(_, k)| k != ObjectType::Blob) || other_file {
                            Some(t.path.clone())
                        } else {
                            self.file_ancestor(tip_tree.as_ref(), &t.path)?
                        };
                    if let Some(o) = obstacle {
                        let cleared = if other_file {
                            removing.contains(&o)
                        } else if o == t.path {
                            // A folder: cleared when the undo removes every
                            // file in it.
                            self.snapshot_of(Some(tip))?
                                .files_below(&o)?
                                .iter()
                                .all(|f| removing.contains(f))
                        } else {
                            removing.contains(&o)
                        };
                        if !cleared {
                            if o != t.path {
                                blocking_files.insert(o);
                            }
                            blocked.push(t.path.clone());
                            blocked_keys.insert(self.key_id_of(blob)?);
                            not_back.extend(t.by.map(|by| (t.path.clone(), by)));
                            continue;
                        }
                        clearing.insert(o);
                    }
                }
                if let Some(blob) = t.desired {
                    self.check_object(blob)?;
                    let bytes = self
                        .repo
                        .find_blob(blob)
                        .map_err(|_| damaged("a stored file is unreadable"))?;
                    let id = crypto::blob_key_id(bytes.content())
                        .map_err(|_| damaged("a stored file has a bad header"))?;
                    let Some(key) = self.key_state.file_key(&self.repo, &self.keys, &id)? else {
                        skipped_erased.push(t.path.clone());
                        not_back.extend(t.by.map(|by| (t.path.clone(), by)));
                        continue;
                    };
                    put_back.push((edits.len(), id));
                    if let Some(at) = &t.sealed_at {
                        sealed_at.insert(git_path.clone(), (at.clone(), key));
                    }
                }
                edits.push((git_path.clone(), t.path.clone(), t.desired));
            }
            // A file the undone changes moved away from a path now taken (a
            // rename to undo, whose source a file or folder now stands in) stays
            // where it is: removing it there would lose it, as nothing can be
            // put back at the source. Found by its file key, which a rename
            // keeps; and, for a version that cannot go back (its key erased:
            // a purge of the old path kept the renamed file under a new key),
            // where the undone rename put it.
            let mut keep: BTreeSet<MemoryPath> = BTreeSet::new();
            for (path, _) in &not_back {
                // Where an undone move put the file from there (whichever
                // undone change set its target: an edit before the move,
                // say), followed through later renames.
                if let Some(q) = undone_moves
                    .iter()
                    .find_map(|(_, from, now)| path.rebase(from, now))
                {
                    keep.insert(q);
                }
            }
            if !blocked_keys.is_empty() || !keep.is_empty() {
                let mut kept = Vec::with_capacity(edits.len());
                let mut moved_to = vec![usize::MAX; edits.len()];
                for (i, edit) in edits.into_iter().enumerate() {
                    let current = self
                        .entry_at(tip_tree.as_ref(), &edit.0)
                        .filter(|(_, k)| *k == ObjectType::Blob);
                    if edit.2.is_none()
                        && let Some((blob, _)) = current
                        && (keep.contains(&edit.1) || blocked_keys.contains(&self.key_id_of(blob)?))
                    {
                        kept_in_place.push(edit.1);
                        continue;
                    }
                    moved_to[i] = kept.len();
                    kept.push(edit);
                }
                edits = kept;
                for (i, _) in &mut put_back {
                    *i = moved_to[*i];
                }
            }
            // A file that cannot go back because a folder stands where it
            // would go leaves that folder as it is: removing the files below
            // it (which the undo would otherwise do) would change the vault
            // and still not put the file back. So does a file standing where
            // a folder's files would go back (a restore of the folder over a
            // file written since, say).
            if !blocked.is_empty() {
                let stays = |path: &MemoryPath| {
                    blocking_files.contains(path)
                        || blocked.iter().any(|b| path.starts_with(b) && path != b)
                };
                // A file an undone move brought into what stays is kept
                // there, not put back as a copy where it came from.
                let not_copied: BTreeSet<MemoryPath> = edits
                    .iter()
                    .filter(|(_, p, d)| d.is_none() && stays(p))
                    .filter_map(|(_, p, _)| {
                        undone_moves
                            .iter()
                            .find_map(|(_, from, now)| p.rebase(now, from))
                            .map(|src| (src, p.clone()))
                    })
                    .filter(|(src, _)| edits.iter().any(|(_, p, d)| d.is_some() && p == src))
                    .map(|(src, p)| {
                        kept_in_place.push(p);
                        src
                    })
                    .collect();
                let mut kept = Vec::with_capacity(edits.len());
                let mut moved_to = vec![usize::MAX; edits.len()];
                for (i, edit) in edits.into_iter().enumerate() {
                    let (_, path, desired) = &edit;
                    if desired.is_none() && stays(path) {
                        continue;
                    }
                    if desired.is_some() && not_copied.contains(path) {
                        continue;
                    }
                    moved_to[i] = kept.len();
                    kept.push(edit);
                }
                edits = kept;
                for (i, _) in &mut put_back {
                    *i = moved_to[*i];
                }
                put_back.retain(|(i, _)| *i != usize::MAX);
            }
            // A file cleared away must be one the undo removes in the end: a
            // file kept in place (above) inside a folder to clear, or as the
            // file to clear, leaves it standing, so the versions that needed it
            // cleared are decided again with that file kept.
            let removed: BTreeSet<&MemoryPath> = edits
                .iter()
                .filter(|(_, _, d)| d.is_none())
                .map(|(_, p, _)| p)
                .collect();
            let kept: Vec<MemoryPath> = removing
                .iter()
                .filter(|p| clearing.iter().any(|o| p.starts_with(o)) && !removed.contains(*p))
                .map(|p| (*p).clone())
                .collect();
            if kept.is_empty() {
                break (
                    edits,
                    sealed_at,
                    put_back,
                    skipped_erased,
                    blocked,
                    kept_in_place,
                    clearing,
                    not_back,
                );
            }
            unremovable.extend(kept);
        };
        let changing: BTreeSet<&str> = edits.iter().map(|(g, _, _)| g.as_str()).collect();
        let mut conflicts: Vec<Conflict> = conflicts
            .into_iter()
            .filter(|(g, _)| changing.contains(g.as_str()))
            .map(|(_, c)| c)
            .collect();
        conflicts.dedup();
        if (!conflicts.is_empty() || !blocked.is_empty()) && !force {
            return Ok(UndoOutcome::Refused {
                conflicts,
                blocked,
                kept_in_place,
            });
        }
        if edits.is_empty() {
            return Ok(UndoOutcome::Nothing {
                skipped_erased,
                skipped_blocked: blocked,
                kept_in_place,
            });
        }

        // Stay within the file limit: the files the undo puts back, less
        // those it removes.
        let added = edits
            .iter()
            .filter(|(g, _, d)| d.is_some() && self.entry_at(tip_tree.as_ref(), g).is_none())
            .count();
        let removed = edits
            .iter()
            .filter(|(g, _, d)| {
                d.is_none()
                    && self
                        .entry_at(tip_tree.as_ref(), g)
                        .is_some_and(|(_, k)| k == ObjectType::Blob)
            })
            .count();
        if added > removed {
            let count = self
                .snapshot_of(Some(tip))?
                .count_files()
                .map_err(|_| damaged("a tree is unreadable"))?;
            let after = (count + added).saturating_sub(removed);
            if after > self.config.max_files {
                return Err(VaultError::Refused(format!(
                    "the undo would bring the vault to {after} files, over its limit of {}",
                    self.config.max_files
                )));
            }
        }

        // What history says of the undo: the lines it adds and removes, as
        // `diff` shows them (a file changed in place: the lines between
        // the common first and last ones; a file removed or put back
        // whole: all its lines; a file moved, removed at one path and put
        // back at another with the same text: none), and, when it puts
        // back one file, that file's size.
        let (mut lines_added, mut lines_removed, mut size) = (0u32, 0u32, None);
        {
            let snap = self.snapshot_of(Some(tip))?;
            let mut gone: Vec<Zeroizing<Vec<u8>>> = Vec::new();
            let mut came: Vec<Zeroizing<Vec<u8>>> = Vec::new();
            for (git_path, path, desired) in &edits {
                let current = self
                    .entry_at(tip_tree.as_ref(), git_path)
                    .is_some_and(|(_, k)| k == ObjectType::Blob);
                let old = if current {
                    crate::memory::Snapshot::read(&snap, path).ok()
                } else {
                    None
                };
                // Sealed under its own path, or where a later rename
                // moved it from (before any sealing anew below).
                let at = sealed_at.get(git_path).map_or(path, |(at, _)| at);
                let new = desired.and_then(|blob| snap.open_version(blob, at));
                if let (Some(t), 1) = (&new, edits.len()) {
                    size = Some(t.len() as u64);
                }
                match (old, new) {
                    (Some(o), Some(n)) => {
                        let (added, removed) = lines_changed(&o, &n);
                        lines_added = lines_added.saturating_add(added);
                        lines_removed = lines_removed.saturating_add(removed);
                    }
                    (Some(o), None) => gone.push(o),
                    (None, Some(n)) => came.push(n),
                    (None, None) => {}
                }
            }
            for n in came {
                match gone.iter().position(|o| **o == *n) {
                    Some(i) => {
                        gone.swap_remove(i);
                    }
                    None => lines_added = lines_added.saturating_add(lines_changed(&[], &n).0),
                }
            }
            for o in gone {
                lines_removed = lines_removed.saturating_add(lines_changed(&o, &[]).1);
            }
        }

        // A version put back under a file key that a file the undo leaves
        // in place also holds (the file was renamed since, or copied back
        // before) is sealed again under a new key: two files sharing a key
        // would share expiry and erasure (viewing one would keep the other,
        // purging one would re-key the other).
        // A version a later rename moved is sealed again under the path
        // it goes back to (the path is in its AAD), with the same key, as
        // the rename itself did.
        let mut objects = Vec::new();
        for (git_path, path, desired) in &mut edits {
            let (Some((at, key)), Some(blob)) = (sealed_at.get(git_path.as_str()), *desired) else {
                continue;
            };
            // The id as checked where the key was found (above).
            let id = self.key_id_of(blob)?;
            let bytes = self
                .repo
                .find_blob(blob)
                .map_err(|_| damaged("a stored file is unreadable"))?;
            let content = crypto::open_blob(key, at.as_str(), bytes.content())
                .map_err(|_| damaged("a stored file failed to decrypt"))?;
            let sealed = crypto::seal_blob(key, &id, path.as_str(), &content);
            *desired = Some(crate::vault::publish::stage_blob(
                &self.repo,
                sealed,
                &mut objects,
            )?);
        }
        let mut new_keys = Vec::new();
        if !put_back.is_empty() {
            let changing: BTreeSet<&MemoryPath> = edits.iter().map(|(_, p, _)| p).collect();
            let snap = self.snapshot_of(Some(tip))?;
            let mut held: BTreeSet<crypto::FileKeyId> = snap
                .files_with_keys()?
                .into_iter()
                .filter(|(p, _, _)| !changing.contains(p))
                .map(|(_, _, k)| k)
                .collect();
            for (i, id) in put_back.iter_mut() {
                // Each key once: a second version put back under the same
                // key is sealed again as well.
                if held.insert(*id) {
                    continue;
                }
                let (_, path, desired) = &mut edits[*i];
                let Some(blob) = *desired else { continue };
                let bytes = self
                    .repo
                    .find_blob(blob)
                    .map_err(|_| damaged("a stored file is unreadable"))?;
                let key = snap.file_key(id)?;
                let content = crypto::open_blob(key, path.as_str(), bytes.content())
                    .map_err(|_| damaged("a stored file failed to decrypt"))?;
                let new_id = crypto::FileKeyId::generate();
                let new_key = crypto::FileKey::generate();
                let sealed = crypto::seal_blob(&new_key, &new_id, path.as_str(), &content);
                *desired = Some(crate::vault::publish::stage_blob(
                    &self.repo,
                    sealed,
                    &mut objects,
                )?);
                // The key recorded as written now: the version's new one,
                // not that of the file it was sealed apart from.
                *id = new_id;
                held.insert(new_id);
                new_keys.push((new_id, Some(new_key)));
            }
        }

        // The blobs put back are old ones, already durable (or sealed
        // again just now, in `objects`). A file or folder standing where
        // a version goes back is removed first, as its own tree update:
        // one update cannot remove a name and write below it.
        let mut base = self.tree_of(Some(tip))?;
        if !clearing.is_empty() {
            let mut clear = TreeEdits::memory();
            for o in &clearing {
                clear.remove(&self.git_path_of(o)?);
            }
            base = Some(clear.write(&self.repo, &self.caches, base, &mut objects)?);
        }
        let mut update = TreeEdits::memory();
        for (git_path, path, desired) in &edits {
            match desired {
                Some(blob) => update.upsert(git_path.as_str(), *blob),
                // Removed with what it stood in.
                None if clearing.iter().any(|o| path.starts_with(o)) => {}
                None => update.remove(git_path.as_str()),
            };
        }
        drop(tip_tree);
        let tree = update.write(&self.repo, &self.caches, base, &mut objects)?;
        let op = match target {
            UndoTarget::Restore { .. } => "restore",
            _ => "revert",
        };
        // An undone commit whose every change was skipped (erased, or
        // blocked) is not among those the undo undid.
        let undid: BTreeSet<Oid> = edits
            .iter()
            .filter_map(|(g, _, _)| targets.get(g)?.by)
            .collect();
        let skipped: BTreeSet<Oid> = not_back.iter().map(|(_, by)| *by).collect();
        let undoes: Vec<String> = undoes
            .into_iter()
            .filter(|u| {
                Oid::from_str(u).map_or(true, |id| !skipped.contains(&id) || undid.contains(&id))
            })
            .collect();
        // The one move undone, when the undo moved that file or folder
        // back: put back at its source and removed where it is now.
        let recorded_move = match undone_moves.as_slice() {
            [(id, from, now)]
                if undoes.contains(&id.to_string())
                    && edits
                        .iter()
                        .any(|(_, p, d)| d.is_some() && p.starts_with(from))
                    && edits
                        .iter()
                        .any(|(_, p, d)| d.is_none() && p.starts_with(now)) =>
            {
                Some((*id, from.clone(), now.clone()))
            }
            _ => None,
        };
        let mut meta = CommitMeta {
            files: edits
                .iter()
                .map(|(_, p, _)| p.as_str().to_string())
                .collect(),
            undoes,
            lines_added,
            lines_removed,
            size,
            ..self.new_meta(op)
        };
        match target {
            UndoTarget::Commit(c) => {
                let undone = self.meta_of(c.oid())?;
                meta.path = undone.path;
                meta.new_path = undone.new_path;
                // The move back it made, as a revert records one: to
                // `path`, from `new_path` (where the moved file is now).
                if let Some((_, from, now)) = recorded_move {
                    meta.path = Some(from.as_str().to_string());
                    meta.new_path = Some(now.as_str().to_string());
                } else if meta.new_path.is_some() {
                    meta.new_path = None;
                }
                // One file changed, followed elsewhere since: named where
                // the undo changed it (history of that path lists it).
                if meta.new_path.is_none()
                    && let [only] = meta.files.as_slice()
                {
                    meta.path = Some(only.clone());
                }
            }
            UndoTarget::Session(s) => {
                meta.undone_session = Some(s.clone());
                // A session whose one move is undone: recorded as the
                // revert of that move is, a move back, so `history`
                // follows the file across it.
                if let Some((_, from, now)) = recorded_move {
                    meta.path = Some(from.as_str().to_string());
                    meta.new_path = Some(now.as_str().to_string());
                }
            }
            UndoTarget::Restore { path, at } => {
                meta.path = Some(path.as_str().to_string());
                meta.at = Some(at.to_string());
            }
        }
        // For expiry, a file put back is written now: its key's record of
        // use would otherwise say when the old version was written, and
        // the next sweep would erase what was just brought back.
        let changed = edits.into_iter().map(|(_, p, _)| p).collect();
        let time = meta.time_ms;
        let commit = self.publish(Some(tip), tree, KeyChange::files(new_keys), &meta, objects)?;
        let written: Vec<_> = put_back
            .into_iter()
            .map(|(_, id)| (id, crate::vault::access::Kind::Written, time))
            .collect();
        self.append_access(&written);
        Ok(UndoOutcome::Done {
            commit: Rev::from_oid(commit),
            changed,
            skipped_erased,
            skipped_blocked: blocked,
            kept_in_place,
        })
    }
}

impl Vault {
    /// For an undo: each target that puts back a version an undone change
    /// replaced, whose file (found by its key, which renames keep) is now
    /// at another path and no longer at its own: moved there (see
    /// `Target::sealed_at`). Returns the later change that put it there,
    /// by its new git path.
    fn follow_moved(
        &self,
        tip: Oid,
        targets: &mut BTreeMap<String, Target>,
        changed_later: &BTreeMap<String, Conflict>,
        undone_last: &BTreeSet<String>,
    ) -> Result<Vec<(String, Conflict)>, VaultError> {
        let candidates: Vec<(String, MemoryPath, crypto::FileKeyId)> = targets
            .iter()
            .filter(|(_, t)| t.by.is_some() && t.sealed_at.is_none())
            .filter_map(|(g, t)| {
                Some((g.clone(), t.path.clone(), self.key_id_of(t.desired?).ok()?))
            })
            .collect();
        if candidates.is_empty() {
            return Ok(Vec::new());
        }
        let snap = self.snapshot_of(Some(tip))?;
        let mut at_tip: BTreeMap<crypto::FileKeyId, Vec<MemoryPath>> = BTreeMap::new();
        for (path, _, key) in snap.files_with_keys()? {
            at_tip.entry(key).or_default().push(path);
        }
        // Where each would go; applied together, so that files that traded
        // places (a swap) each go where the other was.
        let mut moves: Vec<(String, MemoryPath, String)> = Vec::new();
        // The files the undone changes moved where they are now, not
        // followed: by their path, with the undone change that put them
        // there.
        let mut own: Vec<(String, MemoryPath, Option<Oid>)> = Vec::new();
        for (g, path, key) in candidates {
            let Some(holders) = at_tip.get(&key) else {
                continue;
            };
            // Still (or again) at its own path: nothing to follow.
            if holders.contains(&path) {
                continue;
            }
            let [q] = holders.as_slice() else {
                continue;
            };
            let gq = self.git_path_of(q)?;
            // Moved there by the undone changes themselves (their last
            // touch of that path is newer than any change by others
            // there): the undo already puts the file back from there.
            // Following it would undo the move twice (a session that
            // swapped two files was left swapped) or put a file's version
            // over another target (a session that moved one file away and
            // another into its place lost the first).
            if undone_last.contains(&gq)
                && let Some(there) = targets.get(&gq).filter(|t| t.by.is_some())
            {
                own.push((gq, q.clone(), there.by));
                continue;
            }
            moves.push((g, q.clone(), gq));
        }
        // A path another target keeps (not one moving away), or one two
        // would take: not followed. Until nothing changes: a move not
        // followed keeps its own target where it is, which may then be in
        // another's way.
        loop {
            let leaving: BTreeSet<String> = moves.iter().map(|(g, _, _)| g.clone()).collect();
            let mut arriving = BTreeSet::new();
            let before = moves.len();
            moves.retain(|(_, q, gq)| {
                let kept_there = !leaving.contains(gq)
                    && (targets.contains_key(gq) || targets.values().any(|t| t.path == *q));
                !kept_there && arriving.insert(gq.clone())
            });
            if moves.len() == before {
                break;
            }
        }
        let mut moved = Vec::new();
        for (g, q, gq) in moves {
            if let Some(t) = targets.remove(&g) {
                moved.push((t, q, gq));
            }
        }
        let mut followed = Vec::new();
        for (t, q, gq) in moved {
            let conflict = changed_later.get(&gq).cloned().unwrap_or(Conflict {
                rev: Rev::from_oid(tip),
                path: q.clone(),
            });
            followed.push((gq.clone(), conflict));
            targets.insert(
                gq,
                Target {
                    sealed_at: Some(t.path.clone()),
                    path: q,
                    ..t
                },
            );
        }
        // A file the undone changes moved, standing at a path whose own
        // target was followed away (its file moved on by others since): it
        // is still theirs to remove there, or it would stay as a copy of
        // the version put back at its source.
        for (gq, q, by) in own {
            targets.entry(gq).or_insert(Target {
                path: q,
                desired: None,
                via: None,
                by,
                sealed_at: None,
            });
        }
        Ok(followed)
    }
}

/// The lines `new` adds and `old` loses, as a diff of one change shows
/// them: the lines between the first and last lines the two share.
fn lines_changed(old: &[u8], new: &[u8]) -> (u32, u32) {
    // Lines as slices of the texts: no copy of the plaintext is made.
    fn split(b: &[u8]) -> Vec<&[u8]> {
        if b.is_empty() {
            return Vec::new();
        }
        let b = b.strip_suffix(b"\n").unwrap_or(b);
        b.split(|&c| c == b'\n').collect()
    }
    let (o, n) = (split(old), split(new));
    let head = o.iter().zip(&n).take_while(|(a, b)| a == b).count();
    let tail = o[head..]
        .iter()
        .rev()
        .zip(n[head..].iter().rev())
        .take_while(|(a, b)| a == b)
        .count();
    let count = |x: usize| u32::try_from(x).unwrap_or(u32::MAX);
    (count(n.len() - head - tail), count(o.len() - head - tail))
}

/// The object at a git path in a tree, with its kind.
impl Vault {
    /// The file key a stored version is sealed under (checked first).
    fn key_id_of(&self, blob: Oid) -> Result<crypto::FileKeyId, VaultError> {
        self.check_object(blob)?;
        let bytes = self
            .repo
            .find_blob(blob)
            .map_err(|_| damaged("a stored file is unreadable"))?;
        crypto::blob_key_id(bytes.content()).map_err(|_| damaged("a stored file has a bad header"))
    }

    /// Where a commit moved a file or folder from and to: a rename, or a
    /// revert that moved one back (it records the paths as the revert of
    /// a rename does: to `path`, from `new_path`).
    fn move_of(&self, id: Oid) -> Result<Option<(MemoryPath, MemoryPath)>, VaultError> {
        let meta = self.meta_of(id)?;
        let parse =
            |p: &Option<String>| p.as_deref().and_then(|p| MemoryPath::parse_stored(p).ok());
        Ok(match meta.op.as_str() {
            "rename" => parse(&meta.path).zip(parse(&meta.new_path)),
            "revert" => parse(&meta.new_path).zip(parse(&meta.path)),
            _ => None,
        })
    }

    /// Where a commit moved a file or folder from and to, if it is a
    /// rename.
    fn rename_of(&self, id: Oid) -> Result<Option<(MemoryPath, MemoryPath)>, VaultError> {
        let meta = self.meta_of(id)?;
        if meta.op != "rename" {
            return Ok(None);
        }
        let parse =
            |p: &Option<String>| p.as_deref().and_then(|p| MemoryPath::parse_stored(p).ok());
        Ok(parse(&meta.path).zip(parse(&meta.new_path)))
    }
}

impl Vault {
    /// What `git_path` names in `tree`: each of its entries where that
    /// tree holds it (at any depth of its buckets, see
    /// `Caches::seek_in_dir`), its bucket segments ignored.
    fn entry_at(&self, tree: Option<&git2::Tree<'_>>, git_path: &str) -> Option<(Oid, ObjectType)> {
        let mut at = (tree?.id(), ObjectType::Tree);
        for name in git_path.split('/').filter(|s| !is_bucket(s.as_bytes())) {
            if at.1 != ObjectType::Tree {
                return None;
            }
            match self
                .caches
                .seek_in_dir(&self.repo, at.0, name.as_bytes())
                .ok()?
            {
                Seek::Found(id, mode, _) if mode == MODE_TREE => at = (id, ObjectType::Tree),
                Seek::Found(id, _, _) => at = (id, ObjectType::Blob),
                Seek::Absent(_) => return None,
            }
        }
        Some(at)
    }

    /// The ancestor directory of `path` that is a file in `tree`, if one
    /// is.
    fn file_ancestor(
        &self,
        tree: Option<&git2::Tree<'_>>,
        path: &MemoryPath,
    ) -> Result<Option<MemoryPath>, VaultError> {
        for a in path.ancestors().filter(|a| !a.is_root()) {
            if self
                .entry_at(tree, &self.git_path_of(&a)?)
                .is_some_and(|(_, k)| k == ObjectType::Blob)
            {
                return Ok(Some(a));
            }
        }
        Ok(None)
    }
}

#[cfg(test)]
mod tests {
    use super::lines_changed;

    #[test]
    fn lines_changed_counts_what_a_diff_of_one_change_shows() {
        assert_eq!(lines_changed(b"a\nb\n", b"a\nb\nc\n"), (1, 0));
        assert_eq!(lines_changed(b"a\nb\nc\n", b"a\nb\n"), (0, 1));
        assert_eq!(lines_changed(b"one\n2\n3\n4\n", b"one\ntwo\n"), (1, 3));
        assert_eq!(lines_changed(b"x\n", b"x\n"), (0, 0));
        assert_eq!(lines_changed(b"", b"a\nb"), (2, 0));
        assert_eq!(lines_changed(b"a\nb\n", b""), (0, 2));
        assert_eq!(lines_changed(b"a\na\n", b"a\n"), (0, 1));
    }
}
