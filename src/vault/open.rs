//! Creating, opening and unlocking a vault: the keyslot that opens it, the
//! checked read of its log, recovery, and the migration of an older
//! format; and the vault's settings.

use super::*;

/// The kinds of [`Staging`] folders, as their names say them.
const STAGING_KINDS: [&str; 2] = ["init", "clone"];

/// A folder beside `dir` that a vault is made in (`init`, `clone`) and
/// then moved into place at `dir` in one rename, so that a crash never
/// leaves a half-made vault at `dir`. Named `.<dir's name>.<kind>-<12 hex>`
/// and held locked (`flock` on the folder) while it is being made. It is
/// erased when dropped unless [`place`](Self::place) moved it into place:
/// an error at any step, the last rename included, leaves nothing behind.
/// A folder of that name that no process holds is what a process killed
/// while making one left (a whole vault, perhaps: a clone's copy of what
/// the remote held, out of reach of any later erasure): the next `init` or
/// `clone` beside it erases it.
pub(crate) struct Staging {
    pub tmp: PathBuf,
    parent: PathBuf,
    _held: fs::File,
    placed: bool,
}

impl Staging {
    /// A staging folder beside `dir`, after checking that `dir` is no
    /// link (refused as every open refuses one: an empty folder it points
    /// to would pass and fail at the final rename with a bare "not a
    /// directory") and is missing or an empty folder.
    pub(crate) fn new(dir: &Path, what: &str) -> Result<Staging, VaultError> {
        if fs::symlink_metadata(dir).is_ok_and(|m| m.file_type().is_symlink()) {
            return Err(fsx::Unsafe::Link(dir.display().to_string()).into());
        }
        if dir.exists() {
            let empty = dir.is_dir() && fs::read_dir(dir)?.next().is_none();
            if !empty {
                return Err(VaultError::NotEmpty(dir.to_path_buf()));
            }
        }
        let parent = dir
            .parent()
            .filter(|p| !p.as_os_str().is_empty())
            .unwrap_or(Path::new("."))
            .to_path_buf();
        fs::create_dir_all(&parent)?;
        let name = dir
            .file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_else(|| "vault".into());
        sweep_stale_staging(&parent, &name);
        // Made, then locked: another process's sweep that found it in
        // between (unlocked) may erase it or hold it; then a new one.
        let mut attempt = 0;
        let (tmp, held) = loop {
            let tmp = parent.join(format!(
                ".{name}.{what}-{}",
                data_encoding::HEXLOWER.encode(&crypto::random_bytes::<6>())
            ));
            fsx::mkdir_new_private(&tmp)?;
            let locked = fs::File::open(&tmp).and_then(|f| {
                f.try_lock().map(|()| f).map_err(|e| match e {
                    fs::TryLockError::Error(e) => e,
                    fs::TryLockError::WouldBlock => {
                        std::io::Error::other("another process holds the new staging folder")
                    }
                })
            });
            match locked {
                // Still there (not erased between the open and the lock).
                Ok(f) if fsx::check_real_dir(&tmp).is_ok() => break (tmp, f),
                Ok(_) if attempt < 3 => attempt += 1,
                Err(_) if attempt < 3 => {
                    let _ = fs::remove_dir(&tmp);
                    attempt += 1;
                }
                Ok(_) => return Err(std::io::Error::other("the staging folder vanished").into()),
                Err(e) => {
                    let _ = fs::remove_dir_all(&tmp);
                    return Err(e.into());
                }
            }
        };
        Ok(Staging {
            tmp,
            parent,
            _held: held,
            placed: false,
        })
    }

    /// Move the vault made into place at `dir` (an empty folder there is
    /// replaced). Refused as not empty when something else is there by
    /// now (another `init` or `clone` to the same place finished first).
    pub(crate) fn place(mut self, dir: &Path) -> Result<(), VaultError> {
        let moved = (|| {
            if dir.exists() {
                match fs::remove_dir(dir) {
                    // Another init or clone to the same place took the
                    // empty folder away first: the rename says the rest.
                    Err(e) if e.kind() != std::io::ErrorKind::NotFound => return Err(e),
                    _ => {}
                }
            }
            fs::rename(&self.tmp, dir)
        })();
        match moved {
            Ok(()) => {
                self.placed = true;
                sync_dir(&self.parent);
                Ok(())
            }
            Err(e)
                if matches!(
                    e.kind(),
                    std::io::ErrorKind::DirectoryNotEmpty | std::io::ErrorKind::AlreadyExists
                ) =>
            {
                Err(VaultError::NotEmpty(dir.to_path_buf()))
            }
            Err(e) => Err(e.into()),
        }
    }
}

impl Drop for Staging {
    fn drop(&mut self) {
        if !self.placed {
            let _ = fs::remove_dir_all(&self.tmp);
        }
    }
}

/// Erase the staging folders beside a vault named `name` in `parent` that
/// no process holds (see [`Staging`]). Best effort: one that cannot be
/// read or erased is left.
fn sweep_stale_staging(parent: &Path, name: &str) {
    let Ok(entries) = fs::read_dir(parent) else {
        return;
    };
    let prefix = format!(".{name}.");
    for entry in entries.flatten() {
        let file_name = entry.file_name();
        let Some(rest) = file_name.to_str().and_then(|n| n.strip_prefix(&prefix)) else {
            continue;
        };
        let ours = STAGING_KINDS.iter().any(|kind| {
            rest.strip_prefix(kind)
                .and_then(|r| r.strip_prefix('-'))
                .is_some_and(|hex| hex.len() == 12 && hex.bytes().all(|b| b.is_ascii_hexdigit()))
        });
        // A real folder only: never a link's target.
        if !ours || !entry.file_type().is_ok_and(|t| t.is_dir()) {
            continue;
        }
        let path = entry.path();
        let Ok(folder) = fs::File::open(&path) else {
            continue;
        };
        // Held: a process is making a vault there now.
        if folder.try_lock().is_ok() {
            let _ = fs::remove_dir_all(&path);
        }
    }
}

/// An empty vault at `tmp`: a bare repository (no refs yet), `memvault/`
/// with its format and lock files.
pub(crate) fn skeleton(tmp: &Path) -> Result<Repository, VaultError> {
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
    Ok(repo)
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
        // Build the vault in a sibling folder and move it into place at
        // the end, so a crash never leaves a half-made vault at `dir`.
        let staging = Staging::new(dir, "init")?;
        let keyring = Self::build(&staging.tmp, secret, &config)?;
        staging.place(dir)?;
        let repo = Repository::open_bare(dir)?;
        let wal = Wal::open(dir)?;
        let mut vault = Self::finish_open(dir, repo, wal, keyring, attribution)?;
        // A new vault has exactly one slot: the one it was created with.
        vault.unlocked_slot = vault.key_state.slots.keys().next().cloned();
        Ok(vault)
    }

    fn build(tmp: &Path, secret: InitSecret, config: &VaultConfig) -> Result<Keyring, VaultError> {
        let repo = skeleton(tmp)?;

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
        let commit = write_commit(&repo, &keys, &tree, &[], &meta, 1)?;
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
        // A folder with no `memvault/` is not a vault; one with it is
        // checked first (no link, not open to others, state files regular),
        // so a format file that is a FIFO or a link is said as such.
        if std::fs::symlink_metadata(dir.join("memvault")).is_err() {
            return Err(VaultError::NotAVault(dir.to_path_buf()));
        }
        // Before anything is read or written: no link, not open to others.
        fsx::check_vault(dir)?;
        if !dir.join(FORMAT_FILE).is_file() {
            return Err(VaultError::NotAVault(dir.to_path_buf()));
        }
        read_format(dir)?;
        // The slots are read, one is opened, then the key state is loaded
        // where the keys ref points by then: another process's `rekey` in
        // between makes it a state the opened keyring cannot check. That
        // is no damage: the open starts over from the new slots (a few
        // times at most).
        let mut moved = 0;
        loop {
            let repo =
                Repository::open_bare(dir).map_err(|_| VaultError::NotAVault(dir.to_path_buf()))?;
            // Before unlock the log's tags cannot be checked: this read only
            // finds the keyslots; `finish_open` reads it again, checked,
            // before anything of it is used or written to git.
            let mut wal = Wal::open(dir)?;
            wal.catch_up(&repo)?;
            // As in `refresh`: a ref may name objects of a newer log record.
            let mut attempt = 0;
            let (at, slots) = loop {
                let at = wal.ref_target(&repo, keys::KEYS_REF)?;
                match keys::read_slots_at(&repo, at) {
                    Ok((_, s)) => break (at, s),
                    Err(VaultError::Damaged(_) | VaultError::Object(_)) if attempt < 3 => {
                        attempt += 1;
                        wal.catch_up(&repo)?;
                    }
                    Err(e) => return Err(keys_ref_set_aside(&repo, &wal, at, secret).unwrap_or(e)),
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
                None if tried => {
                    return Err(keys_ref_set_aside(&repo, &wal, at, secret)
                        .or_else(|| removed_slot_hint(dir, &slots))
                        .unwrap_or(VaultError::WrongSecret));
                }
                None => return Err(VaultError::NoSlotOfKind),
            };
            match Self::finish_open(dir, repo, wal, keyring, attribution.clone()) {
                Ok(mut vault) => {
                    note_last_slot(dir, &slot);
                    vault.unlocked_slot = Some(slot);
                    return Ok(vault);
                }
                Err(_) if moved < 3 && keys_ref_moved(dir, at) => moved += 1,
                Err(e) => return Err(e),
            }
        }
    }

    /// A second, independent handle on this vault (its own repository
    /// handle and writer-lock descriptor), e.g. for a sweeper thread.
    pub fn reopen(&self, attribution: Attribution) -> Result<Vault, VaultError> {
        fsx::check_vault(&self.dir)?;
        let repo = Repository::open_bare(&self.dir)
            .map_err(|_| VaultError::NotAVault(self.dir.clone()))?;
        let wal = Wal::open(&self.dir)?;
        let mut vault =
            Self::finish_open(&self.dir, repo, wal, self.keyring.duplicate(), attribution)
                .map_err(|e| match e {
                    // The key state is of a newer epoch than this handle's
                    // keyring (as `refresh` says it): another process rekeyed.
                    VaultError::Damaged(_) if self.rekeyed_since() => {
                        super::slots::rekeyed_elsewhere()
                    }
                    e => e,
                })?;
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
        let key_state = Self::load_key_state(&repo, &mut wal, &keys)?;
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
        // (Below, once the vault is built: a checkpoint first takes in any
        // key-table shards the log holds beyond the key state, format 7.)
        let recover =
            c.records || !c.clean || wal.head_is_v1() == Some(true) || !wal.refs_consistent(&repo);
        // Format 2 keeps the settings in the key state, authenticated;
        // format 1 in a plain file, until `migrate` moves them.
        let config = match &key_state.settings {
            Some(s) => s.clone(),
            None => load_config(dir)?,
        };
        // A plain settings file beside settings kept in the key state was
        // written by someone: refused before the open writes anything (a
        // checkpoint of the log below), so that "nothing was changed" holds.
        // (With a format file under 2 it is what a format-1 migration a
        // crash interrupted left: `migrate_settings` removes it.)
        if key_state.format >= 2
            && read_format(dir)? >= 2
            && dir.join(CONFIG_FILE).symlink_metadata().is_ok()
        {
            return Err(VaultError::StraySettings);
        }
        let lock = std::sync::Arc::new(fsx::open_rw(&dir.join(LOCK_FILE))?);
        let vault = Vault {
            dir: dir.to_path_buf(),
            repo,
            keys,
            keyring,
            key_state,
            config,
            verified_tip: None,
            file_count_saved: std::cell::Cell::new(None),
            file_count_read: std::cell::Cell::new(false),
            tip_date: None,
            attribution,
            principal: None,
            lock,
            caches: Caches::default(),
            wal,
            log: LogState::default(),
            unlocked_slot: None,
            access_log: std::cell::RefCell::new(None),
            access_limit: std::cell::Cell::new(0),
            access_len: std::cell::Cell::new(None),
            fresh_tip: None,
            refs_hint: None,
            stored: std::cell::Cell::new(None),
            quota: None,
            quota_refused: None,
            machine: std::cell::OnceCell::new(),
        };
        let mut vault = vault;
        // Before anything here writes a key state (the fold of the log's
        // shards below, the migration after): see `migrate_key_state`.
        vault.refuse_beside_an_older_serve()?;
        if recover {
            let _guard = FileLock::exclusive_on(&vault.lock).map_err(VaultError::Lock)?;
            // The log's shards need a key state that takes them in before
            // the checkpoint (format 7). One that cannot be written (a
            // damaged key state) leaves the log as it is: the vault still
            // opens, reads through the log, and each command reports the
            // damage (`verify` locates it).
            // So does a full disk: the log keeps every record (reads go
            // through it, writes fail with the disk full), and the next
            // open or checkpoint with room moves it into git.
            // So does a main this key state's keys did not MAC (a key ref
            // or a log put back from a copy, a forged commit): the
            // checkpoint would reset the log before any command saw the
            // damage, which each then reports having changed nothing.
            // A rollback the checkpoint would refuse is still said as such.
            // A format 3-8 vault's fold writes a key state of format 5,
            // which a memvault of format 8 calls damage: the format file
            // says 9 first, so that one killed between the two still has
            // older memvaults say "upgrade memvault". (The migration keys
            // on the key state, not the file.)
            if (3..5).contains(&vault.key_state.format) && read_format(&vault.dir)? < FORMAT {
                write_durable(&vault.dir.join(FORMAT_FILE), format_line(FORMAT).as_bytes())?;
            }
            // A ref moved back, set sideways or removed outside memvault is
            // refused before anything is written (the fold below appends to
            // the log).
            judge_refs(&vault.repo, &vault.wal)?;
            let foldable = if vault.main_macs_hold() {
                match vault.fold_at_open() {
                    Ok(()) => true,
                    Err(e) if e.is_damage() || e.is_disk_full() => false,
                    Err(e) => return Err(e),
                }
            } else {
                false
            };
            if foldable {
                match vault.checkpoint_locked() {
                    Ok(()) => {}
                    Err(e) if e.is_disk_full() => {}
                    Err(e) => return Err(e),
                }
                vault.key_state = Self::load_key_state(&vault.repo, &mut vault.wal, &vault.keys)?;
                vault.log.keys_seen = None;
                if let Some(s) = &vault.key_state.settings {
                    vault.config = s.clone();
                }
            }
        }
        match vault.migrate() {
            Ok(()) => {}
            // A damaged format-1 vault stays of format 1: each command
            // reports the damage (as below), and a later open migrates it
            // once it is mended.
            Err(e) if e.is_damage() => {}
            Err(e) => return Err(e),
        }
        vault.log.defer_keys = read_format(&vault.dir).is_ok_and(|f| f >= FORMAT);
        // A damaged tip is reported by each command, not here, so that a
        // server can still start and say what is wrong.
        Ok(vault)
    }

    /// Whether main, as its ref file names it (if git holds that commit)
    /// and as the log's newest record names it, was MAC'd with this key
    /// state's keys.
    pub(crate) fn main_macs_hold(&self) -> bool {
        let disk = self
            .repo
            .refname_to_id(MAIN_REF)
            .ok()
            .filter(|id| self.repo.odb().is_ok_and(|odb| odb.exists(*id)));
        [disk, self.wal.tail_target(MAIN_REF)]
            .into_iter()
            .flatten()
            .all(|id| verify_commit_mac(&self.repo, &self.keys, id))
    }

    /// Bring a vault to its current format: format 1's settings into the
    /// key state (format 2), then every directory under bucket trees
    /// (format 3).
    fn migrate(&mut self) -> Result<(), VaultError> {
        self.migrate_settings()?;
        self.migrate_tree()?;
        self.migrate_key_state()
    }

    /// Refuse to open a vault whose key state is of format 3 or 4 while a
    /// `serve` leads on it: that `serve` is an older memvault's (a newer
    /// one moves the key state to format 5 when it opens the vault). It
    /// cannot read a key state this memvault writes (at the fold of the
    /// log's shards, or the migration), and a `serve` of this memvault
    /// would relay its client's requests to it.
    fn refuse_beside_an_older_serve(&self) -> Result<(), VaultError> {
        if (3..5).contains(&self.key_state.format) && serve_leads(&self.dir) {
            return Err(VaultError::Refused(
                "a `memvault serve` of an older version is running on this vault: stop it (and every older memvault using the vault) first, as this version's first open moves the vault to format 9, which older versions cannot read; nothing was changed".into(),
            ));
        }
        Ok(())
    }

    /// A migration's commit metadata: booked to memvault itself (session
    /// `migrate`, actor `memvault`, as `init` is), not to the session or
    /// agent whose open happened to run it, so that `history --session`,
    /// `sessions` and a revert of that session do not show it as theirs.
    fn migration_meta(&self) -> CommitMeta {
        CommitMeta {
            session: "migrate".into(),
            actor: "memvault".into(),
            principal: None,
            ..self.new_meta("migrate")
        }
    }

    /// Give a vault of format 3 to 8 (a key state `v3` or `v4`) a key
    /// state of format 5, once, under the writer lock: the same content in
    /// a new key state, in a `migrate` commit on main, before this
    /// memvault writes a tree the way format 9 does. A memvault of format
    /// 8 refuses a `v5` key state, so one that reaches the vault through a
    /// remote (`pull`, `clone`) refuses it rather than misreads it (it
    /// looks for entries at the full depth of their buckets only). The
    /// key state decides, not the format file.
    fn migrate_key_state(&mut self) -> Result<(), VaultError> {
        if !(3..5).contains(&self.key_state.format) {
            return Ok(());
        }
        self.refuse_beside_an_older_serve()?;
        self.with_writer_lock(|vault, tip| {
            if vault.key_state.format >= 5 {
                return Ok(()); // another process migrated it meanwhile
            }
            let meta = CommitMeta {
                // (Not which format the vault had: its format file may
                // say 9 already, see `finish_open`.)
                details: vec![format!(
                    "vault format {FORMAT}: key state format {} -> 5, which older memvaults refuse",
                    vault.key_state.format
                )],
                ..vault.migration_meta()
            };
            let change = KeyChange {
                settings: Some(vault.config.clone()),
                ..Default::default()
            };
            vault.publish_key_change(tip, change, meta)?;
            vault.sync_now()
        })
    }

    /// Bring the tip's tree of a format-2 vault to format 3, once, under
    /// the writer lock: every file moved under the buckets of its names
    /// (see `tree::buckets`; as format 9 places them since), its blob
    /// unchanged, and the key table split into 4096 shards, in one
    /// `migrate` commit; then the format file says the current format.
    /// The key state decides, not the format file (a format file set back
    /// to 2 over a migrated vault changes nothing but the file). Readers
    /// take every form, so history before the migration reads as it did.
    fn migrate_tree(&mut self) -> Result<(), VaultError> {
        self.refresh()?;
        // The key state decides (format 9 trees hold entries directly
        // too): a format-2 key state has 256 shards, and is replaced by
        // the migration's.
        if self.key_state.format >= 3 {
            return self.raise_format_file(FORMAT);
        }
        self.with_writer_lock(|vault, tip| {
            if vault.key_state.format >= 3 {
                return Ok(()); // another process migrated it meanwhile
            }
            let files = vault.snapshot_of(tip)?.files_with_keys()?;
            let mut update = TreeEdits::memory();
            let mut blobs = Vec::with_capacity(files.len());
            {
                let snap = vault.snapshot_of(tip)?;
                for (path, _, _) in &files {
                    let Some((oid, NodeKind::File)) = snap.entry(path)? else {
                        return Err(damaged("a file vanished from the tree being read"));
                    };
                    blobs.push(oid);
                }
            }
            for ((_, git_path, _), oid) in files.iter().zip(blobs) {
                update.upsert(&tree::fanned_git_path(git_path), oid);
            }
            let mut objects = Vec::new();
            let tree = update.write(&vault.repo, &vault.caches, None, &mut objects)?;
            let meta = CommitMeta {
                details: vec![format!(
                    "vault format 2 -> 3: {} files moved under bucket trees",
                    files.len()
                )],
                ..vault.migration_meta()
            };
            // The key state too: format 3's 4096 shards (a new key state
            // with the same settings is written with them).
            let change = KeyChange {
                settings: Some(vault.config.clone()),
                ..Default::default()
            };
            vault.publish(tip, tree, change, &meta, objects)?;
            vault.sync_now()
        })?;
        self.raise_format_file(FORMAT)
    }

    /// Make the format file say `n` if it says less, under the writer
    /// lock: processes opening a vault at once wrote it over each other
    /// (its temporary file is one name), and some failed.
    fn raise_format_file(&self, n: u32) -> Result<(), VaultError> {
        if read_format(&self.dir)? >= n {
            return Ok(());
        }
        let _guard = FileLock::exclusive_on(&self.lock).map_err(VaultError::Lock)?;
        if read_format(&self.dir)? < n {
            write_durable(&self.dir.join(FORMAT_FILE), format_line(n).as_bytes())?;
        }
        Ok(())
    }

    /// Bring a vault of format 1 to format 2, once, under the writer lock:
    /// its plain settings file becomes the authenticated settings of a new
    /// key state (whose counter main's commits name from now on), in a
    /// `migrate` commit on main; then the plain file is removed, and only
    /// then does the format file say 2. The key state decides (it is MAC'd, the format file
    /// is not): a format-2 key state is never migrated again, so writing
    /// "1" into the format file cannot bring a plain settings file back.
    fn migrate_settings(&mut self) -> Result<(), VaultError> {
        if self.key_state.format >= 2 {
            if read_format(&self.dir)? < 2 {
                // A migration a crash interrupted after its commit (or a
                // format file set back by hand: the key state decides).
                remove_plain_settings(&self.dir)?;
                write_durable(&self.dir.join(FORMAT_FILE), format_line(2).as_bytes())?;
            }
            // Settings live in the key state: a plain settings file beside
            // them was written by someone, and is refused rather than
            // silently not read.
            if self.dir.join(CONFIG_FILE).symlink_metadata().is_ok() {
                return Err(VaultError::StraySettings);
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
                ..vault.migration_meta()
            };
            let change = KeyChange {
                settings: Some(settings),
                ..Default::default()
            };
            // Format 1's first commit names the empty tree without
            // storing it (`git fsck` reported it missing); stored now.
            // (Written to disk directly: the migration's log record holds
            // only what its commit adds, and the first commit is older.)
            let empty = Object {
                kind: git2::ObjectType::Tree,
                id: Oid::from_str(retention::erase::EMPTY_TREE).expect("a valid id"),
                data: Vec::new(),
            };
            wal::write_durable_objects(&vault.repo, &[&empty], false)?;
            vault.publish_key_change(tip, change, meta)?;
            vault.sync_now()
        })?;
        // The plain file goes before the format file says 2: a crash
        // between the two then leaves a format file under 2 beside a
        // format-2 key state, which the next open finishes (above). In the
        // other order it left a plain file beside a format file saying 2,
        // refused by every open as written by someone.
        retention::erase::test_crash("settings-migrated");
        remove_plain_settings(&self.dir)?;
        retention::erase::test_crash("plain-settings-removed");
        write_durable(&self.dir.join(FORMAT_FILE), format_line(2).as_bytes())?;
        Ok(())
    }

    /// Replace the vault's settings whole: a new key state holding them,
    /// with a `config` commit on main naming the settings changed
    /// (`changed`), durably. Refused (nothing changed) if they do not
    /// validate. A change of one setting should go through
    /// [`update_config`](Self::update_config), which does not undo another
    /// process's change made since this handle read the settings.
    pub fn set_config(
        &mut self,
        config: VaultConfig,
        changed: Vec<String>,
    ) -> Result<(), VaultError> {
        self.update_config(|_| Ok::<_, VaultError>(Some((config, changed))))
            .map(|_| ())
    }

    /// Change the vault's settings from what they are under the writer
    /// lock: `change` gets the current settings (another process's change
    /// included, which it must keep) and returns the new settings and the
    /// details of the `config` commit, or `None` to change nothing. A new
    /// key state holds them, durably. Refused (nothing changed) if they do
    /// not validate. Returns whether anything changed.
    pub fn update_config<E: From<VaultError>>(
        &mut self,
        change: impl FnOnce(&VaultConfig) -> Result<Option<(VaultConfig, Vec<String>)>, E>,
    ) -> Result<bool, E> {
        self.with_writer_lock(|vault, tip| {
            let Some((config, changed)) = change(&vault.config)? else {
                return Ok(false);
            };
            if config == vault.config {
                return Ok(false);
            }
            config.validate_change().map_err(VaultError::Config)?;
            let meta = CommitMeta {
                details: changed,
                ..vault.new_meta("config")
            };
            let change = KeyChange {
                settings: Some(config),
                ..Default::default()
            };
            vault.publish_key_change(tip, change, meta)?;
            vault.sync_now()?;
            Ok(true)
        })
    }
}

/// Remove format 1's plain settings file (once its settings are in the
/// key state), durably.
fn remove_plain_settings(dir: &Path) -> Result<(), VaultError> {
    match fs::remove_file(dir.join(CONFIG_FILE)) {
        Ok(()) => sync_dir(&dir.join(STATE_DIR)),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
        Err(e) => return Err(e.into()),
    }
    Ok(())
}

fn format_line(n: u32) -> String {
    format!("{FORMAT_PREFIX}{n}\n")
}

/// The format number of the vault at `dir`: refused if it is not a vault
/// or is newer than this memvault.
fn read_format(dir: &Path) -> Result<u32, VaultError> {
    let not_a_vault = || VaultError::NotAVault(dir.to_path_buf());
    // Missing: not a vault. There but not a format line (not text, too
    // large, not a file, a link): a damaged one. Anything else (no
    // permission) as it is.
    let text = fsx::read_to_string(&dir.join(FORMAT_FILE), fsx::SMALL).map_err(|e| {
        use std::io::ErrorKind as K;
        match e.kind() {
            K::NotFound | K::NotADirectory => not_a_vault(),
            K::InvalidData | K::Other => VaultError::BadFormatFile,
            _ => e.into(),
        }
    })?;
    let n: u32 = text
        .strip_prefix(FORMAT_PREFIX)
        .and_then(|t| t.strip_suffix('\n'))
        // Digits as memvault writes them: no sign, no leading zero.
        .filter(|t| t.bytes().all(|b| b.is_ascii_digit()) && !t.starts_with('0'))
        .and_then(|t| t.parse().ok())
        .filter(|n| *n >= 1)
        .ok_or(VaultError::BadFormatFile)?;
    if n > FORMAT {
        return Err(VaultError::NewerFormat(n));
    }
    Ok(n)
}

fn load_config(dir: &Path) -> Result<VaultConfig, VaultError> {
    let path = dir.join(CONFIG_FILE);
    let config = match fsx::read_max(&path, fsx::LIST) {
        Ok(bytes) => serde_json::from_slice::<VaultConfig>(&bytes).map_err(|_| {
            VaultError::Config("memvault/config.json does not parse as vault settings")
        })?,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => VaultConfig::default(),
        Err(e) => return Err(e.into()),
    };
    config.validate().map_err(VaultError::Config)?;
    Ok(config)
}

/// This machine's note of the keyslot it last unlocked the vault with:
/// only the wording of an error (a secret that opens nothing, where that
/// slot is gone from the key state, is told the slot was removed). Not
/// secret (slot ids are listed by `key list`) and not authenticated.
const LAST_SLOT: &str = "memvault/last-slot";

fn valid_slot_name(name: &str) -> bool {
    (1..=64).contains(&name.len())
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_')
}

fn last_slot(dir: &Path) -> Option<String> {
    let text = fsx::read_to_string(&dir.join(LAST_SLOT), fsx::SMALL).ok()?;
    let name = text.strip_prefix("v1 ")?.strip_suffix('\n')?;
    valid_slot_name(name).then(|| name.to_string())
}

/// Note `slot` as the one this machine last unlocked with (when it
/// changed; best effort: a read-only vault opens all the same).
fn note_last_slot(dir: &Path, slot: &str) {
    if valid_slot_name(slot) && last_slot(dir).as_deref() != Some(slot) {
        let _ = write_durable(&dir.join(LAST_SLOT), format!("v1 {slot}\n").as_bytes());
    }
}

/// When no keyslot of the current key state (`current`) opens with the
/// secret: if the slot this machine last unlocked with is gone from it,
/// say so (it was removed here, or on a machine this one synced with).
fn removed_slot_hint(dir: &Path, current: &BTreeMap<String, Vec<u8>>) -> Option<VaultError> {
    let slot = last_slot(dir)?;
    (!current.contains_key(&slot)).then_some(VaultError::SlotRemoved(slot))
}

impl Vault {
    /// Whether the key state the keys ref names now claims a newer
    /// data-key epoch than this handle's keys (unchecked: only to say why
    /// a reopen failed).
    fn rekeyed_since(&self) -> bool {
        keys_now(&self.dir).is_some_and(|(repo, at)| {
            at.and_then(|at| keys::mac_epoch(&repo, at))
                .is_some_and(|e| e > self.keys.current_epoch())
        })
    }
}

/// Whether the keys ref of the vault at `dir` names another key state
/// than `at` now (the log caught up first): an open that failed after
/// reading its slots at `at` raced a key change, and starts over.
fn keys_ref_moved(dir: &Path, at: Option<Oid>) -> bool {
    keys_now(dir).is_some_and(|(_, now)| now != at)
}

/// The vault at `dir` as a new handle would find it: its repository and
/// where the keys ref points (the log caught up first). None: unreadable.
fn keys_now(dir: &Path) -> Option<(Repository, Option<Oid>)> {
    let repo = Repository::open_bare(dir).ok()?;
    let mut wal = Wal::open(dir).ok()?;
    wal.catch_up(&repo).ok()?;
    let at = wal.ref_target(&repo, keys::KEYS_REF).ok()?;
    Some((repo, at))
}

/// When the key state the keys ref names gives no keyslot this secret
/// opens: if the log names another key state, one of its keyslots opens
/// with the secret, and the log's tags check out under the key it gives,
/// the secret is right and the ref was set outside memvault (a clearer
/// error than "no keyslot" or "wrong secret", with the way back). Only an
/// error's hint: nothing here opens the vault.
fn keys_ref_set_aside(
    repo: &Repository,
    wal: &Wal,
    at: Option<Oid>,
    secret: &Unlock<'_>,
) -> Option<VaultError> {
    let logged = wal.tail_target(keys::KEYS_REF)?;
    if Some(logged) == at {
        return None;
    }
    // A ref newer than the log's (a higher counter) was not set aside:
    // the log is the older one (put back from a copy), and its key state
    // may hold a slot since removed. Rolling the ref back to it would be
    // the wrong advice.
    if let Some(a) = at {
        let counter = |id: Oid| {
            crate::vault::objects::check(repo, id).ok()?;
            keys::read_header(repo, id).ok().map(|(_, c)| c)
        };
        if let (Some(disk), Some(log)) = (counter(a), counter(logged))
            && disk > log
        {
            return None;
        }
    }
    let (_, slots) = keys::read_slots_at(repo, Some(logged)).ok()?;
    let keyring = slots
        .values()
        .find_map(|b| crypto::open_slot(b, secret).ok())?;
    // The log's tags checked with the key that slot gives: the id named
    // is one this vault's own log holds.
    let mut checked = Wal::open(repo.path()).ok()?;
    checked.set_key(VaultKeys::derive(&keyring).log_key());
    checked.read_all().ok()?;
    if checked.tail_target(keys::KEYS_REF) != Some(logged) {
        return None;
    }
    let name = keys::KEYS_REF;
    let what = match at {
        Some(a) => {
            format!("was set outside memvault to {a}, which has no keyslot this secret opens")
        }
        None => "was removed outside memvault".to_string(),
    };
    Some(VaultError::RolledBack(format!(
        "the key state ({name}) {what}, while the log (memvault/wal) names {logged}, whose keyslot it opens; put the ref back by writing that id into the file {name} in the vault directory"
    )))
}

/// Whether a `serve` process leads on the vault at `dir` now (it holds
/// `memvault/serve.lock`; see `cli::serve`).
fn serve_leads(dir: &Path) -> bool {
    let Ok(lead) = fsx::open_rw(&dir.join("memvault/serve.lock")) else {
        return false;
    };
    match lead.try_lock() {
        Ok(()) => {
            let _ = lead.unlock();
            false
        }
        Err(std::fs::TryLockError::WouldBlock) => true,
        Err(_) => false,
    }
}
