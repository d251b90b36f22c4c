//! The encrypted git vault: memvault's implementation of [`Store`].
//!
//! A vault is a directory holding a bare git repository plus a `memvault/`
//! folder for local state (format, writer lock, write-ahead log, caches).
//! The only user of `git2`.
//!
//! What it promises:
//! - every mutation is one commit on `refs/heads/main`, acknowledged only
//!   after its objects and ref moves, one record of the write-ahead log
//!   (see [`wal`]), are synced; libgit2 itself never syncs (see
//!   [`fsync`]): checkpoints move the log's objects into git, synced;
//! - names, content, commit metadata and settings are only ever written
//!   encrypted (see `crate::crypto` for the formats); there is no work
//!   tree and no index;
//! - every commit and key state carries a MAC, checked whenever a new tip
//!   is read, so a tip that was not written with the vault key is refused
//!   as damage; the key state may not be older than the tip requires (see
//!   [`keys`]), and the log's entries are tagged and chained;
//! - one writer at a time: mutations take the writer lock
//!   ([`FileLock`] on `memvault/lock`) and then re-read the tip; a
//!   mutation's record moves the refs (ref files follow at checkpoints)
//!   and is refused unless the log's tail is the tip it was built on;
//! - one publish path ([`Vault::publish`]): every commit on main, with the
//!   key-state change it needs, in one record;
//! - nothing inside the vault directory is followed through a symbolic
//!   link, and it is private to its owner (see [`fsx`]).
//!
//! Limitations: rolling both refs back together to an older, genuine pair
//! cannot be seen from the repository alone (see `verify`'s high-water
//! mark); the shape of trees and the sizes of blobs are visible.

mod audit;
pub(crate) mod bulk;
pub(crate) mod config;
pub(crate) mod engine;
mod error;
pub(crate) mod keys;
pub(crate) mod meta;
mod open;
mod publish;
mod retention;
mod rev;
pub(crate) mod slots;
pub(crate) mod sync;
#[cfg(test)]
mod tests;
mod tree;
mod treeedit;

// The rooms, by their short names for the code of this module.
#[cfg(feature = "cli")]
pub(crate) use audit::inspect;
pub(crate) use audit::{history, undo, verify};
pub(crate) use checkpoint::{checkpoint_locked, judge_refs, sync_tree};
pub use engine::fsync;
pub(crate) use engine::{MAIN_REF, checkpoint, fsx, gc, lock, objects, wal};
pub use error::{GitError, VaultError};
pub(crate) use error::{damaged, ge};
pub(crate) use fsx::{sync_dir, write_durable};
pub(crate) use lock::FileLock;
pub(crate) use publish::{stage_blob, write_commit};
pub use retention::clock;
pub(crate) use retention::{access, erase};

use std::collections::BTreeMap;
use std::fs::{self, File};
use std::path::{Path, PathBuf};

use git2::{Oid, Repository, RepositoryInitOptions};
use zeroize::Zeroizing;

use crate::crypto::{
    self, FileKey, FileKeyId, KdfParams, KeyFileKey, Keyring, Passphrase, Unlock, VaultKeys,
};
use crate::memory::{Change, Mutation, NodeKind, Outcome, Snapshot, Store, StoreError, ToolResult};
pub use access::Access;
pub use bulk::{DecryptedFile, ImportFile};
pub use config::VaultConfig;
pub use erase::{Expired, PurgeReport, SweepReport};
pub use gc::GcReport;
pub use history::{FileChange, RevisionStore, Walk};
pub(crate) use keys::KeyChange;
use keys::{KeyState, verify_commit_mac};
pub use meta::CommitMeta;
use meta::{META_VERSION, meta_aad};
pub use rev::{ParseRevError, Rev};
pub use slots::{NewSlot, RekeyReport, SlotEntry};
pub use sync::{
    Machine, PullReport, PushReport, RemoteEntry, RemoteState, Seen, SyncError, SyncReport,
    clone_vault, machine_info, names_a_vault_dir, set_machine_name, sync_without_prompts,
};
use tree::Caches;
pub use tree::VaultSnapshot;
use treeedit::TreeEdits;
pub use undo::{Conflict, UndoOutcome, UndoTarget};
pub use verify::{Problem, VerifyReport};
use wal::{Object, Record, Wal};

const STATE_DIR: &str = "memvault";
const FORMAT_FILE: &str = "memvault/format";
/// The vault format this memvault writes. 2: settings in the key state,
/// the key state's counter bound into main's commits, a v2 log. 3: every
/// directory's entries under three levels of bucket trees (see
/// `tree::buckets`). 4: commit metadata may name a principal (the
/// `memvault server` token a change was made with); nothing else changed,
/// so a vault of format 3 becomes format 4 by its format file alone, and
/// a memvault that knows format 3 only refuses it rather than failing on
/// the new field. 5: commit metadata may name the machine a change was
/// made on and a merge's merged commits (sync); again only the format file
/// changes. 6: a key state may name the states it replaced as parents
/// (`keys`: a chain, so a sync sends the changed shard, not the table);
/// older key states have none and stay as they are, so again only the
/// format file changes, and a memvault of format 5 refuses the vault
/// rather than dropping the chain in its `gc`. 7: a log record may carry
/// key-table shards that no key state holds yet (a create logs its shard
/// alone; see `KeyState::stage_deferred`), which a memvault of format 6
/// would not read, so it must refuse the vault; what git holds is as in
/// format 6. 8: while the log holds such shards, a commit on main names
/// the counter of the key state that will take them in, one past the
/// current one (see `KeyState::bound_counter`), which a memvault of format
/// 7 would take for a rolled-back key state; again only the format file
/// changes. 9: a directory's entries sit at any depth of its bucket trees,
/// each under the first of its bucket digits (a tree holds up to
/// `tree::FLAT_MAX` entries directly, then they move a level down; see
/// `tree::Caches::seek_in_dir`), where format 3 put every one at the full
/// depth, and new key states say `v5` (see `keys`). A memvault of format 8
/// would look for an entry at the full depth only and miss it, so it must
/// refuse the vault; trees of earlier formats read as they are, so only
/// the format file changes. A vault of format 1 to 8 is migrated when it
/// is first opened (see `migrate`).
pub(crate) const FORMAT: u32 = 9;
const FORMAT_PREFIX: &str = "memvault vault format ";
/// Format 1's plain settings file (read once, by the migration).
const CONFIG_FILE: &str = "memvault/config.json";
const LOCK_FILE: &str = "memvault/lock";
/// The number of files of the tip's tree a process left when it closed
/// (see `Vault::cached_file_count`).
const FILE_COUNT_FILE: &str = "memvault/file-count";

/// What the tag of `memvault/file-count` covers.
fn file_count_message(tree: &str, files: usize) -> Vec<u8> {
    format!("memvault file count v1\0{tree}\0{files}").into_bytes()
}
const LOG_DOWNGRADED: &str = "the write-ahead log (memvault/wal) has an untagged head of format 1, but the vault is of format 2: the log was replaced";

/// Who makes a mutation's log record durable before it is acknowledged.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
enum SyncBy {
    /// The handle, right after the mutation (outside the writer lock).
    #[default]
    Handle,
    /// The caller (`serve`'s group commit: [`Vault::take_pending_sync`]).
    Caller,
}

/// When a checkpoint that a mutation made due runs.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
enum CheckpointAt {
    /// Inside the mutation that filled the log.
    #[default]
    InMutation,
    /// In [`Store::after_reply`], once the reply is out (`serve`).
    AfterReply,
}

/// Where one handle's writes to the log stand.
#[derive(Debug, Default)]
struct LogState {
    sync: SyncBy,
    checkpoints: CheckpointAt,
    /// A record was appended and is not yet synced.
    unsynced: bool,
    /// The log passed its checkpoint size; the checkpoint waits for
    /// [`Store::after_reply`] (with [`CheckpointAt::AfterReply`]).
    checkpoint_due: bool,
    /// This handle appended since its last checkpoint, so it checkpoints
    /// when it closes (git alone then shows every commit).
    dirty: bool,
    /// The log size that makes a checkpoint due (None: the default).
    checkpoint_at: Option<u64>,
    /// The stamp of `Wal::pending_keys` the key state last took in.
    keys_seen: Option<u64>,
    /// The format file said 8 (the current format) when this handle opened
    /// the vault, after its migration: only then does a create log its
    /// shard alone (format 7), which a memvault of format 6 would not read,
    /// naming the next key state's counter (format 8), which one of format
    /// 7 would take for a rollback. (A migration stopped by damage leaves
    /// the file as it was, and this handle writes as that format did.)
    defer_keys: bool,
}

impl LogState {
    fn checkpoint_bytes(&self) -> u64 {
        self.checkpoint_at.unwrap_or(wal::CHECKPOINT_BYTES)
    }
}

/// The secret a vault is created with.
pub enum InitSecret {
    KeyFile(KeyFileKey),
    Passphrase(Passphrase, KdfParams),
}

/// Who is writing: stored in every commit's encrypted metadata.
#[derive(Debug, Clone)]
pub struct Attribution {
    pub session: String,
    pub actor: String,
}

/// An unlocked vault.
pub struct Vault {
    dir: PathBuf,
    repo: Repository,
    keys: VaultKeys,
    keyring: Keyring,
    key_state: KeyState,
    config: VaultConfig,
    /// The newest tip seen whose MAC checked out, with the key state it
    /// was checked against and that state's bound counter (see
    /// `check_binding`: the same state with its log's shards since taken
    /// in elsewhere binds less, so is checked again).
    verified_tip: Option<(Oid, Oid, u64)>,
    /// What `memvault/file-count` says, as this handle read or wrote it.
    file_count_saved: std::cell::Cell<Option<(Oid, usize)>>,
    /// This handle has read `memvault/file-count` (see
    /// `Vault::cached_file_count`).
    file_count_read: std::cell::Cell<bool>,
    /// The last main commit this handle wrote and its date (the clock's
    /// next value needs no read of it).
    tip_date: Option<(Oid, u64)>,
    attribution: Attribution,
    /// The authenticated principal recorded in every commit (`memvault
    /// server` sets it from the token; None elsewhere).
    principal: Option<String>,
    lock: std::sync::Arc<File>,
    caches: Caches,
    /// The write-ahead log (see [`wal`]).
    wal: Wal,
    /// Where this handle's log writes stand, and who syncs and
    /// checkpoints them.
    log: LogState,
    /// The name (hex id) of the keyslot this handle was unlocked with.
    unlocked_slot: Option<String>,
    /// The access log, held open for appends (see `retention::access`).
    access_log: std::cell::RefCell<Option<File>>,
    /// The size past which the access log is compacted (twice what the
    /// last compaction this handle saw left; see `access`).
    access_limit: std::cell::Cell<u64>,
    /// The access log's length just after this handle's last append (when
    /// it knew it), for the next check of its bound: one `fstat` fewer.
    access_len: std::cell::Cell<Option<u64>>,
    /// The tip [`refreshed_config`](Self::refreshed_config) just caught
    /// up to, for the read of the same request ([`Store::read`]): a
    /// request catches up with the log once (two 17-byte reads of its
    /// head and a look at the pack directory each time). Cleared by a
    /// write and after the reply.
    fresh_tip: Option<Option<Oid>>,
    /// For the write of the request that caught up to `fresh_tip`: where
    /// the log was when that catch-up found the ref files consistent. The
    /// write's own catch-up under the lock, finding the log still there,
    /// does not read the ref files again (one look per request).
    refs_hint: Option<engine::wal::LogPosition>,
    /// This machine, as every commit names it (`memvault/machine`, read
    /// or made at the first commit).
    machine: std::cell::OnceCell<Option<String>>,
    /// The object store's bytes as [`stored_bytes`](Self::stored_bytes)
    /// last measured them, and the pack directory's state then.
    stored: std::cell::Cell<Option<(StoreStamp, u64)>>,
    /// The most this vault may store ([`Vault::set_quota`]), and why the
    /// last write was refused for it, until taken.
    quota: Option<u64>,
    quota_refused: Option<QuotaRefusal>,
}

/// Where the pack directory stood (modified time, inode, change time):
/// packs come and go only by names added or removed there.
type StoreStamp = (Option<std::time::SystemTime>, u64, i64, i64);

/// The number of files in one tree (see [`Vault::known_file_count`]).
#[derive(Debug, Clone, Copy)]
pub struct FileCount {
    tree: Oid,
    files: usize,
}

/// The signature of a commit of format 6: `m <m>`, its date a generation
/// number (see `publish::write_commit`), no time zone. (Format 5 and
/// earlier: `memvault <memvault>`, date 0; the shorter name keeps a
/// mutation's two commits 56 bytes smaller.)
#[cfg(test)]
pub(crate) fn generation_signature(
    generation: i64,
) -> Result<git2::Signature<'static>, git2::Error> {
    git2::Signature::new("m", "m", &git2::Time::new(generation, 0))
}

/// Milliseconds since the Unix epoch, by the clock in use (the system's,
/// or one injected with [`clock::set`]; see [`clock`]).
pub fn now_ms() -> u64 {
    clock::now_ms()
}

fn slot_name(bytes: &[u8]) -> Result<String, VaultError> {
    let info = crypto::slot_info(bytes).map_err(|_| damaged("a keyslot does not parse"))?;
    Ok(data_encoding::HEXLOWER.encode(&info.id))
}

impl Vault {
    /// The vault's directory.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// The vault's settings.
    pub fn config(&self) -> &VaultConfig {
        &self.config
    }

    /// The unlocked keyring (for key management).
    pub fn keyring(&self) -> &Keyring {
        &self.keyring
    }

    /// The derived keys.
    pub fn keys(&self) -> &VaultKeys {
        &self.keys
    }

    /// Who the next commits are attributed to.
    pub fn set_attribution(&mut self, attribution: Attribution) {
        self.attribution = attribution;
    }

    pub fn attribution(&self) -> &Attribution {
        &self.attribution
    }

    /// Record `principal` in the metadata of every commit this handle
    /// makes from now on (None: no principal).
    pub fn set_principal(&mut self, principal: Option<String>) {
        self.principal = principal;
    }

    /// The current tip of `refs/heads/main`, MAC-checked, with the key
    /// state followed to it (and the log's shards taken in, format 7), so
    /// a snapshot of it reads every file.
    pub fn tip(&mut self) -> Result<Option<Rev>, VaultError> {
        Ok(self.refresh()?.map(Rev::from_oid))
    }

    /// [`tip`](Self::tip), as git's id.
    pub(crate) fn checked_tip(&mut self) -> Result<Option<Oid>, VaultError> {
        objects::new_request(&self.repo);
        let Some(tip) = self.wal.ref_target(&self.repo, MAIN_REF)? else {
            return Ok(None);
        };
        let pair = (tip, self.key_state.commit, self.key_state.bound_counter());
        if self.verified_tip != Some(pair) {
            objects::check(&self.repo, tip)?;
            if !verify_commit_mac(&self.repo, &self.keys, tip) {
                return Err(damaged(
                    "the newest commit was not written with this vault's key",
                ));
            }
            self.check_binding(tip)?;
            self.verified_tip = Some(pair);
        }
        Ok(Some(tip))
    }

    fn refresh(&mut self) -> Result<Option<Oid>, VaultError> {
        self.refresh_from(false)
    }

    /// [`refresh`](Self::refresh); `caught_up`: the caller holds the writer
    /// lock and has just caught up with the log and found the ref files
    /// consistent ([`recover_if_needed`](Self::recover_if_needed)), so the
    /// first round does not read them again.
    fn refresh_from(&mut self, mut caught_up: bool) -> Result<Option<Oid>, VaultError> {
        // Objects of other processes' mutations are in the log until a
        // checkpoint: load any new ones before following the refs. A writer
        // appends its record before moving the refs, so a ref that names an
        // object we lack means a newer record: catch up again and retry.
        let mut attempt = 0;
        loop {
            if !std::mem::take(&mut caught_up) {
                self.wal.catch_up(&self.repo)?;
                if self.key_state.format >= 2 && self.wal.head_is_v1() == Some(true) {
                    return Err(damaged(LOG_DOWNGRADED));
                }
                // A ref file changed outside memvault under a running
                // process: judged as the next writer's checkpoint judges
                // it, so a read does not answer from a state the log has
                // moved past (main set back behind the log's records)
                // while writes are refused.
                if !self.wal.refs_consistent(&self.repo) {
                    judge_refs(&self.repo, &self.wal)?;
                }
            }
            match self.refresh_keys().and_then(|()| self.checked_tip()) {
                Err(
                    VaultError::Damaged(_)
                    | VaultError::Object(_)
                    | VaultError::RolledBack(_)
                    | VaultError::DamagedLog(_),
                ) if attempt < 3 => attempt += 1,
                // Following the refs caught up past shards the key state
                // has not taken in (a checkpoint and a create in between):
                // take them in, or the new file's key would read as missing.
                Ok(_) if attempt < 3 && self.log.keys_seen != Some(self.wal.pending_keys().1) => {
                    attempt += 1
                }
                other => return other,
            }
        }
    }

    /// Where `refs/memvault/keys` points now (see [`Wal::ref_target`]).
    pub(crate) fn keys_target(&mut self) -> Result<Option<Oid>, VaultError> {
        Ok(self.wal.ref_target(&self.repo, keys::KEYS_REF)?)
    }

    /// The bytes this vault keeps for its content and history: its git
    /// object store (packs, their indexes, any loose object) and its log's
    /// records (not the zeros ahead of them). The object store is measured
    /// again when its pack directory changed (a checkpoint, `gc`, a sync),
    /// else taken from the last measurement. What a tenant's storage quota
    /// is counted in (`memvault tenant quota`).
    pub fn stored_bytes(&self) -> u64 {
        use std::os::unix::fs::MetadataExt;
        let objects = self.repo.path().join("objects");
        let stamp = std::fs::metadata(objects.join("pack"))
            .ok()
            .map(|m| (m.modified().ok(), m.ino(), m.ctime(), m.ctime_nsec()));
        let measured = match (stamp, self.stored.get()) {
            (Some(now), Some((then, bytes))) if now == then => bytes,
            _ => {
                let bytes = gc::dir_bytes(&objects);
                if let Some(now) = stamp {
                    self.stored.set(Some((now, bytes)));
                }
                bytes
            }
        };
        measured + self.wal.len().unwrap_or(0)
    }

    /// Refuse, from now on, a write that would take what this vault stores
    /// ([`Vault::stored_bytes`]) past `quota` bytes (a server's per-tenant
    /// quota): it is checked once the command has been checked and its
    /// new blobs and trees are sealed, against their sizes and those of
    /// the paths its commit names, so a command that changes nothing or
    /// is refused for its own reasons answers as without a quota. Deletes
    /// are never refused. What a write adds beyond that (the rest of its
    /// commit, its key record: under 1 KiB) can take the vault past the
    /// quota by that much; the next is refused.
    pub fn set_quota(&mut self, quota: Option<u64>) {
        self.quota = quota;
    }

    /// Why the last write was refused for the quota, if it was (cleared).
    pub fn take_quota_refusal(&mut self) -> Option<QuotaRefusal> {
        self.quota_refused.take()
    }

    /// The number of files at the tip, if this handle has counted them
    /// (a write that may create a file does): with its tree's id, for
    /// [`Vault::seed_file_count`] on a later handle of the same vault.
    pub fn known_file_count(&self) -> Option<FileCount> {
        let tip = self.wal.tail_target(MAIN_REF)?;
        let tree = match *self.caches.commit_tree.borrow() {
            Some((commit, tree)) if commit == tip => tree,
            _ => {
                objects::check(&self.repo, tip).ok()?;
                self.repo.find_commit(tip).ok()?.tree_id()
            }
        };
        let files = self.caches.count_of(tree)?;
        Some(FileCount { tree, files })
    }

    /// The number of files of `tree`: known in this process, or as
    /// `memvault/file-count` says, if it names that tree and its tag
    /// checks out (then remembered). A tree's id names its content, so a
    /// count written for a tree is right for it whoever reads it; a line
    /// replayed from an older file names an older tree and is not used,
    /// one altered or torn fails its tag and is ignored (the caller walks).
    pub(crate) fn cached_file_count(&self, tree: Oid) -> Option<usize> {
        if let Some(n) = self.caches.count_of(tree) {
            return Some(n);
        }
        // Read once per handle: a count this handle does not have yet is
        // then walked (and carried from there), not asked of the file at
        // every mutation.
        if self.file_count_read.replace(true) {
            return None;
        }
        // A line is about 130 bytes: a larger file is not read whole.
        let mut text = String::new();
        std::io::Read::read_to_string(
            &mut std::io::Read::take(fsx::open_read(&self.dir.join(FILE_COUNT_FILE)).ok()?, 256),
            &mut text,
        )
        .ok()?;
        let [version, named, files, tag] = text.split_whitespace().collect::<Vec<_>>()[..] else {
            return None;
        };
        if version != "v1" || named != tree.to_string() {
            return None;
        }
        let files: usize = files.parse().ok()?;
        let tag = data_encoding::HEXLOWER.decode(tag.as_bytes()).ok()?;
        if !self
            .keys
            .verify_mac(&file_count_message(named, files), &tag)
        {
            return None;
        }
        self.caches.remember_count(tree, files);
        self.file_count_saved.set(Some((tree, files)));
        Some(files)
    }

    /// Leave the tip's file count in `memvault/file-count`, if this handle
    /// knows it, for the next process's first create (whose limit check
    /// would otherwise walk every tree: 90 ms at 20,000 files). A cache:
    /// written without a sync, replaced whole by a rename.
    fn save_file_count(&self) {
        let Some(FileCount { tree, files }) = self.known_file_count() else {
            return;
        };
        if self.file_count_saved.get() == Some((tree, files)) {
            return; // what the file says already
        }
        // Not into a folder a link was put in place of while this ran.
        if fsx::check_vault(&self.dir).is_err() {
            return;
        }
        let named = tree.to_string();
        let tag =
            data_encoding::HEXLOWER.encode(&self.keys.mac(&file_count_message(&named, files)));
        let path = self.dir.join(FILE_COUNT_FILE);
        // Its own name: two processes closing at once do not share one.
        let tmp = path.with_extension(format!("{}.tmp", std::process::id()));
        let _ = std::fs::remove_file(&tmp);
        let written = fsx::create_new(&tmp, fsx::FILE_MODE).and_then(|mut f| {
            std::io::Write::write_all(&mut f, format!("v1 {named} {files} {tag}\n").as_bytes())
        });
        if written.is_err() || std::fs::rename(&tmp, &path).is_err() {
            let _ = std::fs::remove_file(&tmp);
        } else {
            self.file_count_saved.set(Some((tree, files)));
        }
    }

    /// Take a count an earlier handle made ([`Vault::known_file_count`]):
    /// a tree's id names its content, so the count holds for that tree
    /// whoever reads it; a tree that has changed since is counted again.
    pub fn seed_file_count(&self, count: FileCount) {
        self.caches.remember_count(count.tree, count.files);
    }

    /// The root tree of `commit` (None: the empty tree), checked readable
    /// as a tree: through the tree cache, which holds the trees this
    /// handle wrote or read, so a write's next request reads nothing.
    pub(crate) fn tree_of(&self, commit: Option<Oid>) -> Result<Option<Oid>, VaultError> {
        let Some(c) = commit else {
            return Ok(None);
        };
        let cached = *self.caches.commit_tree.borrow();
        let tree_id = match cached {
            Some((commit, tree)) if commit == c => tree,
            _ => {
                objects::check(&self.repo, c)?;
                let commit = self
                    .repo
                    .find_commit(c)
                    .map_err(|_| damaged("a commit is unreadable"))?;
                let tree = commit.tree_id();
                *self.caches.commit_tree.borrow_mut() = Some((c, tree));
                tree
            }
        };
        // The pack directory is looked at even when the tree is cached
        // (once per request), so a pack planted meanwhile is refused; a
        // tree not cached is checked as it is read (not read twice).
        objects::look_at_packs(&self.repo)?;
        self.caches
            .tree_entries(&self.repo, tree_id)
            .map_err(|_| damaged("a tree is unreadable"))?;
        Ok(Some(tree_id))
    }

    /// [`tree_of`](Self::tree_of), as libgit2's tree (for its diffs).
    pub(crate) fn git_tree_of(
        &self,
        commit: Option<Oid>,
    ) -> Result<Option<git2::Tree<'_>>, VaultError> {
        let Some(id) = self.tree_of(commit)? else {
            return Ok(None);
        };
        Ok(Some(
            objects::find_tree(&self.repo, id).map_err(|_| damaged("a tree is unreadable"))?,
        ))
    }

    /// A snapshot of the tree at `rev` (None: the empty tree).
    pub fn snapshot_at(&self, rev: Option<Rev>) -> Result<VaultSnapshot<'_>, VaultError> {
        self.snapshot_of(rev.map(Rev::oid))
    }

    /// [`snapshot_at`](Self::snapshot_at) by git's id.
    pub(crate) fn snapshot_of(&self, commit: Option<Oid>) -> Result<VaultSnapshot<'_>, VaultError> {
        objects::new_request(&self.repo);
        Ok(VaultSnapshot::new(
            &self.repo,
            &self.keys,
            &self.key_state,
            &self.caches,
            self.tree_of(commit)?,
        ))
    }

    /// Decrypt the metadata of one commit on main (after checking its MAC).
    pub fn commit_meta(&self, rev: Rev) -> Result<CommitMeta, VaultError> {
        self.meta_of(rev.oid())
    }

    /// [`commit_meta`](Self::commit_meta) by git's id.
    pub(crate) fn meta_of(&self, id: Oid) -> Result<CommitMeta, VaultError> {
        objects::check(&self.repo, id)?;
        if !verify_commit_mac(&self.repo, &self.keys, id) {
            return Err(damaged("a commit was not written with this vault's key"));
        }
        let commit = self
            .repo
            .find_commit(id)
            .map_err(|_| damaged("a commit is unreadable"))?;
        let sealed = data_encoding::BASE64
            .decode(commit.message_bytes().trim_ascii())
            .map_err(|_| damaged("commit metadata does not decode"))?;
        let aad = meta_aad(commit.tree_id(), commit.parent_ids().next());
        let plain = self
            .keys
            .open_meta(&aad, &sealed)
            .map_err(|_| damaged("commit metadata failed to decrypt"))?;
        meta::decode(&plain).ok_or_else(|| damaged("commit metadata does not parse"))
    }

    /// Every commit on main, newest first, with its metadata (all of it
    /// at once; [`walk`](Self::walk) reads lazily).
    pub fn history(&mut self) -> Result<Vec<(Rev, CommitMeta)>, VaultError> {
        let Some(tip) = self.checked_tip()? else {
            return Ok(Vec::new());
        };
        let mut out = Vec::new();
        let mut next = Some(tip);
        while let Some(id) = next {
            let meta = self.meta_of(id)?;
            let commit = self
                .repo
                .find_commit(id)
                .map_err(|_| damaged("a commit is unreadable"))?;
            next = commit.parent_ids().next();
            out.push((Rev::from_oid(id), meta));
        }
        Ok(out)
    }

    /// Run `f` holding the writer lock, with the current (MAC-checked) tip.
    /// Every mutation of the vault goes through here.
    pub(crate) fn with_writer_lock<T, E: From<VaultError>>(
        &mut self,
        f: impl FnOnce(&mut Vault, Option<Oid>) -> Result<T, E>,
    ) -> Result<T, E> {
        // Taken now, so that a hint is used by this write or by none.
        let mut hint = self.refs_hint.take();
        let guard = match FileLock::try_exclusive_on(&self.lock).map_err(VaultError::Lock)? {
            Some(guard) => guard,
            None => {
                // A wait of any length, during which the ref files may be
                // changed with the log left as it was: looked at again.
                hint = None;
                FileLock::exclusive_on(&self.lock).map_err(VaultError::Lock)?
            }
        };
        self.refs_hint = hint;
        let len_before = self.wal.len().unwrap_or(0);
        let result = self
            .recover_if_needed()
            .and_then(|settled| {
                let tip = self.refresh_from(settled)?;
                // An erasure a crash interrupted is finished before anything else.
                if self.dir.join(erase::MARKER).exists() {
                    self.finish_pending_erasure(tip)?;
                }
                Ok(tip)
            })
            .map_err(E::from)
            .and_then(|tip| f(self, tip));
        if self.wal.len().unwrap_or(0) != len_before {
            self.log.dirty = true;
        }
        drop(guard);
        // Group commit: the record was appended and the refs moved under
        // the lock; its sync runs outside it, so the syncs of concurrent
        // writers overlap. Nothing is acknowledged before its own sync.
        if self.log.sync == SyncBy::Handle && std::mem::take(&mut self.log.unsynced) {
            self.wal.sync().map_err(VaultError::NotDurable)?;
        }
        if result.is_ok() && self.wal.len().unwrap_or(0) > self.log.checkpoint_bytes() {
            if self.log.checkpoints == CheckpointAt::AfterReply {
                self.log.checkpoint_due = true;
            } else {
                // The mutation is durable in the log: a checkpoint that
                // fails now (a disk with room for a record but not for a
                // pack) must not answer it as failed, or a caller that
                // tries again applies it twice. The next mutation, or the
                // close, tries again.
                self.checkpoint_or_warn();
            }
        }
        result
    }

    /// Checkpoint; a failure is said on stderr (its kind only: libgit2's
    /// messages can name a path) and changes nothing: the log still holds
    /// every record, and the next mutation past the log's bound, or the
    /// close, tries again.
    fn checkpoint_or_warn(&mut self) {
        if let Err(e) = self.checkpoint() {
            let why = match &e {
                VaultError::Git(_) => "a git error".to_string(),
                VaultError::Io(io) => io.kind().to_string(),
                other => other.to_string(),
            };
            eprintln!("memvault: checkpoint failed ({why}); it will be retried");
        }
    }

    /// Leave the `fdatasync` of each mutation's log record to the caller,
    /// so one sync can cover the records of several mutations (`serve`'s
    /// group commit). The caller must make a mutation durable, with
    /// [`take_pending_sync`](Self::take_pending_sync) and
    /// [`log_sync_handle`](Self::log_sync_handle), before it reports it.
    pub fn defer_sync(&mut self, on: bool) {
        self.log.sync = if on { SyncBy::Caller } else { SyncBy::Handle };
    }

    /// Whether a mutation appended a log record that still needs its sync
    /// (with [`defer_sync`](Self::defer_sync) on), clearing the mark: the
    /// caller then makes it durable itself, e.g. with
    /// [`log_sync_handle`](Self::log_sync_handle).
    pub fn take_pending_sync(&mut self) -> bool {
        std::mem::take(&mut self.log.unsynced)
    }

    /// A handle on the write-ahead log file for syncing it outside this
    /// `Vault` (one `fdatasync` covers every record written before it).
    pub fn log_sync_handle(&self) -> std::io::Result<File> {
        self.wal.sync_handle()
    }

    /// Checkpoint once the log holds this many bytes rather than
    /// [`wal::CHECKPOINT_BYTES`]: the objects written since the last
    /// checkpoint are held in memory until it, so a process that keeps
    /// many vaults open (`memvault server`) bounds each one's share.
    pub fn set_checkpoint_bytes(&mut self, bytes: u64) {
        self.log.checkpoint_at = Some(bytes.max(64 << 10));
    }

    /// Whether a mutation made a checkpoint due that waits for
    /// [`Store::after_reply`] (with [`defer_checkpoints`](Self::defer_checkpoints)).
    pub fn checkpoint_due(&self) -> bool {
        self.log.checkpoint_due
    }

    /// End a request run on this vault: its read's caught-up tip is
    /// forgotten (as [`Store::after_reply`] does), and whether
    /// [`Store::after_reply`] has work to do (a view's access record, a
    /// checkpoint). A process serving several clients looks at this
    /// rather than take the vault after every reply only to find nothing
    /// to do: that waited for another client's whole request.
    pub fn end_request(&mut self) -> bool {
        self.fresh_tip = None;
        self.log.checkpoint_due
    }

    /// Defer the checkpoint a mutation makes due to [`Store::after_reply`],
    /// so it does not add to that mutation's latency (`serve` does this;
    /// the mutation is durable in the log either way).
    pub fn defer_checkpoints(&mut self, on: bool) {
        self.log.checkpoints = if on {
            CheckpointAt::AfterReply
        } else {
            CheckpointAt::InMutation
        };
    }

    /// Whether no other handle holds the writer lock exclusively now (an
    /// operator's command beside a server, a sweep): a request would then
    /// not wait for it. A moment's look, true if this handle holds a lock
    /// itself (the look must not let go of it).
    pub fn writer_lock_free(&self) -> bool {
        match self.lock.try_lock_shared() {
            Ok(()) => {
                let _ = self.lock.unlock();
                true
            }
            Err(_) => false,
        }
    }

    /// Whether another process holds the writer lock of the vault in `dir`
    /// exclusively now, without opening the vault (a moment's look; a lock
    /// file that cannot be opened as one is for [`Vault::open`] to judge).
    pub fn locked_elsewhere(dir: &Path) -> bool {
        fsx::open_read(&dir.join(LOCK_FILE))
            .is_ok_and(|f| matches!(f.try_lock_shared(), Err(std::fs::TryLockError::WouldBlock)))
    }

    /// Under the writer lock: check that the log's tail is what the refs
    /// say (a writer that died between its log record and its ref moves
    /// leaves them apart) and recover if not. True: caught up, and nothing
    /// needed recovering.
    fn recover_if_needed(&mut self) -> Result<bool, VaultError> {
        let hint = self.refs_hint.take();
        let c = self.wal.catch_up(&self.repo)?;
        if self.wal.head_is_v1() == Some(true) && self.key_state.format >= 2 {
            return Err(damaged(LOG_DOWNGRADED));
        }
        let refs_seen_here = hint.is_some() && hint == self.wal.position();
        if !c.clean
            || self.wal.head_is_v1() == Some(true)
            || !(refs_seen_here || self.wal.refs_consistent(&self.repo))
        {
            if !self.main_macs_hold() {
                // Not over a main this key state did not MAC: the
                // command reports the damage, having changed nothing.
                judge_refs(&self.repo, &self.wal)?;
                return Err(damaged(
                    "the newest commit was not written with this vault's key",
                ));
            }
            self.checkpoint_locked()?;
            return Ok(false);
        }
        Ok(true)
    }

    /// Close without the checkpoint a clean close makes (nothing is lost:
    /// the log stays, and the next open replays it). For a vault about to
    /// be erased, a server's removed tenant's, whose directory may be
    /// moved away at any moment: libgit2 would make its ref folders again
    /// at the old place.
    pub fn abandon(mut self) {
        self.log.dirty = false;
    }

    /// Make everything in the log durable in git (one pack, refs synced)
    /// and start the log over. Takes the writer lock.
    pub fn checkpoint(&mut self) -> Result<(), VaultError> {
        let _guard = FileLock::exclusive_on(&self.lock).map_err(VaultError::Lock)?;
        self.checkpoint_locked()?;
        self.log.dirty = false;
        Ok(())
    }

    /// The checkpoint, under the writer lock: first, if the log holds
    /// key-table shards no key state holds yet (format 7), a new key state
    /// that takes them in ([`fold_keys`](Self::fold_keys)), so that git
    /// alone holds every key of every file.
    pub(crate) fn checkpoint_locked(&mut self) -> Result<(), VaultError> {
        // The ref files and packs are written here: not through a link or
        // into a config put in place since the vault was opened (the log
        // keeps every record meanwhile).
        fsx::check_vault(&self.dir)?;
        // A full disk, as the first write of a checkpoint meets it.
        #[cfg(feature = "test-hooks")]
        if std::env::var("MEMVAULT_TEST_DISK_FULL").is_ok_and(|p| p == "checkpoint") {
            return Err(VaultError::Io(std::io::ErrorKind::StorageFull.into()));
        }
        self.wal.catch_up(&self.repo)?;
        if !self.wal.pending_keys().0.is_empty() {
            // On the log's key state, which the checkpoint then writes to
            // the ref file (and which judges a ref file changed outside
            // memvault, refusing as before).
            let at = self.wal.tail_target(engine::KEYS_REF);
            self.refresh_keys_at(at)?;
            self.fold_keys()?;
        }
        checkpoint_locked(&self.repo, &mut self.wal)
    }

    /// At open, under the writer lock: a key state that takes in the
    /// shards the log holds, if any (see [`checkpoint_locked`](Self::checkpoint_locked)).
    pub(crate) fn fold_at_open(&mut self) -> Result<(), VaultError> {
        self.wal.catch_up(&self.repo)?;
        if self.wal.pending_keys().0.is_empty() {
            return Ok(());
        }
        let at = self.wal.tail_target(engine::KEYS_REF);
        self.refresh_keys_at(at)?;
        self.fold_keys()
    }

    /// Follow the key state to where its ref points now (another process
    /// may have replaced it), with the shards the log's records replaced
    /// since ([`KeyState::apply_pending`]); the caller has caught up.
    pub(crate) fn refresh_keys(&mut self) -> Result<(), VaultError> {
        let at = self.keys_target()?;
        self.refresh_keys_at(at)
    }

    fn refresh_keys_at(&mut self, at: Option<Oid>) -> Result<(), VaultError> {
        let before = self.key_state.commit;
        self.key_state.refresh(&self.repo, &self.keys, at)?;
        let (pending, stamp) = self.wal.pending_keys();
        if before != self.key_state.commit || self.log.keys_seen != Some(stamp) {
            self.key_state.apply_pending(pending);
            self.log.keys_seen = Some(stamp);
        }
        // Settings changed by another process (`config set`) hold here
        // from now on: its limits at once, the memory tool's own settings
        // (redaction, view size) where the caller rebuilds it (see
        // `refreshed_config`).
        if before != self.key_state.commit
            && let Some(settings) = &self.key_state.settings
            && *settings != self.config
        {
            self.config = settings.clone();
        }
        Ok(())
    }

    /// The settings as they are now: the vault caught up with other
    /// processes first (a `serve` that runs other processes' requests
    /// uses them for each request, not those it started with).
    pub fn refreshed_config(&mut self) -> Result<&VaultConfig, VaultError> {
        let tip = self.refresh()?;
        self.fresh_tip = Some(tip);
        Ok(&self.config)
    }
}

impl Vault {
    /// Checkpoint, then repack everything reachable into one pack and
    /// delete every other pack and loose object. Takes the writer lock.
    pub fn gc(&mut self) -> Result<GcReport, VaultError> {
        let _guard = FileLock::exclusive_on(&self.lock).map_err(VaultError::Lock)?;
        // Only a vault whose tip checks out: gc deletes what main and the
        // key state do not reach, so with a ref rolled back (or a damaged
        // tip) it would delete the newer state for good. Main is checked
        // against `verify`'s last verified head too (a main moved back to
        // an ancestor with the log emptied binds as well as the newer).
        let tip = self.refresh()?;
        if let Some(tip) = tip {
            self.check_not_behind_verified(tip)?;
        }
        // Every pack is read whole before anything is written: a damaged
        // one refuses the gc with nothing changed, the log included (its
        // records may be the only other copy of what the pack lost, and
        // the scrub below would clear them).
        objects::check_packs(&self.repo)?;
        // An erasure cut short (its marker left) is finished first, as
        // the next writer would: its prune and the marker's removal.
        self.finish_pending_erasure(tip)?;
        self.checkpoint_locked()?;
        // Earlier records' bytes (replaced key tables and keyslots among
        // them) leave the preallocated log file, as they leave git.
        self.wal.scrub()?;
        self.log.dirty = false;
        gc::repack_locked(&self.repo)
    }
}

/// A write refused by [`Vault::set_quota`]'s quota.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct QuotaRefusal {
    /// What the vault stores.
    pub stored: u64,
    /// What the write would have added (its new blobs and trees, the
    /// paths its commit names).
    pub adds: u64,
    pub quota: u64,
}

impl std::fmt::Display for QuotaRefusal {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "this memory is at its storage quota ({} of {} bytes stored, history included; this change would add {} more); nothing was changed: deleting files does not free the space, the operator can raise the quota (`memvault tenant quota`) or free space (purge, expire, then gc)",
            self.stored, self.quota, self.adds
        )
    }
}

impl Drop for Vault {
    /// A clean close checkpoints what this process logged, so that git
    /// alone (without the log) shows every commit.
    fn drop(&mut self) {
        if self.log.dirty {
            let _ = self.checkpoint();
        }
        self.save_file_count();
        // Its in-memory object store goes with it, and the open pack
        // files of what was checked.
        fsync::forget_odb(&self.repo);
        objects::forget(self.repo.path());
    }
}

impl Store for Vault {
    fn read(
        &mut self,
        f: &mut dyn FnMut(&dyn Snapshot) -> Result<ToolResult, StoreError>,
    ) -> Result<ToolResult, StoreError> {
        let tip = match self.fresh_tip.take() {
            Some(tip) => tip,
            None => self.refresh()?,
        };
        let snap = self.snapshot_of(tip)?;
        f(&snap)
    }

    fn write(
        &mut self,
        f: &mut dyn FnMut(&dyn Snapshot) -> Result<Outcome, StoreError>,
    ) -> Result<ToolResult, StoreError> {
        self.refs_hint = self.fresh_tip.take().and_then(|_| self.wal.refs_ok_at());
        self.with_writer_lock(|vault, tip| {
            let outcome = {
                let snap = vault.snapshot_of(tip)?;
                f(&snap)?
            };
            if let Some(m) = outcome.mutation {
                vault.apply(tip, m)?;
            }
            Ok(outcome.result)
        })
    }

    fn after_reply(&mut self) {
        self.fresh_tip = None;
        if std::mem::take(&mut self.log.checkpoint_due) {
            self.checkpoint_or_warn();
        }
    }

    fn note_viewed(&mut self, path: &crate::memory::MemoryPath) {
        let last = self.caches.last_read.borrow_mut().take();
        if let Some((p, id)) = last
            && p == path.as_str()
        {
            // Before the reply: a view answered is recorded, even if the
            // process is killed right after (a sweep must not count a file
            // just read as idle).
            self.record_access(&[(id, access::Kind::Viewed, now_ms())]);
        }
    }
}
