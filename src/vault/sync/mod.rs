//! Sync: one vault on many machines through any git remote.
//!
//! - Only `refs/heads/main` and `refs/memvault/keys` travel; the remote
//!   gets what a stolen disk would show: encrypted objects.
//! - Transport is the user's `git` (see [`git`]), run in a scratch
//!   repository, never in the vault.
//! - Fetch: everything new is read back out of the scratch repository and
//!   hashed here; every new commit must carry this vault's MAC, the key
//!   state too; the remote's main must descend from what this vault last
//!   saw of it (else it rolled back or forked) and its key state's counter
//!   may not go back. Only then are the objects written, as one synced
//!   pack, into the vault.
//! - Pull: fast-forward, or a merge (see [`merge`]): one MAC'd commit with
//!   two parents and the union of the two key states, erasures winning, in
//!   one log record.
//! - Push: never forced. Each ref moves only from the target this vault
//!   last saw (`--force-with-lease=REF:OLD`, checked by the receiving
//!   side), both at once where the remote supports `--atomic`, else the
//!   key state first: a clone between the two finds every key the older
//!   main needs.
//! - One sync at a time per vault (`memvault/sync.lock`); the writer lock
//!   is held only while a merge is published, so writes keep flowing.

mod git;
mod machine;
mod merge;
pub(crate) use merge::REKEYED;
mod remotes;

use std::collections::{BTreeSet, HashSet, VecDeque};
use std::path::Path;

use git2::{ObjectType, Oid};

pub use git::no_prompts as sync_without_prompts;
#[cfg(feature = "cli")]
pub use git::set_remote_timeout;
pub(crate) use machine::machine_label;
pub use machine::{Machine, machine_info, set_machine_name};
pub use remotes::{RemoteEntry, Seen};

use super::engine::{KEYS_REF, pack};
use super::keys::{KeyState, mac_epoch, read_header, verify_commit_mac};
use super::wal::{Object, Record};
use super::{FileLock, MAIN_REF, Vault, VaultError, damaged, objects};

/// Why a sync step failed (the vault is unchanged unless it says so).
#[derive(Debug, thiserror::Error)]
pub enum SyncError {
    #[error("{0}")]
    BadUrl(String),
    #[error(
        "a remote name is 1 to 64 letters, digits, '.', '_' or '-', not starting with '.' or '-'"
    )]
    BadName,
    #[error("no remote named {0:?}: add one with `memvault remote add NAME URL`")]
    NoSuchRemote(String),
    #[error("a remote named {0:?} exists already")]
    RemoteExists(String),
    #[error(
        "memvault/remotes was altered (its MAC does not match this vault's key); nothing was changed"
    )]
    RemotesAltered,
    #[error("git was not found: memvault reaches remotes through your `git`; install it")]
    NoGit,
    #[error("remote {remote}: {detail}")]
    Transport { remote: String, detail: String },
    #[error(
        "remote {remote} moved since this vault last pulled from it; nothing was pushed: run `memvault sync {remote}` (pull, merge, then push)"
    )]
    Moved { remote: String },
    #[error(
        "remote {remote} moved again before each push of this sync ({attempts} tries): another machine keeps pushing to it. What each pull brought is merged here; nothing was pushed. Run `memvault sync {remote}` again once the other machine's pushes pause"
    )]
    KeptMoving { remote: String, attempts: usize },
    #[error(
        "remote {remote}: its ref {name} is locked (the file {name}.lock in the remote repository): another push is running there, or one was stopped before it finished; nothing was pushed. If no push is running there, remove that lock file and sync again"
    )]
    RefLocked { remote: String, name: String },
    #[error(
        "remote {remote} is a memvault vault's own directory, not a git remote: a push there would go round its write-ahead log and the processes serving it; nothing was pushed. Give a bare git repository (`git init --bare DIR`) as the remote, and sync each vault with it"
    )]
    VaultAsRemote { remote: String },
    #[error(
        "remote {remote} is a memvault vault's own directory whose write-ahead log holds changes its git refs do not show yet (a process is serving it, or was stopped before it closed): nothing was fetched. Stop its processes and run `memvault gc` there first, or sync both through a bare git repository"
    )]
    VaultBusy { remote: String },
    #[error(
        "remote {remote} rolled back: {what}; nothing was changed here (run `memvault verify --remote {remote}`; if it was restored from a backup on purpose and you trust it, make this vault forget what it saw there with `memvault remote remove {remote}` and `memvault remote add {remote} URL`: the next sync merges what each side holds and sends it what it lacks)"
    )]
    RolledBack { remote: String, what: &'static str },
    /// The remote's key state is older than its own main needs (put back
    /// alone, from an older copy): forgetting what this vault saw there
    /// does not help, the remote itself must be repaired.
    #[error(
        "remote {remote} rolled back: its key state is older than its main requires (its refs/memvault/keys was put back from an older copy, or tampered with); nothing was changed here, and memvault never overwrites a remote's key state (an older one can bring back keys an erasure destroyed). Restore the remote from a copy taken after its last change; or start a new remote from the machine that synced last: `memvault remote add NEW URL` and `memvault push NEW` there (an empty repository), then `memvault remote add NEW URL` and `memvault sync NEW` on each other machine (or `memvault clone NEW` where there is no copy yet)"
    )]
    KeysBehind { remote: String },
    /// The remote's key state holds what this vault's lacks, beside a main
    /// that brings nothing new (see `Vault::merge_incoming`).
    #[error(
        "remote {remote}'s key state moved without its main: it holds file keys or erasures this vault has not taken in, and its main brings no commit that made them (its refs/heads/main was put back from an older copy, or another machine's push stopped between the two refs); nothing was changed here, and memvault never overwrites a remote's key state (this vault's would undo an erasure made there). If another machine was syncing, its next `memvault sync {remote}` completes its push: then sync here again. If the remote was put back, the machine that made its newer key state finds it rolled back at its next sync, whose message says how to repair it: then sync here again. If that machine is gone, start a new remote from this one: `memvault remote add NEW URL` and `memvault push NEW` here (an empty repository), then `memvault remote add NEW URL` and `memvault sync NEW` on each other machine"
    )]
    KeysAhead { remote: String },
    #[error(
        "remote {remote} forked: its main does not descend from what this vault last saw of it; nothing was changed here (run `memvault verify --remote {remote}`; if it was restored or replaced on purpose and you trust it, make this vault forget what it saw there with `memvault remote remove {remote}` and `memvault remote add {remote} URL`: the next sync merges what each side holds and sends it what it lacks)"
    )]
    Forked { remote: String },
    #[error("remote {remote} cannot be trusted: {what}; nothing was changed here")]
    Hostile { remote: String, what: String },
    #[error(
        "remote {remote} is a repository on this machine whose git config names a command git would run here ({key}): memvault runs no program a remote names, so nothing was sent or fetched. Remove that setting from the remote repository's config (`git config --unset {key}` there), or reach it over SSH"
    )]
    RemoteCommand { remote: String, key: String },
    #[error(
        "remote {remote} is a repository on this machine whose git config git cannot read (a line it does not parse, or an include of a file that is not git config): memvault could not check it for commands git would run here, so nothing was sent or fetched. Repair that config (`git config --list --show-origin` in that repository names the bad file), or reach it over SSH"
    )]
    RemoteConfigUnreadable { remote: String },
    #[error(
        "remote {remote} holds a key state of a newer key epoch (`memvault rekey` ran on another machine), which this copy cannot take in yet; nothing was changed here. Clone the remote anew into another directory (`memvault --vault DIR clone URL`, with a secret it opens); this copy keeps what it holds, and what it wrote since its last sync is not on the remote: `memvault export OUT` here writes its files out, to put those writes into the new clone"
    )]
    Rekeyed { remote: String },
    #[error("this vault's main does not contain what it last saw of remote {remote}; pull first")]
    NotMerged { remote: String },
    #[error("{0}")]
    Local(String),
    /// An I/O failure on this machine (a full disk, most likely).
    #[error("{0}")]
    LocalIo(std::io::Error),
}

impl SyncError {
    /// What a remote caught between the two ref updates of another
    /// machine's push looks like for a moment (see
    /// [`Vault::pull_settled`]): a key state ahead of or behind its main,
    /// or a ref naming what the fetch did not bring.
    fn is_mid_push(&self) -> bool {
        match self {
            SyncError::KeysAhead { .. } | SyncError::KeysBehind { .. } => true,
            SyncError::Hostile { what, .. } => what.ends_with("did not send"),
            _ => false,
        }
    }
}

/// What a push did.
#[derive(Debug, Clone, Default, serde::Serialize)]
pub struct PushReport {
    pub remote: String,
    /// False: the remote already held this vault's tips.
    pub pushed: bool,
    /// The access table (views made here, for other machines' expiry)
    /// was sent, with or without the tips.
    pub sent_views: bool,
    /// Commits on main the remote did not have.
    pub commits: usize,
    pub main: Option<String>,
    /// A remote reached as a path was pruned after the push replaced its
    /// key states (an erasure, a keyslot change, a rekey): what they held
    /// is deleted there too.
    pub pruned: bool,
    /// That prune failed (the push itself landed): why.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub prune_failed: Option<String>,
}

/// What a pull did.
#[derive(Debug, Clone, Default, serde::Serialize)]
pub struct PullReport {
    pub remote: String,
    /// "up to date", "fast-forward", "merged", "empty remote".
    pub outcome: String,
    /// New commits received from the remote.
    pub commits: usize,
    /// New objects received.
    pub objects: usize,
    /// Files the merge changed here (paths after the merge).
    pub merged_files: Vec<String>,
    /// Conflicts: (the file, the copy holding the other side's version).
    pub conflicts: Vec<(String, String)>,
    /// File keys destroyed here because the other side erased them.
    pub erased: usize,
    /// Files the other side wrote, not knowing, at or below a path this
    /// side purged or expired since: kept (purge them again if they must
    /// go).
    pub under_erased: Vec<String>,
    /// Files one side expired and the other edited before it heard: the
    /// edit was kept, under a new file key (the expired key is destroyed).
    pub kept_over_expiry: Vec<String>,
    /// Files whose merged text held a secret (the two sides' edits
    /// together): redacted, with the kinds taken out.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub redacted: Vec<(String, Vec<(String, u32)>)>,
    /// The keyslot this process unlocked with, removed by another machine
    /// (the pull brought the removal): its secret no longer opens the vault.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub own_slot_removed: Option<String>,
}

/// How a remote stands (`verify --remote`): checked, nothing changed.
#[derive(Debug, Clone, Default, serde::Serialize)]
pub struct RemoteState {
    pub remote: String,
    /// It holds no vault yet.
    pub empty: bool,
    pub main: Option<String>,
    pub key_counter: u64,
    /// Commits it has that this vault has not merged.
    pub new_commits: usize,
    /// Commits this vault has that it lacks (a push would send them).
    pub behind: usize,
}

/// What `sync` did: its pulls (more than one when the remote moved
/// between a pull and the push) and its push.
#[derive(Debug, Clone, Default, serde::Serialize)]
pub struct SyncReport {
    pub pulls: Vec<PullReport>,
    pub push: PushReport,
}

/// What a fetch brought: the remote's tips, checked, their objects
/// written into the vault.
struct Incoming {
    main: Option<Oid>,
    keys: Option<Oid>,
    counter: u64,
    /// The remote's access ref and the sealed access records it holds.
    access: Option<(Oid, Vec<u8>)>,
    /// New commits on main (not the key state).
    commits: Vec<Oid>,
    objects: usize,
}

const SYNC_LOCK: &str = "memvault/sync.lock";
/// The message of the access ref's commit.
const ACCESS_MESSAGE: &str = "memvault access table v1\n";

/// One sync at a time per vault: held while a push, pull or sync runs.
struct SyncLock {
    _guard: FileLock,
    _file: std::fs::File,
}
/// The most objects one fetch may bring.
const MAX_OBJECTS: usize = 20_000_000;
/// The most bytes one fetch may bring.
const MAX_BYTES: u64 = 64 << 30;
/// The largest commit a remote may send: a commit's message is its sealed
/// metadata, a few hundred bytes to a few MiB for a merge or an import
/// that lists many files.
const MAX_COMMIT: u64 = 64 << 20;
/// How many times `sync` pulls again when the remote moved before its push.
const SYNC_ATTEMPTS: usize = 8;

impl From<SyncError> for VaultError {
    fn from(e: SyncError) -> Self {
        VaultError::Sync(Box::new(e))
    }
}

impl Vault {
    /// The remotes of this vault, as stored (checked against its key).
    pub fn remotes(&self) -> Result<Vec<RemoteEntry>, VaultError> {
        remotes::load(&self.dir, &self.keys)
    }

    /// The remotes that lack some of main, by what this vault last saw
    /// there (no network): main's tip is not what it last pushed or
    /// pulled there, nor under it. A remote never synced lacks it all.
    pub fn remotes_behind(&mut self) -> Result<Vec<String>, VaultError> {
        let Some(tip) = self.checked_tip()? else {
            return Ok(Vec::new());
        };
        let mut behind = Vec::new();
        for r in self.remotes()? {
            let holds = match r.seen.main() {
                Some(seen) => seen == tip || self.reaches(seen, tip, usize::MAX).unwrap_or(false),
                None => false,
            };
            if !holds {
                behind.push(r.name);
            }
        }
        Ok(behind)
    }

    /// Add a remote; returns the URL as stored (a relative path made
    /// absolute).
    pub fn add_remote(&self, name: &str, url: &str) -> Result<String, VaultError> {
        self.put_remote(name, url, false)
    }

    /// Set remote `name` to `url`, adding it or replacing its URL (what
    /// this vault saw there is forgotten when the URL changes). A URL that
    /// is refused changes nothing: the remote keeps the URL it had (it was
    /// removed first, and a refused URL left the tenant with none; round
    /// 41c).
    pub fn set_remote(&self, name: &str, url: &str) -> Result<String, VaultError> {
        self.put_remote(name, url, true)
    }

    fn put_remote(&self, name: &str, url: &str, replace: bool) -> Result<String, VaultError> {
        remotes::check_name(name)?;
        remotes::check_no_secret(url)?;
        let url = git::absolute_url(url)?;
        if names_a_vault_dir(&url) {
            return Err(SyncError::VaultAsRemote {
                remote: name.into(),
            }
            .into());
        }
        let _lock = self.sync_lock()?;
        let mut all = self.remotes()?;
        match all.iter_mut().find(|r| r.name == name) {
            Some(_) if !replace => return Err(SyncError::RemoteExists(name.into()).into()),
            Some(r) if r.url == url => return Ok(url),
            Some(r) => {
                r.url = url.clone();
                r.seen = Seen::default();
            }
            None => all.push(RemoteEntry {
                name: name.into(),
                url: url.clone(),
                seen: Seen::default(),
            }),
        }
        remotes::store(&self.dir, &self.keys, &all)?;
        Ok(url)
    }

    /// Remove a remote (nothing on the remote changes).
    pub fn remove_remote(&self, name: &str) -> Result<(), VaultError> {
        let _lock = self.sync_lock()?;
        let mut all = self.remotes()?;
        let before = all.len();
        all.retain(|r| r.name != name);
        if all.len() == before {
            return Err(SyncError::NoSuchRemote(name.into()).into());
        }
        remotes::store(&self.dir, &self.keys, &all)
    }

    fn remote(&self, name: &str) -> Result<RemoteEntry, VaultError> {
        self.remotes()?
            .into_iter()
            .find(|r| r.name == name)
            .ok_or_else(|| SyncError::NoSuchRemote(name.into()).into())
    }

    fn set_seen(&self, name: &str, seen: Seen) -> Result<(), VaultError> {
        let mut all = self.remotes()?;
        if let Some(r) = all.iter_mut().find(|r| r.name == name) {
            r.seen = seen;
        }
        remotes::store(&self.dir, &self.keys, &all)
    }

    fn sync_lock(&self) -> Result<SyncLock, VaultError> {
        let file = super::fsx::open_rw(&self.dir.join(SYNC_LOCK))?;
        let guard = FileLock::exclusive(&file).map_err(VaultError::Lock)?;
        Ok(SyncLock {
            _guard: guard,
            _file: file,
        })
    }

    /// The two tips, with everything of the log checkpointed into git (so
    /// that git, borrowing the vault's objects, sees them).
    fn checkpointed_tips(&mut self) -> Result<(Option<Oid>, Option<Oid>), VaultError> {
        let guard = FileLock::exclusive_on(&self.lock).map_err(VaultError::Lock)?;
        self.checkpoint_locked()?;
        self.log.dirty = false;
        // Read under the lock the checkpoint ran under: another process's
        // create cannot come between, so the pair is one git holds whole,
        // its key state holding every key main's tip names (format 8: a
        // tip read after a later create names the next key state's
        // counter, which a push of this key state would not carry).
        let main = self.refresh()?;
        let keys = self.keys_target()?;
        drop(guard);
        // Every pack written so far, known now (see `holds`).
        self.repo.odb()?.refresh()?;
        Ok((main, keys))
    }

    /// Send this vault's tips to remote `name`, each ref only from what
    /// this vault last saw there. Fails with [`SyncError::Moved`] when the
    /// remote moved since (nothing is forced).
    pub fn push(&mut self, name: &str) -> Result<PushReport, VaultError> {
        let _lock = self.sync_lock()?;
        // Alone, a push with nothing new asks the remote all the same (in
        // a sync, the pull before it just did).
        self.push_leased(name, None, true)
    }

    fn push_locked(&mut self, name: &str) -> Result<PushReport, VaultError> {
        self.push_leased(name, None, false)
    }

    /// [`push_locked`](Self::push_locked); with `first` (the tips
    /// [`push_first`](Self::push_first) has just checkpointed), the access
    /// table goes too even if it did not change, so that every ref the
    /// remote has is under a lease (see [`sync`](Self::sync)).
    fn push_leased(
        &mut self,
        name: &str,
        first: Option<(Oid, Oid)>,
        check_unchanged: bool,
    ) -> Result<PushReport, VaultError> {
        let entry = self.remote(name)?;
        let lease_all = first.is_some();
        let (main, keys) = match first {
            Some((main, keys)) => (Some(main), Some(keys)),
            None => self.checkpointed_tips()?,
        };
        let (Some(main), Some(keys)) = (main, keys) else {
            return Err(damaged("the vault has no history to push"));
        };
        let seen_main = entry.seen.main();
        let seen_keys = entry.seen.keys();
        let mut report = PushReport {
            remote: name.into(),
            main: Some(main.to_string()),
            ..Default::default()
        };
        let digest = self.access_digest()?;
        let access_changed = entry.seen.access_digest.as_deref() != Some(digest.as_str());
        if seen_main == Some(main) && seen_keys == Some(keys) && !access_changed {
            if !check_unchanged {
                self.prune_owed(name, &entry, &mut report)?;
                return Ok(report);
            }
            // Nothing to send; the remote is asked all the same, with the
            // two refs under their leases at what this vault last saw
            // there: a remote that is gone, moved back, or holds another
            // history is an error, never "already has everything".
            let scratch = git::Scratch::new(&self.dir, true)?;
            let same = [
                git::Update {
                    name: KEYS_REF,
                    new: keys,
                    old: Some(keys),
                },
                git::Update {
                    name: MAIN_REF,
                    new: main,
                    old: Some(main),
                },
            ];
            let local = git::local_repo(&entry.url);
            let _remote_lock = match local.as_deref() {
                Some(dir) => git::lock_remote(name, dir)?,
                None => None,
            };
            if !scratch.push(name, &entry.url, &same)? {
                return Err(SyncError::Moved {
                    remote: name.into(),
                }
                .into());
            }
            drop(_remote_lock);
            self.prune_owed(name, &entry, &mut report)?;
            return Ok(report);
        }
        let access_changed = access_changed || lease_all;
        // Only a main that holds what the remote had: a push never drops
        // another machine's work (the lease below is the remote's check).
        if let Some(s) = seen_main
            && !self.reaches(main, s, usize::MAX)?
        {
            return Err(SyncError::NotMerged {
                remote: name.into(),
            }
            .into());
        }
        let mut updates = Vec::new();
        if seen_keys != Some(keys) {
            updates.push(git::Update {
                name: KEYS_REF,
                new: keys,
                old: seen_keys,
            });
        }
        if seen_main != Some(main) {
            updates.push(git::Update {
                name: MAIN_REF,
                new: main,
                old: seen_main,
            });
        }
        let scratch = git::Scratch::new(&self.dir, true)?;
        report.commits = match self.linear_distance(main, seen_main) {
            Some(n) => n,
            None => scratch.count_since(main, seen_main.filter(|s| self.holds(*s)))?,
        };
        // The access table too (views make no commit, but another
        // machine's expiry must see them), in the same push, last, under
        // its own lease: its objects are written into the scratch
        // repository only. A lease lost there is the remote having moved,
        // as for the other two (`sync` pulls, which merges the tables, and
        // pushes again).
        let mut access_at = None;
        if access_changed {
            for (kind, data) in self.access_objects(main)? {
                access_at = Some(scratch.write_loose(kind, &data)?);
            }
            if let Some(at) = access_at {
                updates.push(git::Update {
                    name: git::ACCESS_REF,
                    new: at,
                    old: entry.seen.access(),
                });
            }
        }
        // A remote on a path: memvault's pushes there and its prune go one
        // at a time.
        let local = git::local_repo(&entry.url);
        let remote_lock = match local.as_deref() {
            Some(dir) => git::lock_remote(name, dir)?,
            None => None,
        };
        // The key states the remote holds are about to be replaced, not
        // chained to (an erasure, a keyslot change, a rekey): on a remote
        // this machine reaches as a path, they are deleted after the push,
        // as here. Owed from before the push until a prune succeeds: a
        // sync killed in between would leave them readable there.
        let replaced = seen_keys.is_some_and(|old| {
            old != keys && !self.reaches(keys, old, usize::MAX).unwrap_or(false)
        });
        if replaced && local.is_some() && !entry.seen.prune_pending {
            self.set_seen(
                name,
                Seen {
                    prune_pending: true,
                    ..entry.seen.clone()
                },
            )?;
        }
        if !updates.is_empty() && !scratch.push(name, &entry.url, &updates)? {
            return Err(SyncError::Moved {
                remote: name.into(),
            }
            .into());
        }
        let counter = read_header(&self.repo, keys)?.1;
        let mut seen = Seen {
            main: Some(main.to_string()),
            keys: Some(keys.to_string()),
            counter,
            access: entry.seen.access.clone(),
            access_digest: entry.seen.access_digest.clone(),
            prune_pending: local.is_some() && (replaced || entry.seen.prune_pending),
        };
        if let Some(at) = access_at {
            seen.access = Some(at.to_string());
            seen.access_digest = Some(digest);
        }
        self.set_seen(name, seen)?;
        report.pushed = updates
            .iter()
            .any(|u| u.name == KEYS_REF || u.name == MAIN_REF);
        report.sent_views = updates.iter().any(|u| u.name == git::ACCESS_REF);
        drop(remote_lock);
        let entry = self.remote(name)?;
        self.prune_owed(name, &entry, &mut report)?;
        Ok(report)
    }

    /// A prune a push left owed (see [`Seen::prune_pending`]): made now,
    /// under the remote's lock, and the debt cleared once it succeeds.
    fn prune_owed(
        &self,
        name: &str,
        entry: &RemoteEntry,
        report: &mut PushReport,
    ) -> Result<(), VaultError> {
        if !entry.seen.prune_pending {
            return Ok(());
        }
        let Some(dir) = git::local_repo(&entry.url) else {
            return Ok(());
        };
        let _lock = match git::lock_remote(name, &dir) {
            Ok(Some(lock)) => lock,
            // Said, not skipped in silence: the debt stays for the next
            // push or sync.
            Ok(None) => {
                report.prune_failed = Some(format!(
                    "its lock ({}) could not be taken",
                    dir.join("memvault.lock").display()
                ));
                return Ok(());
            }
            Err(e) => {
                report.prune_failed = Some(e.to_string());
                return Ok(());
            }
        };
        match git::prune_remote(name, &dir) {
            Ok(()) => {
                report.pruned = true;
                self.set_seen(
                    name,
                    Seen {
                        prune_pending: false,
                        ..entry.seen.clone()
                    },
                )
            }
            Err(e) => {
                report.prune_failed = Some(e.to_string());
                Ok(())
            }
        }
    }

    /// Fetch remote `name` and merge what it has into this vault.
    pub fn pull(&mut self, name: &str) -> Result<PullReport, VaultError> {
        let _lock = self.sync_lock()?;
        self.pull_settled(name)
    }

    /// [`Vault::pull_locked`], tried again while the remote looks caught
    /// in the middle of another machine's push: its two refs are not
    /// updated at once (git's ref files are renamed into place one after
    /// the other, and a smart-HTTP fetch reads them apart from the pack),
    /// so a pull can meet a new main beside the old key state, or the
    /// reverse. A remote that stays so is reported after the last try.
    /// Nothing is kept from a failed pull (its objects are checked before
    /// any enters the vault).
    fn pull_settled(&mut self, name: &str) -> Result<PullReport, VaultError> {
        let mut attempt = 1;
        loop {
            match self.pull_locked(name) {
                Err(VaultError::Sync(e)) if e.is_mid_push() && attempt < SYNC_ATTEMPTS => {
                    std::thread::sleep(std::time::Duration::from_millis(200 * attempt as u64));
                    attempt += 1;
                }
                r => return r,
            }
        }
    }

    fn pull_locked(&mut self, name: &str) -> Result<PullReport, VaultError> {
        let entry = self.remote(name)?;
        let mut report = PullReport {
            remote: name.into(),
            ..Default::default()
        };
        let Some(incoming) = self.fetch_checked(&entry, true)? else {
            report.outcome = "empty remote".into();
            return Ok(report);
        };
        report.commits = incoming.commits.len();
        report.objects = incoming.objects;
        let (Some(their_main), Some(their_keys)) = (incoming.main, incoming.keys) else {
            report.outcome = "empty remote".into();
            return Ok(report);
        };
        let outcome = self.with_writer_lock(|v: &mut Vault, tip| {
            v.merge_incoming(name, tip, their_main, their_keys, &incoming.commits)
        })?;
        report.outcome = outcome.what.into();
        report.merged_files = outcome.files;
        report.conflicts = outcome.conflicts;
        report.erased = outcome.erased;
        report.under_erased = outcome.under_erased.clone();
        report.kept_over_expiry = outcome.kept_over_expiry.clone();
        report.redacted = outcome.redacted.clone();
        // A removal another machine made of the slot this one unlocked
        // with: said now, not only at the next command.
        report.own_slot_removed = self
            .unlocked_slot
            .clone()
            .filter(|s| !self.key_state.slots.contains_key(s));
        if outcome.erased > 0 || outcome.stale > 0 {
            // The replaced key states held the erased keys: gone here too
            // (a checkpoint and a scrub of the log: under the writer lock).
            // So are fetched states that hold keys erased here. The merge
            // left the erasure marker: the writer lock's first step prunes
            // and removes it (and would, after a crash, in any writer).
            crate::vault::retention::erase::test_crash("after-merge-erasure");
            self.with_writer_lock(|_: &mut Vault, _| Ok::<(), VaultError>(()))?;
        }
        // Views made on other machines count here too (for expiry); when
        // this machine knows nothing newer, there is nothing to send back.
        let mut access_digest = None;
        if let Some((_, records)) = &incoming.access {
            let theirs = self.merge_access_records(records)?;
            let ours = self.access_digest()?;
            access_digest = (ours == theirs).then_some(ours);
        }
        self.set_seen(
            name,
            Seen {
                main: Some(their_main.to_string()),
                keys: Some(their_keys.to_string()),
                counter: incoming.counter,
                access: incoming.access.as_ref().map(|(a, _)| a.to_string()),
                access_digest,
                // A prune still owed there stays owed.
                prune_pending: self.remote(name)?.seen.prune_pending,
            },
        )?;
        Ok(report)
    }

    /// The tips `sync` pushes first, if it does: this vault holds commits remote `name`
    /// has not seen, and the remote (reached as a path, its refs read
    /// from its files) still points where this vault last saw it. A
    /// remote over the network is fetched first: asking it costs a
    /// connection, as a push that finds it moved does.
    fn push_first(&mut self, name: &str) -> Result<Option<(Oid, Oid)>, VaultError> {
        let entry = self.remote(name)?;
        let (Some(seen_main), Some(seen_keys)) = (entry.seen.main(), entry.seen.keys()) else {
            return Ok(None);
        };
        let unmoved = git::local_repo(&entry.url)
            .and_then(|dir| git::peek_refs(&dir))
            .is_some_and(|at| {
                at.main == Some(seen_main)
                    && at.keys == Some(seen_keys)
                    && at.access == entry.seen.access()
            });
        if !unmoved {
            return Ok(None);
        }
        // The tips, checkpointed (the push uses them as they are).
        let (Some(main), Some(keys)) = self.checkpointed_tips()? else {
            return Ok(None);
        };
        Ok((main != seen_main || keys != seen_keys).then_some((main, keys)))
    }

    /// Check remote `name` as a pull would (every new object hashed, every
    /// new commit and the key state MAC'd with this vault's key, no
    /// rollback or fork against what this vault saw there), changing
    /// nothing here; and say how it stands against this vault.
    pub fn verify_remote(&mut self, name: &str) -> Result<RemoteState, VaultError> {
        let _lock = self.sync_lock()?;
        let entry = self.remote(name)?;
        let mut state = RemoteState {
            remote: name.into(),
            ..Default::default()
        };
        let Some(incoming) = self.fetch_checked(&entry, false)? else {
            state.empty = true;
            return Ok(state);
        };
        state.main = incoming.main.map(|m| m.to_string());
        state.key_counter = incoming.counter;
        state.new_commits = incoming.commits.len();
        let tip = self.checked_tip()?;
        if let (Some(tip), Some(main)) = (tip, incoming.main)
            && incoming.commits.is_empty()
            && tip != main
        {
            state.behind = git::Scratch::new(&self.dir, true)?.count_since(tip, Some(main))?;
        }
        Ok(state)
    }

    /// Pull, then push; when the remote moved in between, pull again (at
    /// most a few times).
    pub fn sync(&mut self, name: &str) -> Result<SyncReport, VaultError> {
        let _lock = self.sync_lock()?;
        let mut report = SyncReport::default();
        // With something to send to a remote that looks unmoved since
        // this vault last saw it (see `push_first`), push first, every
        // ref of the remote under a lease (main, keys, and the access
        // table, sent even when unchanged): if it lands, the remote held
        // exactly what this vault last merged, so a pull would have
        // brought nothing (and its fetch cost as much as the push). If
        // the remote moved after all, nothing moved there: pull, merge
        // and push as below.
        if let Some(tips) = self.push_first(name)? {
            match self.push_leased(name, Some(tips), false) {
                Ok(push) => {
                    report.pulls.push(PullReport {
                        remote: name.into(),
                        outcome: "up to date".into(),
                        ..Default::default()
                    });
                    report.push = push;
                    return Ok(report);
                }
                // (Or this vault's main does not hold what the remote
                // had: the pull below merges it.)
                Err(VaultError::Sync(e))
                    if matches!(
                        *e,
                        SyncError::Moved { .. }
                            | SyncError::NotMerged { .. }
                            | SyncError::RefLocked { .. }
                    ) => {}
                Err(e) => return Err(e),
            }
        }
        for attempt in 1..=SYNC_ATTEMPTS {
            report.pulls.push(self.pull_settled(name)?);
            match self.push_locked(name) {
                Ok(push) => {
                    report.push = push;
                    return Ok(report);
                }
                // Another machine pushed since the pull: pull again, after
                // a pause of random length (growing with the attempts), so
                // that two machines syncing in step do not keep meeting.
                // After the last, the loop ends with `KeptMoving`.
                Err(VaultError::Sync(e)) if matches!(*e, SyncError::Moved { .. }) => {
                    if attempt < SYNC_ATTEMPTS {
                        let r = u64::from(u16::from_le_bytes(crate::crypto::random_bytes::<2>()));
                        std::thread::sleep(std::time::Duration::from_millis(
                            (20 + r % 80) * attempt as u64,
                        ));
                    }
                }
                // Another push holds the remote's ref: give it a moment.
                Err(VaultError::Sync(e))
                    if matches!(*e, SyncError::RefLocked { .. }) && attempt < SYNC_ATTEMPTS =>
                {
                    std::thread::sleep(std::time::Duration::from_millis(100 * attempt as u64));
                }
                Err(e) => return Err(e),
            }
        }
        Err(SyncError::KeptMoving {
            remote: name.into(),
            attempts: SYNC_ATTEMPTS,
        }
        .into())
    }

    /// Fetch the remote's two refs and check everything new before any of
    /// it enters the vault (see the module docs). None: the remote has no
    /// main.
    fn fetch_checked(
        &mut self,
        entry: &RemoteEntry,
        store: bool,
    ) -> Result<Option<Incoming>, VaultError> {
        let name = entry.name.as_str();
        let hostile = |what: &str| SyncError::Hostile {
            remote: name.to_string(),
            what: what.to_string(),
        };
        let (our_main, our_keys) = self.checkpointed_tips()?;
        let scratch = git::Scratch::new(&self.dir, true)?;
        // What this vault holds, offered so that only the new travels.
        let mut have: Vec<Oid> = Vec::new();
        for id in [our_main, our_keys, entry.seen.main(), entry.seen.keys()]
            .into_iter()
            .flatten()
        {
            if !have.contains(&id) && self.holds(id) {
                have.push(id);
            }
        }
        if !scratch.fetch(name, &entry.url, &have)? {
            if entry.seen.main.is_some() {
                return Err(SyncError::RolledBack {
                    remote: name.into(),
                    what: "it no longer shows a main branch (deleted, or its ref is not one git can read)",
                }
                .into());
            }
            return Ok(None);
        }
        let incoming = scratch.incoming();
        let (Some(main), Some(keys)) = (incoming.main, incoming.keys) else {
            return Err(hostile("it has a main branch but no key state").into());
        };
        let tips: Vec<Oid> = [Some(main), Some(keys), incoming.access]
            .into_iter()
            .flatten()
            .collect();
        let mut ids = scratch.new_objects(name, &tips, &have, MAX_OBJECTS)?;
        // git leaves out only what the commits it was offered reach, so a
        // key state that starts a new chain (no parent) comes with its
        // whole table: what the vault already holds is not read again.
        ids.retain(|id| !self.holds(*id));
        // The commits first, each with this vault's MAC (or a later
        // epoch's: a rekey), before any tree or blob is read: the rest is
        // then what genuine commits name, by hash. A remote that planted
        // a 600 MB blob under a commit of its own made the pull hold
        // twice that before refusing it (round 41b).
        let new_commits = scratch.commits_among(name, &ids)?;
        // Each ref a commit (sent, or held here): a ref to a blob or a
        // tree would have it read below before anything refused it.
        for tip in &tips {
            if !new_commits.contains_key(tip) && !self.holds(*tip) {
                return Err(hostile("a ref names something that is not a commit").into());
            }
        }
        // No commit memvault writes comes near this (its message is the
        // sealed metadata).
        if new_commits.values().any(|&size| size > MAX_COMMIT) {
            return Err(hostile("it sent a commit of absurd size").into());
        }
        let (first, rest): (Vec<Oid>, Vec<Oid>) =
            ids.iter().partition(|id| new_commits.contains_key(id));
        let mut received = scratch.read_objects(name, &first, MAX_BYTES)?;
        // On a remote this vault never synced with, history of another
        // key is most likely another vault's: one URL given to two vaults
        // (two tenants; round 41c), which the bare "cannot be trusted"
        // made look like tampering.
        let foreign = if entry.seen.main().is_none() {
            "it holds another vault's history (its commits were not written with this vault's key): one remote repository holds one vault, so give this vault a repository of its own, unless the remote was tampered with"
        } else {
            "a commit was not written with this vault's key"
        };
        for o in &received {
            let Some((tag, signed)) = super::keys::split_mac(&o.data) else {
                return Err(hostile(foreign).into());
            };
            self.mac_verdict(name, &signed, &tag, foreign)?;
        }
        let read = received.iter().map(|o| o.data.len() as u64).sum::<u64>();
        received.extend(scratch.read_objects(name, &rest, MAX_BYTES.saturating_sub(read))?);
        drop(scratch);
        // The access ref's three objects: checked and read here, never
        // kept in the vault.
        let access = match incoming.access {
            Some(at) => Some((at, self.take_access(name, at, &mut received)?)),
            None => None,
        };
        // Into this process's in-memory store only (nothing on disk yet),
        // so that libgit2 can parse them for the checks below.
        let mut new_ids = HashSet::new();
        for o in &received {
            objects::write_object(&self.repo, o.kind, &o.data)?;
            new_ids.insert(o.id);
        }
        // The new key states: the remote's and those it chains to.
        let mut key_states = HashSet::new();
        let mut stack = vec![keys];
        while let Some(id) = stack.pop() {
            if new_ids.contains(&id) && key_states.insert(id) {
                let commit = self
                    .repo
                    .find_commit(id)
                    .map_err(|_| hostile("its key state does not parse"))?;
                stack.extend(commit.parent_ids());
            }
        }
        let commits: Vec<Oid> = received
            .iter()
            .filter(|o| o.kind == ObjectType::Commit && !key_states.contains(&o.id))
            .map(|o| o.id)
            .collect();
        // A commit's MAC: this vault's key, or a later epoch's (a rekey
        // this copy has not had), or not the vault's at all.
        let check_mac = |c: Oid, what: &str| -> Result<(), SyncError> {
            if verify_commit_mac(&self.repo, &self.keys, c) {
                return Ok(());
            }
            if mac_epoch(&self.repo, c).is_some_and(|e| e > self.keys.current_epoch()) {
                return Err(SyncError::Rekeyed {
                    remote: name.into(),
                });
            }
            Err(hostile(what))
        };
        // A commit's parents and tree: sent too, or held here.
        let complete = |c: Oid, unparsed: &str, missing: &str| -> Result<(), SyncError> {
            let commit = self.repo.find_commit(c).map_err(|_| hostile(unparsed))?;
            for p in commit.parent_ids().chain([commit.tree_id()]) {
                if !new_ids.contains(&p) && !self.holds(p) {
                    return Err(hostile(missing));
                }
            }
            Ok(())
        };
        // Each key state: this vault's MAC, a header it reads, parents
        // and tree new too or held here (the remote's own state is
        // checked again below, with its counter).
        for &k in &key_states {
            check_mac(k, "its key state was not written with this vault's key")?;
            read_header(&self.repo, k).map_err(|_| hostile("its key state does not parse"))?;
            complete(
                k,
                "its key state does not parse",
                "its key state names an object it did not send",
            )?;
        }
        // Every new commit: this vault's MAC, readable metadata, parents
        // that are new too or held here; every new tree: entries that are
        // new too or held here.
        for &c in &commits {
            check_mac(c, "a commit was not written with this vault's key")?;
            self.meta_of(c)
                .map_err(|_| hostile("a commit's metadata does not open"))?;
            complete(
                c,
                "a commit does not parse",
                "a commit names an object it did not send",
            )?;
        }
        for o in received.iter().filter(|o| o.kind == ObjectType::Tree) {
            let tree = self
                .repo
                .find_tree(o.id)
                .map_err(|_| hostile("a tree does not parse"))?;
            for e in tree.iter() {
                if !new_ids.contains(&e.id()) && !self.holds(e.id()) {
                    return Err(hostile("a tree names an object it did not send").into());
                }
            }
        }
        // The key state: this vault's MAC, a counter that never goes back.
        check_mac(keys, "its key state was not written with this vault's key")?;
        let (_, counter) =
            read_header(&self.repo, keys).map_err(|_| hostile("its key state does not parse"))?;
        if counter < entry.seen.counter
            || (counter == entry.seen.counter && entry.seen.keys().is_some_and(|k| k != keys))
        {
            return Err(SyncError::RolledBack {
                remote: name.into(),
                what: "its key state is older than the one this vault saw there",
            }
            .into());
        }
        // Its main: a commit of this vault (a blob, or the views' commit,
        // is the remote's doing, not damage here)...
        check_mac(main, "its main is not a commit of this vault")?;
        self.meta_of(main)
            .map_err(|_| hostile("its main is not a commit of this vault"))?;
        // ... from what this vault saw there, forward only.
        if let Some(seen) = entry.seen.main()
            && seen != main
            && !self.reaches(main, seen, usize::MAX)?
        {
            let back = self.reaches(seen, main, usize::MAX).unwrap_or(false);
            return Err(if back {
                SyncError::RolledBack {
                    remote: name.into(),
                    what: "its main is behind what this vault saw there",
                }
            } else {
                SyncError::Forked {
                    remote: name.into(),
                }
            }
            .into());
        }
        let meta = self
            .meta_of(main)
            .map_err(|_| hostile("its newest commit's metadata does not open"))?;
        if meta.keys.is_some_and(|k| k > counter) {
            return Err(SyncError::KeysBehind {
                remote: name.into(),
            }
            .into());
        }
        // Checked: into the vault, as one synced pack.
        if store && !received.is_empty() {
            let refs: Vec<&Object> = received.iter().collect();
            let pack_dir = self.dir.join("objects/pack");
            let pack_name = pack::write(&pack_dir, &refs)?;
            super::sync_dir(&pack_dir);
            objects::trust_written_pack(&self.repo, &pack_name);
        }
        Ok(Some(Incoming {
            main: Some(main),
            keys: Some(keys),
            counter,
            access,
            commits,
            objects: received.len(),
        }))
    }

    /// Whether `signed` carries this vault's MAC `tag`: if not, a later
    /// epoch's (a rekey this copy has not had: `Rekeyed`), or not the
    /// vault's at all (hostile, saying `foreign`).
    fn mac_verdict(
        &self,
        remote: &str,
        signed: &[u8],
        tag: &[u8],
        foreign: &str,
    ) -> Result<(), SyncError> {
        if self.keys.verify_mac(signed, tag) {
            return Ok(());
        }
        let epoch = tag
            .get(..4)
            .and_then(|b| b.try_into().ok())
            .map(u32::from_be_bytes);
        Err(if epoch.is_some_and(|e| e > self.keys.current_epoch()) {
            SyncError::Rekeyed {
                remote: remote.into(),
            }
        } else {
            SyncError::Hostile {
                remote: remote.into(),
                what: foreign.into(),
            }
        })
    }

    /// Take the access ref's commit, tree and blob out of `received`,
    /// check them (the commit carries this vault's MAC and the access
    /// message; the tree holds one blob, `access`) and return the blob:
    /// sealed access records.
    fn take_access(
        &self,
        name: &str,
        at: Oid,
        received: &mut Vec<Object>,
    ) -> Result<Vec<u8>, VaultError> {
        let hostile = |what: &str| SyncError::Hostile {
            remote: name.to_string(),
            what: what.to_string(),
        };
        let mut take = |id: Oid, kind: ObjectType| -> Result<Vec<u8>, SyncError> {
            if let Some(i) = received.iter().position(|o| o.id == id && o.kind == kind) {
                return Ok(received.swap_remove(i).data);
            }
            // Held here already (left out of the fetch): read it, checked.
            let held = || -> Option<Vec<u8>> {
                if !self.holds(id) {
                    return None;
                }
                let odb = self.repo.odb().ok()?;
                let o = odb.read(id).ok()?;
                (o.kind() == kind).then(|| o.data().to_vec())
            };
            held().ok_or_else(|| hostile("its access ref names an object it did not send"))
        };
        let commit = take(at, ObjectType::Commit)?;
        let Some((tag, signed)) = super::keys::split_mac(&commit) else {
            return Err(hostile("its access ref is not a signed commit").into());
        };
        self.mac_verdict(
            name,
            &signed,
            &tag,
            "its access ref was not written with this vault's key",
        )?;
        let text = std::str::from_utf8(&signed).map_err(|_| hostile("its access ref"))?;
        let tree = text
            .strip_prefix("tree ")
            .and_then(|r| r.get(..40))
            .and_then(|h| Oid::from_str(h).ok())
            .filter(|_| text.ends_with(&format!("\n\n{ACCESS_MESSAGE}")))
            .ok_or_else(|| hostile("its access ref is not an access table"))?;
        let tree_bytes = take(tree, ObjectType::Tree)?;
        let prefix = b"100644 access\0";
        let blob = tree_bytes
            .strip_prefix(&prefix[..])
            .filter(|rest| rest.len() == 20)
            .and_then(|rest| Oid::from_bytes(rest).ok())
            .ok_or_else(|| hostile("its access ref is not an access table"))?;
        Ok(take(blob, ObjectType::Blob)?)
    }

    /// The access ref's objects for a push: the sealed access table, a
    /// tree holding it, a commit MAC'd with the vault key (commit last).
    fn access_objects(&self, main: Oid) -> Result<Vec<(ObjectType, Vec<u8>)>, VaultError> {
        // Its date: one past main's (a generation number, see
        // `publish::write_commit`). With date 0 it sorted below every
        // commit, and git walked the whole history before it in every
        // fetch that wanted it.
        let date = objects::find_commit(&self.repo, main)
            .map(|c| c.committer().when().seconds().max(0).saturating_add(1))
            .unwrap_or(1);
        let blob = self.access_records()?;
        let blob_id = pack::object_hash(ObjectType::Blob, &blob);
        let mut tree = b"100644 access\0".to_vec();
        tree.extend_from_slice(&blob_id);
        let tree_id = Oid::from_bytes(&pack::object_hash(ObjectType::Tree, &tree))?;
        // Its parent: main, whose tips it goes with. A fetch that wants it
        // then knows it is complete once the remote has seen the
        // commits main descends from; with no parent, git offered the
        // remote a few hundred commits before giving up on it.
        let buffer = format!(
            "tree {tree_id}\nparent {main}\nauthor m <m> {date} +0000\ncommitter m <m> {date} +0000\n\n{ACCESS_MESSAGE}"
        );
        let tag = data_encoding::HEXLOWER.encode(&self.keys.mac(buffer.as_bytes()));
        let commit = super::keys::signed_commit_bytes(buffer.as_bytes(), &tag)?;
        Ok(vec![
            (ObjectType::Blob, blob),
            (ObjectType::Tree, tree),
            (ObjectType::Commit, commit),
        ])
    }

    /// Whether the vault holds the object `id`, checked (a pruned key
    /// state, for one, is gone). The packs are those known when the sync
    /// began (see `fetch_checked`): libgit2 otherwise rescans the pack
    /// directory on every miss, and most ids asked about are misses (a
    /// clone asks about every object it receives).
    fn holds(&self, id: Oid) -> bool {
        objects::check(&self.repo, id).is_ok()
            && self
                .repo
                .odb()
                .is_ok_and(|odb| odb.exists_ext(id, git2::OdbLookupFlags::NO_REFRESH))
    }

    /// Whether `target` is `from` or one of its ancestors, walking at most
    /// `limit` commits (each checked before libgit2 reads it).
    /// How many commits `tip` is ahead of `base` when `base` is a few
    /// single-parent steps below it (a push's usual case), counted here;
    /// None otherwise (`git rev-list --count` counts).
    fn linear_distance(&self, tip: Oid, base: Option<Oid>) -> Option<usize> {
        let base = base?;
        let mut at = tip;
        for n in 0..64 {
            if at == base {
                return Some(n);
            }
            objects::check(&self.repo, at).ok()?;
            let c = self.repo.find_commit(at).ok()?;
            if c.parent_count() != 1 {
                return None;
            }
            at = c.parent_id(0).ok()?;
        }
        None
    }

    pub(crate) fn reaches(&self, from: Oid, target: Oid, limit: usize) -> Result<bool, VaultError> {
        let mut queue = VecDeque::from([from]);
        let mut seen = HashSet::from([from]);
        while let Some(id) = queue.pop_front() {
            if id == target {
                return Ok(true);
            }
            if seen.len() > limit {
                return Ok(false);
            }
            objects::check(&self.repo, id)?;
            let c = self
                .repo
                .find_commit(id)
                .map_err(|_| damaged("a commit is unreadable"))?;
            for p in c.parent_ids() {
                if seen.insert(p) {
                    queue.push_back(p);
                }
            }
        }
        Ok(false)
    }

    /// The conflict copies a merge left at the tip and that are still
    /// there: (the file, its copy).
    pub fn conflict_copies(&mut self) -> Result<Vec<(String, String)>, VaultError> {
        let tip = self.checked_tip()?;
        let snap = self.snapshot_of(tip)?;
        let files: Vec<String> = snap
            .files_below(&crate::memory::MemoryPath::root())?
            .iter()
            .map(|p| p.as_str().to_string())
            .collect();
        let present: HashSet<&str> = files.iter().map(String::as_str).collect();
        let mut out = Vec::new();
        for path in &files {
            let Some(original) = merge::original_of(path) else {
                continue;
            };
            // A copy of a name near the length limit has a shortened
            // stem: its file is the one file beside it whose name starts
            // with that stem (and has its extension), when there is one.
            let original = if present.contains(original.as_str()) {
                original
            } else {
                let (stem, ext) = match original.rsplit_once('.') {
                    Some((stem, ext)) if !stem.ends_with('/') => (stem, format!(".{ext}")),
                    _ => (original.as_str(), String::new()),
                };
                let dir = stem.rsplit_once('/').map_or("", |(d, _)| d);
                let mut like = files.iter().filter(|f| {
                    f.starts_with(stem)
                        && f.ends_with(&ext)
                        && f.rsplit_once('/').map_or("", |(d, _)| d) == dir
                        && merge::original_of(f).is_none()
                });
                match (like.next(), like.next()) {
                    (Some(one), None) => one.clone(),
                    _ => original,
                }
            };
            out.push((original, path.clone()));
        }
        Ok(out)
    }

    /// Under the writer lock: bring the remote's checked tips into main.
    fn merge_incoming(
        &mut self,
        remote: &str,
        tip: Option<Oid>,
        their_main: Oid,
        their_keys: Oid,
        new_commits: &[Oid],
    ) -> Result<merge::Merged, VaultError> {
        // A key state that holds every shard of the log first (format 7):
        // the merge and the fast-forward compare and replace key states.
        self.fold_keys()?;
        // Everything the fetch brought is new here: a main among it is
        // not in this vault's history (no walk of that history needed).
        let new: BTreeSet<Oid> = new_commits.iter().copied().collect();
        let up_to_date = match tip {
            Some(t) => {
                t == their_main
                    || (!new.contains(&their_main) && self.reaches(t, their_main, usize::MAX)?)
            }
            None => false,
        };
        // Nothing new on the remote's main, and a key state there this
        // vault's does not chain to, holding a key or an erasure this
        // vault's lacks: it moved without its main (every key change comes
        // with a commit on main), so its main was put back alone, or
        // another machine's push stopped between the two refs. The push
        // after this pull would replace it with this vault's, erasures and
        // all: refused, nothing changed.
        if up_to_date
            && their_keys != self.key_state.commit
            && !self.reaches(self.key_state.commit, their_keys, usize::MAX)?
        {
            let theirs = KeyState::load_at(&self.repo, &self.keys, Some(their_keys))?;
            let km = merge::key_change(&self.repo, &self.keys, &self.key_state, &theirs)?;
            if !km.change.files.is_empty() {
                return Err(SyncError::KeysAhead {
                    remote: remote.into(),
                }
                .into());
            }
        }
        if up_to_date {
            return Ok(merge::Merged {
                what: "up to date",
                ..Default::default()
            });
        }
        let theirs = KeyState::load_at(&self.repo, &self.keys, Some(their_keys))?;
        // This vault's tip is in the remote's history: found walking the
        // new commits down to what they build on (a bounded walk).
        let fast_forward = match tip {
            None => true,
            Some(t) => self.reaches(their_main, t, 2 * new.len() + 64)?,
        };
        if fast_forward {
            return self.fast_forward(remote, tip, their_main, theirs);
        }
        let Some(ours) = tip else {
            unreachable!("no tip is a fast-forward");
        };
        let base = self.merge_base(ours, their_main, &new)?;
        self.merge_commits(remote, ours, their_main, base, theirs, &new, false)
    }

    /// Move main and the key state to the remote's (it holds this vault's
    /// main), then add any file key of this side it lacks.
    fn fast_forward(
        &mut self,
        remote: &str,
        tip: Option<Oid>,
        their_main: Oid,
        theirs: KeyState,
    ) -> Result<merge::Merged, VaultError> {
        // The files the fast-forward changes here, for the report (read
        // before the refs move: the trees differ only where it changed).
        let files: Vec<String> = self
            .changed_files(
                tip.map(crate::vault::Rev::from_oid),
                Some(crate::vault::Rev::from_oid(their_main)),
                None,
            )
            .map(|changes| {
                changes
                    .into_iter()
                    .map(|c| c.path.as_str().to_string())
                    .collect()
            })
            .unwrap_or_default();
        let change = merge::key_change(&self.repo, &self.keys, &self.key_state, &theirs)?;
        let ours_only = change.keep;
        let erased = change.erased;
        let stale = change.stale;
        let stale_ids = change.stale_ids;
        if erased > 0 || stale > 0 {
            // The prune that follows is owed even if this process dies
            // before it (see `mark_prune_pending`).
            self.mark_prune_pending()?;
        }
        let mut record = Record::default();
        record.refs.push((KEYS_REF.to_string(), theirs.commit));
        record.refs.push((MAIN_REF.to_string(), their_main));
        if self.wal.tail_target(MAIN_REF) != tip {
            return Err(VaultError::Refused(
                "the vault was changed by a writer that did not take the lock; nothing was changed, try again".into(),
            ));
        }
        self.wal.append(record)?;
        self.log.unsynced = true;
        if self.key_state.commit != theirs.commit {
            // Replaced: pruned with the others (at once after an erasure).
            super::keys::note_garbage(&self.repo, self.key_state.commit);
        }
        self.key_state = theirs;
        if let Some(settings) = &self.key_state.settings {
            self.config = settings.clone();
        }
        self.verified_tip = None;
        if !ours_only.is_empty() || !stale_ids.is_empty() {
            // Keys this side holds that the remote's state lacks (a push
            // of the key state that did not arrive): kept. Keys it holds
            // that this side erased (a key state put back there, or pushed
            // by a machine that had not heard of the erasure): erased
            // again, as a merge would (an erasure on either side wins).
            let mut meta = self.new_meta("merge");
            meta.details = vec![format!("from remote {remote}")];
            if !ours_only.is_empty() {
                meta.details.push(format!(
                    "kept {} file keys this machine held",
                    ours_only.len()
                ));
            }
            if !stale_ids.is_empty() {
                meta.details.push(format!(
                    "erased again {} file keys this machine had erased",
                    stale_ids.len()
                ));
                meta.erased_keys = stale_ids
                    .iter()
                    .map(crate::crypto::FileKeyId::to_hex)
                    .collect();
            }
            let mut files: Vec<(crate::crypto::FileKeyId, Option<crate::crypto::FileKey>)> =
                ours_only.into_iter().map(|(id, k)| (id, Some(k))).collect();
            files.extend(stale_ids.into_iter().map(|id| (id, None)));
            self.publish_key_change(
                Some(their_main),
                crate::vault::KeyChange::files(files),
                meta,
            )?;
        }
        Ok(merge::Merged {
            what: "fast-forward",
            files,
            conflicts: Vec::new(),
            erased,
            stale,
            under_erased: Vec::new(),
            kept_over_expiry: Vec::new(),
            redacted: Vec::new(),
        })
    }

    /// The merge base of `ours` and `theirs`: the first commit, walking
    /// back from `ours`, that `theirs` reaches outside `new` (the commits
    /// the fetch brought).
    fn merge_base(
        &self,
        ours: Oid,
        theirs: Oid,
        new: &BTreeSet<Oid>,
    ) -> Result<Option<Oid>, VaultError> {
        // The commits of ours' side that theirs' new commits build on.
        let mut boundary = HashSet::new();
        if !new.contains(&theirs) {
            boundary.insert(theirs);
        }
        for &c in new {
            objects::check(&self.repo, c)?;
            for p in self.repo.find_commit(c)?.parent_ids() {
                if !new.contains(&p) {
                    boundary.insert(p);
                }
            }
        }
        let mut queue = VecDeque::from([ours]);
        let mut seen = HashSet::from([ours]);
        while let Some(id) = queue.pop_front() {
            if boundary.contains(&id) {
                return Ok(Some(id));
            }
            objects::check(&self.repo, id)?;
            for p in self.repo.find_commit(id)?.parent_ids() {
                if seen.insert(p) {
                    queue.push_back(p);
                }
            }
        }
        Ok(None)
    }
}

/// Make a working vault at `dir` (which must not exist, or be empty)
/// from the remote at `url`: fetch its two refs into a new vault built
/// beside `dir`, write them as one pack, open it (unlocked with `unlock`:
/// keyslots travel in the key state), verify all of it, and only then move
/// it into place with the remote as `origin`. On any failure nothing is
/// left behind.
/// Whether `url` names a memvault vault's own directory (which a clone
/// may read when its log is caught up, but no sync can push to).
pub fn names_a_vault_dir(url: &str) -> bool {
    git::absolute_url(url)
        .ok()
        .and_then(|u| git::local_dir(&u))
        .is_some_and(|d| git::is_vault_dir(&d))
}

pub fn clone_vault(
    url: &str,
    dir: &Path,
    unlock: &crate::crypto::Unlock<'_>,
    attribution: super::Attribution,
) -> Result<(Vault, PullReport), VaultError> {
    remotes::check_no_secret(url)?;
    let url = git::absolute_url(url)?;
    // (The target is checked there: no link, missing or empty.)
    let staging = super::open::Staging::new(dir, "clone")?;
    let (vault, report) = clone_into(&url, &staging.tmp, unlock, attribution.clone())?;
    drop(vault);
    staging.place(dir)?;
    let vault = Vault::open(dir, unlock, attribution)?;
    Ok((vault, report))
}

fn clone_into(
    url: &str,
    dir: &Path,
    unlock: &crate::crypto::Unlock<'_>,
    attribution: super::Attribution,
) -> Result<(Vault, PullReport), VaultError> {
    let name = "origin";
    let hostile = |what: &str| SyncError::Hostile {
        remote: name.to_string(),
        what: what.to_string(),
    };
    let repo = super::open::skeleton(dir)?;
    let scratch = git::Scratch::new(dir, false)?;
    let no_vault = || SyncError::Transport {
        remote: name.into(),
        detail: "it holds no memvault vault (no main branch and key state)".into(),
    };
    if !scratch.fetch(name, url, &[])? || scratch.incoming().keys.is_none() {
        return Err(no_vault().into());
    }
    let incoming = scratch.incoming();
    let (Some(main), Some(keys)) = (incoming.main, incoming.keys) else {
        return Err(hostile("its refs vanished during the fetch").into());
    };
    let tips: Vec<Oid> = [Some(main), Some(keys), incoming.access]
        .into_iter()
        .flatten()
        .collect();
    let ids = scratch.new_objects(name, &tips, &[], MAX_OBJECTS)?;
    let mut received = scratch.read_objects(name, &ids, MAX_BYTES)?;
    drop(scratch);
    // Each object was hashed as it was read: write them as one pack and
    // the two refs, then open (which checks the key state's MAC, the
    // tip's MAC and binding) and verify everything.
    let objects: Vec<&Object> = received.iter().collect();
    let pack_dir = dir.join("objects/pack");
    let written = pack::write_hashed(&pack_dir, &objects)?;
    // Written from hashed bytes, as a checkpoint's pack: not validated
    // whole again by the verify below.
    objects::trust_written_pack(&repo, &written);
    repo.reference(MAIN_REF, main, true, "memvault clone")?;
    repo.reference(KEYS_REF, keys, true, "memvault clone")?;
    drop(repo);
    super::fsx::make_private_tree(dir)?;
    super::sync_tree(dir)?;
    // What the remote sent must open as a vault: damage found here is the
    // remote's (a key state that is not one, refs swapped), not a local
    // vault's (there is none yet). A wrong key stays the user's error.
    let vault = Vault::open(dir, unlock, attribution).map_err(|e| match e {
        VaultError::Damaged(what) => {
            hostile(&format!("what it holds does not open as a vault: {what}")).into()
        }
        VaultError::RolledBack(_) => hostile("what it holds does not open as a vault").into(),
        e => e,
    })?;
    // The checks a pull makes of what it brings (open checked the key
    // state's and the tip's MACs): every key state the remote's chains
    // to, and every commit, MAC'd with this vault's key, each commit's
    // metadata opening. Every other object is bound to them by its hash,
    // checked as it was read. (A whole `verify`, which also decrypts
    // every name and file of every version, took 45% of a clone; the
    // first `verify` here does it.)
    super::keys::check_chain(&vault.repo, &vault.keys, keys)
        .map_err(|_| hostile("its key states were not written with this vault's key"))?;
    // Its main: a commit of this vault (MAC'd, its metadata opening, bound
    // to the key state), not any object the remote names.
    let mut vault = vault;
    let meta = (Some(main) != incoming.access
        && objects::find_commit(&vault.repo, main).is_ok()
        && verify_commit_mac(&vault.repo, &vault.keys, main))
    .then(|| vault.meta_of(main).ok())
    .flatten();
    let Some(meta) = meta else {
        return Err(hostile("its main is not a commit of this vault").into());
    };
    // A main of this vault that needs a newer key state than the one sent:
    // the key state was put back, which the remote's owner must repair.
    if let Ok((_, counter)) = read_header(&vault.repo, keys)
        && meta.keys.is_some_and(|k| k > counter)
    {
        return Err(SyncError::KeysBehind {
            remote: name.into(),
        }
        .into());
    }
    if vault.checked_tip().is_err() {
        return Err(hostile("its main is not a commit of this vault").into());
    }
    let mut chain = HashSet::new();
    let mut stack = vec![keys];
    while let Some(id) = stack.pop() {
        if chain.insert(id)
            && let Ok(c) = objects::find_commit(&vault.repo, id)
        {
            stack.extend(c.parent_ids());
        }
    }
    for o in received.iter().filter(|o| {
        o.kind == ObjectType::Commit && !chain.contains(&o.id) && Some(o.id) != incoming.access
    }) {
        if !verify_commit_mac(&vault.repo, &vault.keys, o.id) {
            return Err(hostile("a commit was not written with this vault's key").into());
        }
        vault
            .meta_of(o.id)
            .map_err(|_| hostile("a commit's metadata does not open"))?;
    }
    // The other machines' views, so that an expiry here before the first
    // pull spares what they read.
    let mut access_digest = None;
    if let Some(at) = incoming.access {
        let records = vault.take_access(name, at, &mut received)?;
        access_digest = Some(vault.merge_access_records(&records)?);
    }
    let (_, counter) = read_header(&vault.repo, keys)?;
    remotes::store(
        dir,
        &vault.keys,
        &[RemoteEntry {
            name: name.into(),
            url: url.into(),
            seen: Seen {
                main: Some(main.to_string()),
                keys: Some(keys.to_string()),
                counter,
                access: incoming.access.map(|a| a.to_string()),
                access_digest,
                prune_pending: false,
            },
        }],
    )?;
    // Commits on main: not the key states (the remote's and those it
    // chains to) nor the access table's.
    let key_states = chain;
    let commits = received
        .iter()
        .filter(|o| {
            o.kind == ObjectType::Commit
                && !key_states.contains(&o.id)
                && Some(o.id) != incoming.access
        })
        .count();
    Ok((
        vault,
        PullReport {
            remote: name.into(),
            outcome: "cloned".into(),
            commits,
            objects: received.len(),
            ..Default::default()
        },
    ))
}
