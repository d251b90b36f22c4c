//! `verify`: walk all of main and check everything a key holder can check.
//!
//! For every commit: the object reads, its MAC holds, its metadata opens
//! (bound to its tree and parent). For every file in every tree: the name
//! decrypts under its parent path, the blob reads, its key is in the key
//! table (or was erased on purpose, as recorded by an expiry or purge
//! commit), and it opens with that key at that path. The key state is
//! re-read and checked. Unchanged subtrees and blobs are checked once.
//!
//! Rollback: after a clean run the tip is recorded, with a MAC, in
//! `memvault/verified-head` (local, outside git). A later run reports when
//! that head is no longer the tip or one of its ancestors, meaning the
//! branch was moved back or rewritten. Deleting the file loses the mark;
//! the check is only as good as the file's survival.

use std::collections::{HashMap, HashSet};

use git2::{ObjectType, Oid};

use crate::crypto::{self, FileKeyId};
use crate::memory::MemoryPath;
use crate::vault::keys::{KeyState, verify_commit_mac};
use crate::vault::meta::meta_aad;
use crate::vault::objects;
use crate::vault::tree::{
    FANOUT_LEVELS, MODE_TREE, Seek, buckets as buckets_of, find_entry, is_bucket,
};
use crate::vault::{MAIN_REF, Vault, VaultError, write_durable};

const HWM_FILE: &str = "memvault/verified-head";

/// One thing wrong, located as precisely as the damage allows.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct Problem {
    /// The commit (full hex) where it was found, if any.
    pub rev: Option<String>,
    /// The memory path (or what is known of it), if any.
    pub path: Option<String>,
    pub what: String,
}

/// The result of [`Vault::verify`].
#[derive(Debug, Default, serde::Serialize)]
pub struct VerifyReport {
    pub head: Option<String>,
    pub commits: usize,
    pub files_checked: usize,
    /// File versions whose key was erased on purpose (not damage).
    pub erased_versions: usize,
    pub problems: Vec<Problem>,
    /// What is owed but not damage (an erasure's prune a crash cut short).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub notes: Vec<String>,
}

impl VerifyReport {
    pub fn ok(&self) -> bool {
        self.problems.is_empty()
    }
}

struct Walker<'v> {
    vault: &'v Vault,
    erased: HashSet<FileKeyId>,
    trees_seen: HashSet<(Oid, String)>,
    blobs_seen: HashSet<(Oid, String)>,
    names: HashMap<(String, String), Option<String>>,
    report: VerifyReport,
}

impl Walker<'_> {
    fn problem(&mut self, rev: Oid, path: Option<&str>, what: &str) {
        self.report.problems.push(Problem {
            rev: Some(rev.to_string()),
            path: path.map(str::to_string),
            what: what.to_string(),
        });
    }

    /// Check the directory tree `oid` at `dir`; `buckets`: the bucket
    /// digits on the way to it from its directory ("" for the directory's
    /// own tree, `dir_tree`).
    fn tree(&mut self, rev: Oid, oid: Oid, dir: &MemoryPath, dir_tree: Oid, buckets: &str) {
        if !self
            .trees_seen
            .insert((oid, format!("{}\0{buckets}", dir.as_str())))
        {
            return;
        }
        let tree = match objects::find_tree(&self.vault.repo, oid) {
            Ok(t) => t,
            Err(e) => {
                return self.problem(rev, Some(dir.as_str()), &format!("a tree is damaged: {e}"));
            }
        };
        let entries: Vec<(Option<String>, Option<ObjectType>, Oid)> = tree
            .iter()
            .map(|e| (e.name().ok().map(str::to_string), e.kind(), e.id()))
            .collect();
        drop(tree);
        for (enc, kind, id) in entries {
            if let Some(b) = enc.as_deref().filter(|e| is_bucket(e.as_bytes())) {
                if kind != Some(ObjectType::Tree) || buckets.len() >= FANOUT_LEVELS {
                    self.problem(
                        rev,
                        Some(dir.as_str()),
                        "a bucket of this directory is not a tree at its place",
                    );
                    continue;
                }
                self.tree(rev, id, dir, dir_tree, &format!("{buckets}{b}"));
                continue;
            }
            // An entry under buckets sits under the first of its own
            // (format 2's flat directories have none, format 3 used all
            // three): else a lookup would not find it.
            if !buckets.is_empty()
                && enc
                    .as_deref()
                    .is_none_or(|e| !buckets_of(e).starts_with(buckets.as_bytes()))
            {
                self.problem(
                    rev,
                    Some(dir.as_str()),
                    "an entry of this directory is under the wrong bucket",
                );
                continue;
            }
            // The copy a lookup finds, and the only one: a name held at
            // two depths of one directory reads as the shallower, and the
            // other is a file no command can reach.
            if let Some(e) = enc.as_deref()
                && !self.only_copy(dir_tree, oid, buckets, e)
            {
                self.problem(
                    rev,
                    Some(dir.as_str()),
                    "a name is held twice in this directory (under two of its buckets)",
                );
                continue;
            }
            let name = enc.and_then(|enc| {
                let key = (dir.as_str().to_string(), enc);
                if let Some(n) = self.names.get(&key) {
                    return n.clone();
                }
                let n = self.vault.keys.decrypt_name(&key.0, &key.1).ok();
                self.names.insert(key, n.clone());
                n
            });
            let Some(path) = name.and_then(|n| dir.join(&n).ok()) else {
                self.problem(
                    rev,
                    Some(dir.as_str()),
                    "a name in this directory does not decrypt (altered or foreign entry)",
                );
                continue;
            };
            match kind {
                Some(ObjectType::Tree) => self.tree(rev, id, &path, id, ""),
                Some(ObjectType::Blob) => self.blob(rev, id, &path),
                _ => self.problem(rev, Some(path.as_str()), "an entry has an unexpected type"),
            }
        }
    }

    /// Whether the entry `enc` of the tree `node` (`buckets` below the
    /// directory tree `dir_tree`) is where a lookup finds it, with no copy
    /// in the buckets below it. A tree that does not read is reported
    /// where the walk meets it.
    fn only_copy(&self, dir_tree: Oid, node: Oid, buckets: &str, enc: &str) -> bool {
        let (repo, caches) = (&self.vault.repo, &self.vault.caches);
        let mut here: String = buckets.chars().flat_map(|b| [b, '/']).collect();
        here.push_str(enc);
        match caches.seek_in_dir(repo, dir_tree, enc.as_bytes()) {
            Ok(Seek::Found(_, _, at)) if at != here => return false,
            _ => {}
        }
        let mut level = node;
        for &b in &buckets_of(enc)[buckets.len().min(FANOUT_LEVELS)..] {
            let Ok(entries) = caches.tree_entries(repo, level) else {
                return true;
            };
            match find_entry(&entries, &[b]) {
                Some(i) if entries[i].mode == MODE_TREE => level = entries[i].id,
                _ => return true,
            }
            let Ok(below) = caches.tree_entries(repo, level) else {
                return true;
            };
            if find_entry(&below, enc.as_bytes()).is_some() {
                return false;
            }
        }
        true
    }

    fn blob(&mut self, rev: Oid, oid: Oid, path: &MemoryPath) {
        if !self.blobs_seen.insert((oid, path.as_str().to_string())) {
            return;
        }
        self.report.files_checked += 1;
        let p = Some(path.as_str());
        let blob = match objects::find_blob(&self.vault.repo, oid) {
            Ok(b) => b,
            Err(e) => return self.problem(rev, p, &format!("the stored file is damaged: {e}")),
        };
        let Ok(id) = crypto::blob_key_id(blob.content()) else {
            return self.problem(rev, p, "the stored file has a bad header");
        };
        let key = match self
            .vault
            .key_state
            .file_key(&self.vault.repo, &self.vault.keys, &id)
        {
            Ok(key) => key,
            Err(e) => return self.problem(rev, p, &e.to_string()),
        };
        let Some(key) = key else {
            if self.erased.contains(&id) || self.vault.key_state.erased.contains(&id) {
                self.report.erased_versions += 1;
                return;
            }
            return self.problem(rev, p, "the file's key is missing from the key table");
        };
        if crypto::open_blob(key, path.as_str(), blob.content()).is_err() {
            self.problem(
                rev,
                p,
                "the stored file does not open with its key at this path (altered or moved)",
            );
        }
    }
}

impl Vault {
    /// Check all of history (see the module docs). Problems are reported,
    /// not returned as errors; an `Err` means verify itself could not run.
    pub fn verify(&mut self) -> Result<VerifyReport, VaultError> {
        match self.verify_once() {
            Ok(report) if report.ok() => Ok(report),
            // A writer beside it (a checkpoint that merges packs or takes
            // keys into a new key state) can make a walk without the lock
            // see a state half moved: what it found is looked at again
            // with writers held off (the writer lock, shared), so that
            // only what is damaged is reported.
            _ => {
                let _shared =
                    crate::vault::FileLock::shared_on(&self.lock).map_err(VaultError::Lock)?;
                self.verify_once()
            }
        }
    }

    fn verify_once(&mut self) -> Result<VerifyReport, VaultError> {
        self.wal.catch_up(&self.repo)?;
        // Keys of files created since the last key state are in the log
        // (format 7): taken in here (a key state that does not read is
        // reported below).
        let _ = self.refresh_keys();
        // The ref files as they are now, even under a running process.
        self.wal.forget_refs_seen();
        // Every pack whole, not only the entries of the objects read: a
        // damaged pack refuses every read, so verify cannot run past it.
        objects::check_packs(&self.repo)?;
        let tip = self.wal.ref_target(&self.repo, MAIN_REF)?;
        let mut w = Walker {
            vault: self,
            erased: HashSet::new(),
            trees_seen: HashSet::new(),
            blobs_seen: HashSet::new(),
            names: HashMap::new(),
            report: VerifyReport {
                head: tip.map(|t| t.to_string()),
                ..Default::default()
            },
        };
        let mut commits = Vec::new();
        let mut parents_of: HashMap<Oid, Vec<Oid>> = HashMap::new();
        let mut walked_all = false;
        match tip {
            None => w.report.problems.push(Problem {
                rev: None,
                path: None,
                what: "the vault has no main branch".into(),
            }),
            Some(tip) => {
                // First pass: commits, MACs, metadata (and erasure records):
                // main's first-parent line, then every line a merge brought
                // in (each commit once).
                let mut next = Some(tip);
                let mut side = std::collections::VecDeque::new();
                let mut seen = HashSet::from([tip]);
                let mut complete = true;
                while let Some(id) = next.take().or_else(|| side.pop_front()) {
                    let commit = match objects::find_commit(&w.vault.repo, id) {
                        Ok(c) => c,
                        Err(e) => {
                            w.problem(id, None, &format!("the commit is damaged: {e}"));
                            complete = false;
                            continue;
                        }
                    };
                    let all_parents: Vec<Oid> = commit.parent_ids().collect();
                    let first = all_parents.first().copied();
                    for &p in all_parents.iter().skip(1) {
                        if seen.insert(p) {
                            side.push_back(p);
                        }
                    }
                    next = first.filter(|p| seen.insert(*p));
                    let tree = commit.tree_id();
                    let mac_ok = verify_commit_mac(&w.vault.repo, &w.vault.keys, id);
                    let meta = data_encoding::BASE64
                        .decode(commit.message_bytes().trim_ascii())
                        .ok()
                        .and_then(|sealed| {
                            let aad = meta_aad(tree, first);
                            w.vault.keys.open_meta(&aad, &sealed).ok()
                        })
                        .and_then(|plain| crate::vault::meta::decode(&plain));
                    drop(commit);
                    if !mac_ok {
                        w.problem(
                            id,
                            None,
                            "the commit's MAC does not match (not written with this vault's key, or altered)",
                        );
                    }
                    match meta {
                        Some(m) => {
                            for k in &m.erased_keys {
                                if let Some(id) = FileKeyId::from_hex(k) {
                                    w.erased.insert(id);
                                }
                            }
                        }
                        None => w.problem(id, None, "the commit's metadata does not open"),
                    }
                    commits.push((id, tree));
                    parents_of.insert(id, all_parents);
                }
                // No damaged commit on the way: the walk saw all of main.
                walked_all = complete;
                w.report.commits = commits.len();
                // Second pass: every tree, oldest first.
                for (id, tree) in oldest_first(&commits, &parents_of) {
                    w.tree(id, tree, &MemoryPath::root(), tree, "");
                }
            }
        }
        let mut report = w.report;
        // The key state, read again from the repository.
        let at = self.keys_target()?;
        // Every shard of the key table must open, not only those of the
        // keys the walk asked for.
        let state = KeyState::load_at(&self.repo, &self.keys, at)
            .and_then(|s| s.open_all_shards(&self.repo, &self.keys).map(|()| s))
            .and_then(|s| {
                crate::vault::keys::check_chain(&self.repo, &self.keys, s.commit).map(|_| s)
            });
        match state {
            Err(e) => report.problems.push(Problem {
                rev: None,
                path: None,
                what: format!("the key state is not sound: {e}"),
            }),
            Ok(_) => {
                // Bound to main: not older than the tip requires.
                if let Some(tip) = tip
                    && let Err(e) = self.check_binding(tip)
                {
                    report.problems.push(Problem {
                        rev: Some(tip.to_string()),
                        path: None,
                        what: e.to_string(),
                    });
                }
            }
        }
        match self.erase_marker_state() {
            Ok(None) => {}
            Ok(Some(note)) => report.notes.push(note),
            Err(what) => report.problems.push(Problem {
                rev: None,
                path: None,
                what,
            }),
        }
        // Rollback against the high-water mark.
        if let Some(tip) = tip {
            // Whether main still holds the last verified head is known only
            // when the walk reached the first commit: a damaged commit on
            // the way is reported as damage above, not as a rollback.
            let on_main: HashSet<Oid> = commits.iter().map(|c| c.0).collect();
            if walked_all && let Some(problem) = self.check_high_water(tip, &on_main) {
                report.problems.push(problem);
            }
            // The vault checks out; a mark that cannot be written (a full
            // disk) is said in the report, not instead of it.
            if report.ok()
                && let Err(e) = self.write_high_water(tip, report.commits)
            {
                report.problems.push(Problem {
                    rev: None,
                    path: None,
                    what: format!(
                        "every check passed, but memvault/verified-head could not be written ({e}): run verify again once that is fixed"
                    ),
                });
            }
        }
        Ok(report)
    }

    fn hwm_mac(&self, head: &str, commits: usize) -> String {
        data_encoding::HEXLOWER.encode(&self.keys.mac(&hwm_message(head, commits)))
    }

    /// Whether `tag` (hex) is the mark's MAC under the key of any epoch
    /// (a mark written before a `rekey` still checks out), in constant
    /// time.
    fn hwm_tag_ok(&self, head: &str, commits: usize, tag: &str) -> bool {
        data_encoding::HEXLOWER
            .decode(tag.as_bytes())
            .is_ok_and(|t| self.keys.verify_mac(&hwm_message(head, commits), &t))
    }

    fn check_high_water(&self, tip: Oid, on_main: &HashSet<Oid>) -> Option<Problem> {
        let text =
            crate::vault::fsx::read_to_string(&self.dir.join(HWM_FILE), crate::vault::fsx::SMALL)
                .ok()?;
        let parts: Vec<&str> = text.split_whitespace().collect();
        let altered = || {
            Some(Problem {
                rev: None,
                path: None,
                what: "memvault/verified-head was altered (its MAC does not match)".into(),
            })
        };
        let [version, head, commits, mac] = parts[..] else {
            return altered();
        };
        let Ok(count) = commits.parse::<usize>() else {
            return altered();
        };
        if version != "v1" || !self.hwm_tag_ok(head, count, mac) {
            return altered();
        }
        let Ok(head_id) = Oid::from_str(head) else {
            return altered();
        };
        if head_id == tip || on_main.contains(&head_id) {
            return None;
        }
        Some(Problem {
            rev: Some(tip.to_string()),
            path: None,
            what: format!(
                "rollback: main no longer contains the last verified head {head} ({count} commits); it was moved back or rewritten"
            ),
        })
    }

    /// For `gc`, which deletes what main does not reach: refuse a main
    /// that does not hold `verify`'s last verified head (moved back or
    /// rewritten), or a mark that was altered. No mark, no check.
    pub(crate) fn check_not_behind_verified(&self, tip: Oid) -> Result<(), VaultError> {
        let text = match crate::vault::fsx::read_to_string(
            &self.dir.join(HWM_FILE),
            crate::vault::fsx::SMALL,
        ) {
            Ok(t) => t,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(()),
            Err(e) => return Err(e.into()),
        };
        let parts: Vec<&str> = text.split_whitespace().collect();
        let head = match parts[..] {
            [version, head, commits, mac]
                if version == "v1"
                    && commits
                        .parse::<usize>()
                        .is_ok_and(|n| self.hwm_tag_ok(head, n, mac)) =>
            {
                Oid::from_str(head).ok()
            }
            _ => None,
        };
        let Some(head) = head else {
            return Err(VaultError::Damaged(
                "memvault/verified-head was altered (its MAC does not match); run `memvault verify`",
            ));
        };
        if head == tip || self.reaches(tip, head, usize::MAX)? {
            return Ok(());
        }
        Err(VaultError::RolledBack(format!(
            "main no longer contains the last verified head {head}: it was moved back or rewritten; nothing was deleted"
        )))
    }

    fn write_high_water(&self, tip: Oid, commits: usize) -> Result<(), VaultError> {
        let head = tip.to_string();
        let line = format!("v1 {head} {commits} {}\n", self.hwm_mac(&head, commits));
        // The tip may be a record another process appended and has not
        // synced yet (its group commit): synced first, so a power cut
        // cannot leave the mark ahead of main (a rollback that never was).
        self.wal.sync()?;
        write_durable(&self.dir.join(HWM_FILE), line.as_bytes())?;
        Ok(())
    }
}

/// What the MAC of `memvault/verified-head` covers.
fn hwm_message(head: &str, commits: usize) -> Vec<u8> {
    format!("memvault verified head v1\0{head}\0{commits}").into_bytes()
}

/// The commits a walk read, each after all of its parents (parents the
/// walk did not read, being damaged, are skipped): damage in a tree or
/// file several commits share is reported at the first one that holds it.
fn oldest_first(commits: &[(Oid, Oid)], parents_of: &HashMap<Oid, Vec<Oid>>) -> Vec<(Oid, Oid)> {
    let tree_of: HashMap<Oid, Oid> = commits.iter().copied().collect();
    let mut out = Vec::with_capacity(commits.len());
    let mut done: HashSet<Oid> = HashSet::new();
    // Depth first without recursion: (commit, whether its parents are in).
    let mut stack: Vec<(Oid, bool)> = commits.iter().map(|&(id, _)| (id, false)).rev().collect();
    while let Some((id, expanded)) = stack.pop() {
        if done.contains(&id) {
            continue;
        }
        if expanded {
            done.insert(id);
            out.push((id, tree_of[&id]));
            continue;
        }
        stack.push((id, true));
        for p in parents_of.get(&id).into_iter().flatten() {
            if tree_of.contains_key(p) && !done.contains(p) {
                stack.push((*p, false));
            }
        }
    }
    out
}
