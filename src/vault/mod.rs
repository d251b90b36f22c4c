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

pub(crate) mod access;
pub(crate) mod bulk;
pub mod clock;
pub(crate) mod config;
pub(crate) mod erase;
pub(crate) mod fsx;
pub mod fsync;
mod gc;
pub(crate) mod history;
mod index;
pub(crate) mod inspect;
pub(crate) mod keys;
pub(crate) mod meta;
mod objects;
mod pack;
mod rev;
pub(crate) mod slots;
#[cfg(test)]
mod tests;
mod tree;
mod treeedit;
pub(crate) mod undo;
pub(crate) mod verify;
mod wal;

use std::collections::BTreeMap;
use std::fs::{self, File};
use std::path::{Path, PathBuf};

use git2::{ErrorCode, Oid, Repository, RepositoryInitOptions, Signature};
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
use keys::{KeyState, verify_commit_mac, write_signed_commit};
pub use meta::CommitMeta;
use meta::{META_VERSION, meta_aad};
pub use rev::{ParseRevError, Rev};
pub use slots::{NewSlot, RekeyReport, SlotEntry};
use tree::Caches;
pub use tree::VaultSnapshot;
use treeedit::TreeEdits;
pub use undo::{Conflict, UndoOutcome, UndoTarget};
pub use verify::{Problem, VerifyReport};
use wal::{Object, Record, Refs, Wal};

/// The branch that holds the memory history.
pub(crate) const MAIN_REF: &str = "refs/heads/main";
const STATE_DIR: &str = "memvault";
const FORMAT_FILE: &str = "memvault/format";
/// The vault format this memvault writes. 2: settings in the key state,
/// the key state's counter bound into main's commits, a v2 log. A vault
/// of format 1 is migrated when it is first opened (see `migrate`).
pub(crate) const FORMAT: u32 = 2;
const FORMAT_PREFIX: &str = "memvault vault format ";
/// Format 1's plain settings file (read once, by the migration).
const CONFIG_FILE: &str = "memvault/config.json";
const LOCK_FILE: &str = "memvault/lock";
const LOG_DOWNGRADED: &str = "the write-ahead log (memvault/wal) has an untagged head of format 1, but the vault is of format 2: the log was replaced";

/// Why a vault could not be created, opened or written.
#[derive(Debug, thiserror::Error)]
pub enum VaultError {
    #[error("no vault at {0}: create one with `memvault init`")]
    NotFound(PathBuf),
    #[error("{0} exists and is not an empty directory; choose a new location for the vault")]
    NotEmpty(PathBuf),
    #[error("{0} is not a memvault vault (no memvault/format file)")]
    NotAVault(PathBuf),
    #[error("the passphrase or key file does not unlock this vault")]
    WrongSecret,
    #[error("this vault has no keyslot of that kind (passphrase or key file)")]
    NoSlotOfKind,
    #[error("the vault's key derivation parameters exceed the allowed maximum; refusing to derive")]
    ExcessiveWork,
    /// Stored bytes failed a check; the text says which part (it never
    /// carries content, a path or a key).
    #[error("the vault is damaged: {0}")]
    Damaged(&'static str),
    /// A stored object or pack failed its check before libgit2 read it
    /// (see [`objects`]).
    #[error("the vault is damaged: {0}")]
    Object(objects::ObjectError),
    /// A ref was set back to an older state than this vault has reached
    /// (refused: it would bring back erased keys or removed keyslots).
    #[error("the vault is damaged: {0}")]
    RolledBack(&'static str),
    #[error(
        "{0:?} is not a revision on this vault's main branch (give a commit id from `memvault history`, or HEAD~N)"
    )]
    BadRevision(String),
    #[error("{0}")]
    Refused(String),
    #[error("invalid vault settings: {0}")]
    Config(&'static str),
    #[error(
        "this vault has format {0}, newer than this memvault understands (up to {FORMAT}): upgrade memvault"
    )]
    NewerFormat(u32),
    #[error("cannot take the writer lock (memvault/lock): {0}")]
    Lock(std::io::Error),
    #[error("the change was written but could not be made durable ({0}); check the disk")]
    NotDurable(std::io::Error),
    /// An error of the memory layer's store, carried unchanged (so a
    /// round trip through [`StoreError`] loses nothing).
    #[error(transparent)]
    Store(#[from] StoreError),
    #[error("git error: {0}")]
    Git(GitError),
    #[error("cannot write the vault's log (memvault/wal): {0}")]
    Log(std::io::Error),
    #[error("the vault is not safe to use: {0}; nothing was changed")]
    Unsafe(#[from] fsx::Unsafe),
    #[error("I/O error: {0}")]
    Io(#[from] std::io::Error),
}

/// A libgit2 failure, kept opaque so that no git2 type is part of the
/// vault's API.
#[derive(Debug)]
pub struct GitError(git2::Error);

impl std::fmt::Display for GitError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        self.0.fmt(f)
    }
}

impl std::error::Error for GitError {}

impl From<git2::Error> for VaultError {
    fn from(e: git2::Error) -> Self {
        VaultError::Git(GitError(e))
    }
}

pub(crate) fn damaged(what: &'static str) -> VaultError {
    VaultError::Damaged(what)
}

impl VaultError {
    /// Stored bytes failed a check (as opposed to a refusal, a wrong
    /// secret or an I/O failure).
    pub fn is_damage(&self) -> bool {
        matches!(
            self,
            VaultError::Damaged(_) | VaultError::Object(_) | VaultError::RolledBack(_)
        ) || matches!(self, VaultError::Store(StoreError::Damaged(_)))
    }
}

impl From<wal::WalError> for VaultError {
    fn from(e: wal::WalError) -> Self {
        use wal::WalError as W;
        match e {
            W::Io(e) => VaultError::Log(e),
            W::Git(e) => e.into(),
            W::TooLarge { .. } => VaultError::Refused(e.to_string()),
            W::Forged => VaultError::Damaged(
                "the write-ahead log (memvault/wal) holds an entry that was not written with this vault's key (a log copied from another vault, or a forged entry)",
            ),
            W::Replayed => VaultError::Damaged(
                "the write-ahead log (memvault/wal) holds a record that does not build on the one before it (an earlier record replayed)",
            ),
            W::BadObject => VaultError::Damaged(
                "the write-ahead log (memvault/wal) holds an object that does not match its id",
            ),
            W::NotReady => VaultError::Damaged(
                "the write-ahead log (memvault/wal) cannot take a record before it was read",
            ),
        }
    }
}

/// The one mapping from the vault's errors to the memory layer's (the
/// other way is `VaultError::Store`, lossless).
impl From<VaultError> for StoreError {
    fn from(e: VaultError) -> Self {
        match e {
            VaultError::Store(e) => e,
            VaultError::Damaged(what) => StoreError::Damaged(what.to_string()),
            VaultError::RolledBack(what) => StoreError::Damaged(what.to_string()),
            VaultError::Object(e) => StoreError::Damaged(e.to_string()),
            VaultError::Refused(what) => StoreError::Limit(what),
            VaultError::Git(e) => git_unavailable(&e.0),
            other => StoreError::Unavailable(other.to_string()),
        }
    }
}

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
    /// was checked against (see `check_binding`).
    verified_tip: Option<(Oid, Oid)>,
    attribution: Attribution,
    lock: File,
    caches: Caches,
    /// The write-ahead log (see [`wal`]).
    wal: Wal,
    /// Where this handle's log writes stand, and who syncs and
    /// checkpoints them.
    log: LogState,
    /// The name (hex id) of the keyslot this handle was unlocked with.
    unlocked_slot: Option<String>,
}

pub(crate) fn fixed_signature() -> Result<Signature<'static>, git2::Error> {
    Signature::new("memvault", "memvault", &git2::Time::new(0, 0))
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
    /// Create a new vault at `dir` (which must not exist, or be empty) and
    /// return it unlocked.
    pub fn init(
        dir: &Path,
        secret: InitSecret,
        config: VaultConfig,
        attribution: Attribution,
    ) -> Result<Vault, VaultError> {
        fsync::enable();
        config.validate().map_err(VaultError::Config)?;
        if dir.exists() {
            let empty = dir.is_dir() && fs::read_dir(dir)?.next().is_none();
            if !empty {
                return Err(VaultError::NotEmpty(dir.to_path_buf()));
            }
        }
        // Build the vault in a sibling folder and move it into place at
        // the end, so a crash never leaves a half-made vault at `dir`.
        let parent = dir
            .parent()
            .filter(|p| !p.as_os_str().is_empty())
            .unwrap_or(Path::new("."));
        fs::create_dir_all(parent)?;
        let name = dir
            .file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_else(|| "vault".into());
        let tmp = parent.join(format!(
            ".{name}.init-{}",
            data_encoding::HEXLOWER.encode(&crypto::random_bytes::<6>())
        ));
        let result = Self::build(&tmp, secret, &config);
        if let Err(e) = result {
            let _ = fs::remove_dir_all(&tmp);
            return Err(e);
        }
        if dir.exists() {
            fs::remove_dir(dir)?;
        }
        fs::rename(&tmp, dir)?;
        sync_dir(parent);
        let keyring = result?;
        let repo = Repository::open_bare(dir)?;
        let wal = Wal::open(dir)?;
        let mut vault = Self::finish_open(dir, repo, wal, keyring, attribution)?;
        // A new vault has exactly one slot: the one it was created with.
        vault.unlocked_slot = vault.key_state.slots.keys().next().cloned();
        Ok(vault)
    }

    fn build(tmp: &Path, secret: InitSecret, config: &VaultConfig) -> Result<Keyring, VaultError> {
        // The folder is ours and private before libgit2 fills it; what
        // libgit2 makes with the umask's modes is made private below.
        fsx::mkdir_private(tmp)?;
        let mut opts = RepositoryInitOptions::new();
        opts.bare(true)
            .initial_head("main")
            .mkdir(true)
            .external_template(false);
        let repo = Repository::init_opts(tmp, &opts)?;
        {
            let mut cfg = repo.config()?;
            cfg.set_bool("core.logAllRefUpdates", false)?;
            cfg.set_i32("gc.auto", 0)?;
        }
        fsx::mkdir_private(&tmp.join(STATE_DIR))?;
        write_durable(&tmp.join(FORMAT_FILE), format_line(FORMAT).as_bytes())?;
        write_durable(&tmp.join(LOCK_FILE), b"")?;

        let keyring = Keyring::new_random();
        let keys = VaultKeys::derive(&keyring);
        let slot = match &secret {
            InitSecret::KeyFile(k) => crypto::seal_keyfile_slot(&keyring, k),
            InitSecret::Passphrase(p, params) => crypto::seal_passphrase_slot(&keyring, p, *params)
                .map_err(|_| VaultError::ExcessiveWork)?,
        };
        let mut slots = BTreeMap::new();
        slots.insert(slot_name(&slot)?, slot);
        let key_state = KeyState::create(&repo, &keys, slots, config.clone())?;

        // The first commit: the empty tree, marking the vault's creation.
        let empty = repo.treebuilder(None)?.write()?;
        let tree = repo.find_tree(empty)?;
        let meta = CommitMeta {
            v: META_VERSION,
            op: "init".into(),
            time_ms: now_ms(),
            session: "init".into(),
            actor: "memvault".into(),
            keys: Some(key_state.counter),
            ..Default::default()
        };
        let commit = write_commit(&repo, &keys, &tree, None, &meta)?;
        repo.reference(MAIN_REF, commit, false, "memvault init")?;
        // libgit2 writes without fsync (see `fsync`): sync the new vault
        // as a whole, then start its log at this state.
        let mut wal = Wal::open(tmp)?;
        wal.set_key(keys.log_key());
        let keys_commit = repo.refname_to_id(keys::KEYS_REF)?;
        fsx::make_private_tree(tmp)?;
        sync_tree(tmp)?;
        wal.reset(vec![
            (MAIN_REF.to_string(), commit),
            (keys::KEYS_REF.to_string(), keys_commit),
        ])?;
        Ok(keyring)
    }

    /// Open and unlock the vault at `dir`.
    pub fn open(
        dir: &Path,
        secret: &Unlock<'_>,
        attribution: Attribution,
    ) -> Result<Vault, VaultError> {
        fsync::enable();
        if !dir.exists() {
            return Err(VaultError::NotFound(dir.to_path_buf()));
        }
        if !dir.join(FORMAT_FILE).is_file() {
            return Err(VaultError::NotAVault(dir.to_path_buf()));
        }
        // Before anything is read or written: no link, not open to others.
        fsx::check_vault(dir)?;
        read_format(dir)?;
        let repo =
            Repository::open_bare(dir).map_err(|_| VaultError::NotAVault(dir.to_path_buf()))?;
        // Before unlock the log's tags cannot be checked: this read only
        // finds the keyslots; `finish_open` reads it again, checked,
        // before anything of it is used or written to git.
        let mut wal = Wal::open(dir)?;
        wal.catch_up(&repo)?;
        // As in `refresh`: a ref may name objects of a newer log record.
        let mut attempt = 0;
        let slots = loop {
            let at = wal.ref_target(&repo, keys::KEYS_REF)?;
            match keys::read_slots_at(&repo, at) {
                Ok((_, s)) => break s,
                Err(VaultError::Damaged(_) | VaultError::Object(_)) if attempt < 3 => {
                    attempt += 1;
                    wal.catch_up(&repo)?;
                }
                Err(e) => return Err(e),
            }
        };
        let mut keyring = None;
        let mut tried = false;
        let mut excessive = false;
        for (name, bytes) in &slots {
            match crypto::open_slot(bytes, secret) {
                Ok(k) => {
                    keyring = Some((k, name.clone()));
                    break;
                }
                Err(crypto::CryptoError::WrongKind) => {}
                Err(crypto::CryptoError::ExcessiveWork) => {
                    tried = true;
                    excessive = true;
                }
                Err(_) => tried = true,
            }
        }
        let (keyring, slot) = match keyring {
            Some(k) => k,
            None if excessive => return Err(VaultError::ExcessiveWork),
            None if tried => return Err(VaultError::WrongSecret),
            None => return Err(VaultError::NoSlotOfKind),
        };
        let mut vault = Self::finish_open(dir, repo, wal, keyring, attribution)?;
        vault.unlocked_slot = Some(slot);
        Ok(vault)
    }

    /// A second, independent handle on this vault (its own repository
    /// handle and writer-lock descriptor), e.g. for a sweeper thread.
    pub fn reopen(&self, attribution: Attribution) -> Result<Vault, VaultError> {
        fsx::check_vault(&self.dir)?;
        let repo = Repository::open_bare(&self.dir)
            .map_err(|_| VaultError::NotAVault(self.dir.clone()))?;
        let wal = Wal::open(&self.dir)?;
        let mut vault =
            Self::finish_open(&self.dir, repo, wal, self.keyring.duplicate(), attribution)?;
        vault.unlocked_slot = self.unlocked_slot.clone();
        Ok(vault)
    }

    /// The key state where the keys ref points, catching up with the log
    /// when a ref names objects of a newer record (a writer in another
    /// process appends its record before it moves the refs).
    fn load_key_state(
        repo: &Repository,
        wal: &mut Wal,
        keys: &VaultKeys,
    ) -> Result<KeyState, VaultError> {
        let mut attempt = 0;
        loop {
            wal.catch_up(repo)?;
            let at = wal.ref_target(repo, keys::KEYS_REF)?;
            match KeyState::load_at(repo, keys, at) {
                Ok(k) => return Ok(k),
                Err(VaultError::Damaged(_) | VaultError::Object(_)) if attempt < 3 => attempt += 1,
                Err(e) => return Err(e),
            }
        }
    }

    fn finish_open(
        dir: &Path,
        repo: Repository,
        wal: Wal,
        keyring: Keyring,
        attribution: Attribution,
    ) -> Result<Vault, VaultError> {
        let mut wal = wal;
        let keys = VaultKeys::derive(&keyring);
        // From now on every entry of the log is checked against its tag.
        wal.set_key(keys.log_key());
        let mut key_state = Self::load_key_state(&repo, &mut wal, &keys)?;
        // The log is never of an older format than the key state: an
        // untagged head in a vault of format 2 was put there.
        if key_state.format >= 2 && wal.head_is_v1() == Some(true) {
            return Err(damaged(LOG_DOWNGRADED));
        }
        // Checkpoint if the log holds anything git does not (records of a
        // writer that died or is still running, a tail the refs do not
        // show, a torn head) or an untagged head: git alone then shows
        // every acknowledged commit.
        let c = wal.catch_up(&repo)?;
        if c.records || !c.clean || wal.head_is_v1() == Some(true) || !wal.refs_consistent(&repo) {
            let lock = fsx::open_rw(&dir.join(LOCK_FILE))?;
            let _guard = FileLock::exclusive(&lock).map_err(VaultError::Lock)?;
            checkpoint_locked(&repo, &mut wal)?;
            key_state = Self::load_key_state(&repo, &mut wal, &keys)?;
        }
        // Format 2 keeps the settings in the key state, authenticated;
        // format 1 in a plain file, until `migrate` moves them.
        let config = match &key_state.settings {
            Some(s) => s.clone(),
            None => load_config(dir)?,
        };
        let lock = fsx::open_rw(&dir.join(LOCK_FILE))?;
        let vault = Vault {
            dir: dir.to_path_buf(),
            repo,
            keys,
            keyring,
            key_state,
            config,
            verified_tip: None,
            attribution,
            lock,
            caches: Caches::default(),
            wal,
            log: LogState::default(),
            unlocked_slot: None,
        };
        let mut vault = vault;
        match vault.migrate() {
            Ok(()) => {}
            // A damaged format-1 vault stays of format 1: each command
            // reports the damage (as below), and a later open migrates it
            // once it is mended.
            Err(e) if e.is_damage() => {}
            Err(e) => return Err(e),
        }
        // A damaged tip is reported by each command, not here, so that a
        // server can still start and say what is wrong.
        Ok(vault)
    }

    /// Bring a vault of format 1 to format 2, once, under the writer lock:
    /// its plain settings file becomes the authenticated settings of a new
    /// key state (whose counter main's commits name from now on), in a
    /// `migrate` commit on main; then the format file says 2 and the plain
    /// file is removed. The key state decides (it is MAC'd, the format file
    /// is not): a format-2 key state is never migrated again, so writing
    /// "1" into the format file cannot bring a plain settings file back.
    fn migrate(&mut self) -> Result<(), VaultError> {
        if self.key_state.format >= 2 {
            if read_format(&self.dir)? < FORMAT {
                // A migration a crash interrupted after its commit.
                write_durable(&self.dir.join(FORMAT_FILE), format_line(FORMAT).as_bytes())?;
            }
            return Ok(());
        }
        self.with_writer_lock(|vault, tip| {
            if vault.key_state.format >= 2 {
                return Ok(()); // another process migrated it meanwhile
            }
            let settings = load_config(&vault.dir)?;
            let meta = CommitMeta {
                details: vec!["vault format 1 -> 2: settings moved into the key state".into()],
                ..vault.new_meta("migrate")
            };
            let change = KeyChange {
                settings: Some(settings),
                ..Default::default()
            };
            vault.publish_key_change(tip, change, meta)?;
            vault.sync_now()
        })?;
        write_durable(&self.dir.join(FORMAT_FILE), format_line(FORMAT).as_bytes())?;
        match fs::remove_file(self.dir.join(CONFIG_FILE)) {
            Ok(()) => sync_dir(&self.dir.join(STATE_DIR)),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(e) => return Err(e.into()),
        }
        Ok(())
    }

    /// Change the vault's settings: a new key state holding them, with a
    /// `config` commit on main naming the settings changed (`changed`),
    /// durably. Refused (nothing changed) if they do not validate.
    pub fn set_config(
        &mut self,
        config: VaultConfig,
        changed: Vec<String>,
    ) -> Result<(), VaultError> {
        config.validate().map_err(VaultError::Config)?;
        self.with_writer_lock(|vault, tip| {
            let meta = CommitMeta {
                details: changed,
                ..vault.new_meta("config")
            };
            let change = KeyChange {
                settings: Some(config),
                ..Default::default()
            };
            vault.publish_key_change(tip, change, meta)?;
            vault.sync_now()
        })
    }

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

    /// The current tip of `refs/heads/main`, MAC-checked.
    pub fn tip(&mut self) -> Result<Option<Rev>, VaultError> {
        Ok(self.checked_tip()?.map(Rev::from_oid))
    }

    /// [`tip`](Self::tip), as git's id.
    pub(crate) fn checked_tip(&mut self) -> Result<Option<Oid>, VaultError> {
        let Some(tip) = self.wal.ref_target(&self.repo, MAIN_REF)? else {
            return Ok(None);
        };
        let pair = (tip, self.key_state.commit);
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
        // Objects of other processes' mutations are in the log until a
        // checkpoint: load any new ones before following the refs. A writer
        // appends its record before moving the refs, so a ref that names an
        // object we lack means a newer record: catch up again and retry.
        let mut attempt = 0;
        loop {
            self.wal.catch_up(&self.repo)?;
            if self.key_state.format >= 2 && self.wal.head_is_v1() == Some(true) {
                return Err(damaged(LOG_DOWNGRADED));
            }
            match self
                .keys_target()
                .and_then(|at| self.key_state.refresh(&self.repo, &self.keys, at))
                .and_then(|()| self.checked_tip())
            {
                Err(VaultError::Damaged(_) | VaultError::Object(_) | VaultError::RolledBack(_))
                    if attempt < 3 =>
                {
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

    fn tree_of(&self, commit: Option<Oid>) -> Result<Option<git2::Tree<'_>>, VaultError> {
        match commit {
            None => Ok(None),
            Some(c) => {
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
                objects::check(&self.repo, tree_id)?;
                Ok(Some(
                    self.repo
                        .find_tree(tree_id)
                        .map_err(|_| damaged("a tree is unreadable"))?,
                ))
            }
        }
    }

    /// A snapshot of the tree at `rev` (None: the empty tree).
    pub fn snapshot_at(&self, rev: Option<Rev>) -> Result<VaultSnapshot<'_>, VaultError> {
        self.snapshot_of(rev.map(Rev::oid))
    }

    /// [`snapshot_at`](Self::snapshot_at) by git's id.
    pub(crate) fn snapshot_of(&self, commit: Option<Oid>) -> Result<VaultSnapshot<'_>, VaultError> {
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
        serde_json::from_slice(&plain).map_err(|_| damaged("commit metadata does not parse"))
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
        let guard = FileLock::exclusive(&self.lock).map_err(VaultError::Lock)?;
        let len_before = self.wal.len().unwrap_or(0);
        let result = self
            .recover_if_needed()
            .and_then(|()| {
                let tip = self.refresh()?;
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
        if result.is_ok() && self.wal.len().unwrap_or(0) > wal::CHECKPOINT_BYTES {
            if self.log.checkpoints == CheckpointAt::AfterReply {
                self.log.checkpoint_due = true;
            } else {
                self.checkpoint()?;
            }
        }
        result
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

    /// Under the writer lock: check that the log's tail is what the refs
    /// say (a writer that died between its log record and its ref moves
    /// leaves them apart) and recover if not.
    fn recover_if_needed(&mut self) -> Result<(), VaultError> {
        let c = self.wal.catch_up(&self.repo)?;
        if self.wal.head_is_v1() == Some(true) && self.key_state.format >= 2 {
            return Err(damaged(LOG_DOWNGRADED));
        }
        if !c.clean || self.wal.head_is_v1() == Some(true) || !self.wal.refs_consistent(&self.repo)
        {
            checkpoint_locked(&self.repo, &mut self.wal)?;
        }
        Ok(())
    }

    /// Make everything in the log durable in git (one pack, refs synced)
    /// and start the log over. Takes the writer lock.
    pub fn checkpoint(&mut self) -> Result<(), VaultError> {
        let _guard = FileLock::exclusive(&self.lock).map_err(VaultError::Lock)?;
        checkpoint_locked(&self.repo, &mut self.wal)?;
        self.log.dirty = false;
        Ok(())
    }

    /// Apply one mutation on top of `parent` and move main to it. The
    /// caller holds the writer lock.
    fn apply(&mut self, parent: Option<Oid>, m: Mutation) -> Result<(), StoreError> {
        let mut meta = CommitMeta {
            lines_added: m.facts.lines_added,
            lines_removed: m.facts.lines_removed,
            redactions: m.facts.redactions,
            ..self.new_meta(m.op.as_str())
        };
        let mut new_key: Option<(FileKeyId, FileKey)> = None;
        let mut written: Vec<FileKeyId> = Vec::new();
        let mut files_after: Option<usize> = None;
        // Every object the new tree adds, with its bytes, for the log.
        let mut objects: Vec<Object> = Vec::new();
        let new_tree = {
            let base = self.tree_of(parent)?;
            let snap = VaultSnapshot::new(
                &self.repo,
                &self.keys,
                &self.key_state,
                &self.caches,
                base.clone(),
            );
            let mut update = TreeEdits::default();
            match m.change {
                Change::Write { path, content } => {
                    if content.len() > self.config.max_file_bytes {
                        return Err(StoreError::Limit(format!(
                            "the content is {} bytes, over this vault's limit of {} bytes per file",
                            content.len(),
                            self.config.max_file_bytes
                        )));
                    }
                    // The git path is computed once (a name encryption per
                    // segment): for the lookup and for the edit.
                    let git_path = snap.git_path(&path)?;
                    let at = snap.entry_at(&git_path)?;
                    let existing = match at {
                        Some((oid, NodeKind::File)) => Some(snap.blob_key_id(oid)?),
                        _ => None,
                    };
                    let mut fresh: Option<(FileKeyId, FileKey)> = None;
                    let (id, key) = match existing {
                        Some(id) => (id, snap.file_key(&id)?),
                        None => {
                            let files = snap.count_files()?;
                            // One more file, unless the write replaces a
                            // whole directory (the memory layer refuses
                            // that; do not count on it here).
                            if at.is_none() {
                                files_after = Some(files + 1);
                            }
                            if files >= self.config.max_files {
                                return Err(StoreError::Limit(format!(
                                    "this vault already holds its limit of {} files; delete some before creating more",
                                    self.config.max_files
                                )));
                            }
                            let f = fresh.insert((FileKeyId::generate(), FileKey::generate()));
                            (f.0, &f.1)
                        }
                    };
                    let sealed = crypto::seal_blob(key, &id, path.as_str(), &content);
                    update.upsert(&git_path, stage_blob(&self.repo, sealed, &mut objects)?);
                    meta.size = Some(content.len() as u64);
                    meta.content_hash =
                        Some(data_encoding::HEXLOWER.encode(&key.content_hash(&content)));
                    if let Some(f) = fresh {
                        new_key = Some(f);
                    }
                    meta.key_id = Some(id.to_hex());
                    written.push(id);
                    meta.files = vec![path.as_str().to_string()];
                    meta.path = Some(path.as_str().to_string());
                }
                Change::Delete { path } => {
                    meta.files = snap
                        .files_below(&path)?
                        .into_iter()
                        .map(|p| p.as_str().to_string())
                        .collect();
                    update.remove(&snap.git_path(&path)?);
                    meta.path = Some(path.as_str().to_string());
                }
                Change::Rename { from, to } => {
                    let files = snap.files_below(&from)?;
                    for file in &files {
                        let Some(target) = file.rebase(&from, &to) else {
                            return Err(StoreError::Damaged("rename target out of range".into()));
                        };
                        let id = snap.file_key_id(file)?.ok_or(StoreError::NotFound)?;
                        written.push(id);
                        let key = snap.file_key(&id)?;
                        let content = snap.read(file)?;
                        let sealed = crypto::seal_blob(key, &id, target.as_str(), &content);
                        let oid = stage_blob(&self.repo, sealed, &mut objects)?;
                        update.upsert(&snap.git_path(&target)?, oid);
                    }
                    update.remove(&snap.git_path(&from)?);
                    meta.files = files.iter().map(|p| p.as_str().to_string()).collect();
                    meta.path = Some(from.as_str().to_string());
                    meta.new_path = Some(to.as_str().to_string());
                }
            }
            drop(snap);
            let base = base.map(|t| t.id());
            update
                .write(&self.repo, &self.caches, base, &mut objects)
                .map_err(ge)?
        };
        if let Some(n) = files_after {
            self.caches.remember_count(new_tree, n);
        }
        let new_keys = new_key
            .map(|(id, key)| (id, Some(key)))
            .into_iter()
            .collect();
        self.publish(parent, new_tree, KeyChange::files(new_keys), &meta, objects)?;
        // For expiry: a write counts as use (no fsync; see `access`).
        let time = meta.time_ms;
        let records: Vec<_> = written
            .into_iter()
            .map(|id| (id, access::Kind::Written, time))
            .collect();
        self.append_access(&records);
        Ok(())
    }

    /// Make a staged tree the new tip: the one publish path of the vault.
    ///
    /// One log record holds the key-state change `change` (if any: new or
    /// destroyed file keys, keyslots, settings, a new keyring) and the MAC'd
    /// commit on main with `meta`, whose metadata names the counter of the
    /// key state that goes with it (see [`keys`]); the record moves both
    /// refs at once. Refused unless the log's tail is `parent` (the caller
    /// holds the writer lock, so no memvault writer can have moved it).
    /// `objects`: every object `tree` adds to its parent's tree that is not
    /// yet durable (new blobs and trees, as the caller wrote them).
    /// Durable once the record is synced (see `with_writer_lock`).
    pub(crate) fn publish(
        &mut self,
        parent: Option<Oid>,
        tree: Oid,
        change: KeyChange,
        meta: &CommitMeta,
        objects: Vec<Object>,
    ) -> Result<Oid, VaultError> {
        let changes_keys = !change.is_empty();
        let result = self.try_publish(parent, tree, change, meta, objects);
        if result.is_err() && changes_keys {
            // The in-memory tables were edited in place: read back the
            // state that is really on disk.
            if let Ok(at) = self.keys_target() {
                let _ = self.key_state.reload(&self.repo, &self.keys, at);
            }
        }
        result
    }

    fn try_publish(
        &mut self,
        parent: Option<Oid>,
        tree: Oid,
        mut change: KeyChange,
        meta: &CommitMeta,
        objects: Vec<Object>,
    ) -> Result<Oid, VaultError> {
        if self.wal.tail_target(MAIN_REF) != parent {
            return Err(VaultError::Refused(
                "the vault was changed by a writer that did not take the lock; nothing was changed, try again".into(),
            ));
        }
        let old_keys = self.key_state.commit;
        // A new keyring (rekey): the key state and the commit are sealed and
        // MAC'd under it.
        let keyring = change.keyring.take();
        let new_keys = keyring.as_ref().map(VaultKeys::derive);
        let keys = new_keys.as_ref().unwrap_or(&self.keys);
        let mut record = Record::default();
        let staged = if change.is_empty() {
            None
        } else {
            let staged = self.key_state.stage_changes(&self.repo, keys, change)?;
            self.key_state
                .add_to_record(&self.repo, &mut record, old_keys, staged)?;
            Some(staged)
        };
        let mut meta = meta.clone();
        meta.keys = Some(self.key_state.counter);
        let parent_commit = match parent {
            Some(p) => {
                objects::check(&self.repo, p)?;
                Some(self.repo.find_commit(p)?)
            }
            None => None,
        };
        objects::check(&self.repo, tree)?;
        let tree = self.repo.find_tree(tree)?;
        let commit = write_commit(&self.repo, keys, &tree, parent_commit.as_ref(), &meta)?;
        record.add_object(&self.repo.odb()?, commit)?;
        record.objects.extend(objects);
        record.refs.push((MAIN_REF.to_string(), commit));
        // The record moves the refs: the log's tail is where they point
        // (ref files follow at the next checkpoint). The acknowledgement
        // point is the sync of this record (see `with_writer_lock`).
        self.wal.append(&record)?;
        self.log.unsynced = true;
        if let Some(k) = staged {
            self.key_state.published(&self.repo, k);
            if let Some(settings) = &self.key_state.settings {
                self.config = settings.clone();
            }
        }
        if let (Some(ring), Some(keys)) = (keyring, new_keys) {
            self.keyring = ring;
            self.keys = keys;
        }
        self.verified_tip = Some((commit, self.key_state.commit));
        Ok(commit)
    }

    /// Write `edits` over the tree of `base` (a commit; None: the empty
    /// tree): the new tree's id, with every tree written appended to
    /// `objects` for the log record. The one tree builder of the vault
    /// (see [`treeedit`]).
    pub(crate) fn edit_tree(
        &self,
        base: Option<Oid>,
        edits: &TreeEdits,
        objects: &mut Vec<Object>,
    ) -> Result<Oid, VaultError> {
        let base = self.tree_of(base)?.map(|t| t.id());
        Ok(edits.write(&self.repo, &self.caches, base, objects)?)
    }

    /// Sync the log now if a record still needs it (for the few steps
    /// that must be durable before the next, inside the writer lock).
    pub(crate) fn sync_now(&mut self) -> Result<(), VaultError> {
        if std::mem::take(&mut self.log.unsynced) {
            self.wal.sync()?;
        }
        Ok(())
    }

    /// A commit on main that changes the key state alone (keyslots,
    /// settings, erasure after a crash): the tree stays the tip's. The
    /// caller holds the writer lock; `tip` is the current tip.
    pub(crate) fn publish_key_change(
        &mut self,
        tip: Option<Oid>,
        change: KeyChange,
        meta: CommitMeta,
    ) -> Result<Oid, VaultError> {
        let tree = match self.tree_of(tip)? {
            Some(t) => t.id(),
            None => self.repo.treebuilder(None)?.write()?,
        };
        self.publish(tip, tree, change, &meta, Vec::new())
    }

    /// The metadata prologue every commit shares: operation, time, who.
    pub(crate) fn new_meta(&self, op: &str) -> CommitMeta {
        CommitMeta {
            v: META_VERSION,
            op: op.into(),
            time_ms: now_ms(),
            session: self.attribution.session.clone(),
            actor: self.attribution.actor.clone(),
            ..Default::default()
        }
    }

    /// Check that the key state is not older than the tip requires: the
    /// tip names the counter of the key state written with it, and an
    /// erasure's tombstone names the keys that must be gone (a format-1
    /// commit names no counter, but its tombstone still binds).
    fn check_binding(&self, tip: Oid) -> Result<(), VaultError> {
        let meta = self.meta_of(tip)?;
        let ks = &self.key_state;
        let older = meta.keys.is_some_and(|k| k > ks.counter);
        let erasure_pending = self.dir.join(erase::MARKER).exists();
        let unerased = !erasure_pending
            && meta
                .erased_keys
                .iter()
                .any(|hex| FileKeyId::from_hex(hex).is_some_and(|id| ks.file_key(&id).is_some()));
        if older || unerased {
            return Err(VaultError::RolledBack(
                "the key state (refs/memvault/keys) was rolled back: it is older than the newest commit requires",
            ));
        }
        Ok(())
    }
}

/// The checkpoint (the caller holds the writer lock): write every object
/// of the log into one synced pack, set the refs to the log's tail, sync
/// them, then reset the log to a head naming them.
///
/// Which tail: a ref on disk that does not read, names a missing object, or
/// names an older target from the log (a writer died before moving it) is
/// set to the log's tail; a ref that is gone or names something the log
/// never wrote was changed outside memvault and is kept as it is (the MAC
/// checks judge it).
fn checkpoint_locked(repo: &Repository, wal: &mut Wal) -> Result<(), VaultError> {
    // Under the writer lock no live memvault writer holds a ref lock: one
    // left behind belongs to a writer killed while moving a ref.
    for name in [MAIN_REF, keys::KEYS_REF, "packed-refs"] {
        let _ = fs::remove_file(repo.path().join(format!("{name}.lock")));
    }
    let contents = wal.read_all()?;
    let tail = contents.tail();
    let odb = repo.odb()?;
    let mut target: Refs = Vec::new();
    for name in [MAIN_REF, keys::KEYS_REF] {
        // A ref file that exists but does not read was cut short by a
        // crash; a ref that is gone was deleted on purpose.
        let disk = match repo.refname_to_id(name) {
            Ok(id) => Some(id),
            Err(e) if e.code() == ErrorCode::NotFound => None,
            Err(_) => Some(Oid::ZERO_SHA1),
        };
        let logged = tail.iter().find(|(n, _)| n == name).map(|(_, id)| *id);
        let earlier = |id: Oid| {
            contents
                .head
                .iter()
                .flat_map(|h| h.refs.iter())
                .chain(contents.records.iter().flat_map(|r| r.refs.iter()))
                .any(|(n, v)| n == name && *v == id)
        };
        let t = match (disk, logged) {
            (Some(d), Some(l)) if d == l || earlier(d) || !odb.exists(d) => Some(l),
            (d, _) => d,
        };
        if let Some(t) = t.filter(|t| !t.is_zero()) {
            target.push((name.to_string(), t));
        }
    }
    let objects: Vec<&wal::Object> = contents
        .records
        .iter()
        .flat_map(|r| r.objects.iter())
        .collect();
    wal::write_durable_objects(repo, &objects)?;
    for (name, id) in &target {
        if repo.refname_to_id(name).ok() != Some(*id)
            && repo.reference(name, *id, true, "memvault recover").is_err()
        {
            // An unreadable ref file (cut short by a crash): replace it.
            write_durable(&repo.path().join(name), format!("{id}\n").as_bytes())?;
        }
        let file = repo.path().join(name);
        if file.exists() {
            // libgit2 wrote it with the umask's mode.
            fsx::make_private(&file)?;
            fsync::sync_path(&file)?;
        }
        if let Some(parent) = file.parent() {
            fsync::sync_path(parent)?;
        }
    }
    let packed = repo.path().join("packed-refs");
    if packed.exists() {
        fsync::sync_path(&packed)?;
    }
    wal.reset(target)?;
    // Everything is on disk now: drop the in-memory copies.
    wal::install_odb(repo)?;
    // A few packs at most: merge the small ones (a full repack with delta
    // search and pruning is `memvault gc`'s, never a mutation's).
    gc::merge_small_packs(repo)?;
    Ok(())
}

/// fsync every file and directory below `dir` (a new vault, before it is
/// moved into place).
fn sync_tree(dir: &Path) -> std::io::Result<()> {
    for e in fs::read_dir(dir)? {
        let e = e?;
        if e.file_type()?.is_dir() {
            sync_tree(&e.path())?;
        } else {
            fsync::sync_path(&e.path())?;
        }
    }
    fsync::sync_path(dir)
}

/// Write a sealed blob to the object store and keep its bytes for the log
/// record.
pub(crate) fn stage_blob(
    repo: &Repository,
    sealed: Vec<u8>,
    objects: &mut Vec<Object>,
) -> Result<Oid, VaultError> {
    let id = repo.blob(&sealed)?;
    objects.push(Object {
        kind: git2::ObjectType::Blob,
        id,
        data: sealed,
    });
    Ok(id)
}

fn ge(e: git2::Error) -> StoreError {
    git_unavailable(&e)
}

/// A libgit2 failure as a tool result says it: its class and code, not
/// libgit2's message (which can name files of the vault directory).
fn git_unavailable(e: &git2::Error) -> StoreError {
    StoreError::Unavailable(format!(
        "the git object store failed ({:?}, {:?}); run `memvault verify`",
        e.class(),
        e.code()
    ))
}

/// A `flock` held while the guard lives: the one lock type of the vault,
/// for the writer lock (`memvault/lock`: exclusive for a mutation, a
/// checkpoint or a recovery; shared for access-log appends, which may run
/// beside each other but not beside the sweeper's compaction) and the
/// history index's lock. Limitations: `flock` is advisory; it orders
/// memvault processes, not other programs writing the vault directory
/// (what they change is judged by the MACs and the log's checks).
#[must_use = "the lock is released when the guard is dropped"]
pub(crate) struct FileLock(File);

impl FileLock {
    /// Wait for the lock on `file` (`memvault/lock`), exclusively.
    pub fn exclusive(file: &File) -> std::io::Result<FileLock> {
        let file = file.try_clone()?;
        file.lock()?;
        Ok(FileLock(file))
    }

    /// Wait for the lock on `file`, shared with other shared holders.
    pub fn shared(file: &File) -> std::io::Result<FileLock> {
        let file = file.try_clone()?;
        file.lock_shared()?;
        Ok(FileLock(file))
    }
}

impl Drop for FileLock {
    fn drop(&mut self) {
        let _ = self.0.unlock();
    }
}

fn write_commit(
    repo: &Repository,
    keys: &VaultKeys,
    tree: &git2::Tree<'_>,
    parent: Option<&git2::Commit<'_>>,
    meta: &CommitMeta,
) -> Result<Oid, VaultError> {
    let json = Zeroizing::new(
        serde_json::to_vec(meta).map_err(|_| damaged("metadata does not serialise"))?,
    );
    let aad = meta_aad(tree.id(), parent.map(|p| p.id()));
    let sealed = keys.seal_meta(&aad, &json);
    let message = format!("{}\n", data_encoding::BASE64.encode(&sealed));
    let sig = fixed_signature()?;
    let parents: Vec<&git2::Commit<'_>> = parent.into_iter().collect();
    let buf = repo.commit_create_buffer(&sig, &sig, &message, tree, &parents)?;
    write_signed_commit(repo, keys, &buf)
}

fn format_line(n: u32) -> String {
    format!("{FORMAT_PREFIX}{n}\n")
}

/// The format number of the vault at `dir`: refused if it is not a vault
/// or is newer than this memvault.
fn read_format(dir: &Path) -> Result<u32, VaultError> {
    let not_a_vault = || VaultError::NotAVault(dir.to_path_buf());
    let text = fsx::read_to_string(&dir.join(FORMAT_FILE)).map_err(|_| not_a_vault())?;
    let n: u32 = text
        .strip_prefix(FORMAT_PREFIX)
        .and_then(|t| t.strip_suffix('\n'))
        .and_then(|t| t.parse().ok())
        .filter(|n| *n >= 1)
        .ok_or_else(not_a_vault)?;
    if n > FORMAT {
        return Err(VaultError::NewerFormat(n));
    }
    Ok(n)
}

fn load_config(dir: &Path) -> Result<VaultConfig, VaultError> {
    let path = dir.join(CONFIG_FILE);
    let config = match fsx::read(&path) {
        Ok(bytes) => serde_json::from_slice::<VaultConfig>(&bytes).map_err(|_| {
            VaultError::Config("memvault/config.json does not parse as vault settings")
        })?,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => VaultConfig::default(),
        Err(e) => return Err(e.into()),
    };
    config.validate().map_err(VaultError::Config)?;
    Ok(config)
}

/// Write a small file and fsync it and its directory.
pub(crate) fn write_durable(path: &Path, bytes: &[u8]) -> std::io::Result<()> {
    use std::io::Write;
    let tmp = path.with_extension("tmp");
    {
        let mut f = fsx::create_new(&tmp, fsx::FILE_MODE)?;
        f.write_all(bytes)?;
        f.sync_all()?;
    }
    fs::rename(&tmp, path)?;
    if let Some(parent) = path.parent() {
        sync_dir(parent);
    }
    Ok(())
}

fn sync_dir(dir: &Path) {
    if let Ok(d) = File::open(dir) {
        let _ = d.sync_all();
    }
}

impl Drop for Vault {
    /// A clean close checkpoints what this process logged, so that git
    /// alone (without the log) shows every commit.
    fn drop(&mut self) {
        if self.log.dirty {
            let _ = self.checkpoint();
        }
    }
}

impl Store for Vault {
    fn read(
        &mut self,
        f: &mut dyn FnMut(&dyn Snapshot) -> Result<ToolResult, StoreError>,
    ) -> Result<ToolResult, StoreError> {
        let tip = self.refresh()?;
        let snap = self.snapshot_of(tip)?;
        f(&snap)
    }

    fn write(
        &mut self,
        f: &mut dyn FnMut(&dyn Snapshot) -> Result<Outcome, StoreError>,
    ) -> Result<ToolResult, StoreError> {
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
        if std::mem::take(&mut self.log.checkpoint_due)
            && let Err(e) = self.checkpoint()
        {
            // Nothing is lost: the log still holds every record, and the
            // next mutation makes the checkpoint due again.
            eprintln!("memvault: checkpoint failed ({e}); it will be retried");
        }
    }

    fn note_viewed(&mut self, path: &crate::memory::MemoryPath) {
        let last = self.caches.last_read.borrow_mut().take();
        if let Some((p, id)) = last
            && p == path.as_str()
        {
            self.record_access(&[(id, access::Kind::Viewed, now_ms())]);
        }
    }
}
