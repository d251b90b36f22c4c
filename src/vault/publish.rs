//! The write path: a mutation of the memory layer made into sealed blobs,
//! edited trees and a MAC'd commit, and the one publish path that puts a
//! commit on main, with the key-state change it needs, in one record of
//! the write-ahead log; and the binding of the key state to main.

use super::*;

impl Vault {
    /// Apply one mutation on top of `parent` and move main to it. The
    /// caller holds the writer lock.
    pub(crate) fn apply(&mut self, parent: Option<Oid>, m: Mutation) -> Result<(), StoreError> {
        let mut meta = CommitMeta {
            lines_added: m.facts.lines_added,
            lines_removed: m.facts.lines_removed,
            redactions: m.facts.redactions,
            ..self.new_meta(m.op.as_str())
        };
        let mut new_key: Option<(FileKeyId, FileKey)> = None;
        let mut written: Vec<FileKeyId> = Vec::new();
        let mut files_after: Option<usize> = None;
        // How the number of files changes, when it is known without a walk
        // (an edit or a rename: none; a delete: the files below the path).
        let mut files_change: Option<isize> = None;
        let base_tree: Option<Oid>;
        // Every object the new tree adds, with its bytes, for the log.
        let mut objects: Vec<Object> = Vec::new();
        let adds_content = !matches!(m.change, Change::Delete { .. });
        let new_tree = {
            let base = self.tree_of(parent)?;
            base_tree = base;
            let snap =
                VaultSnapshot::new(&self.repo, &self.keys, &self.key_state, &self.caches, base);
            let mut update = TreeEdits::memory();
            match m.change {
                Change::Write { path, content } => {
                    // The git path is found once (a name encryption per
                    // segment): for the lookup and for the edit.
                    let (git_path, at) = snap.locate(&path)?;
                    // Over the limit only as far as the file already was
                    // (a merge of two machines' edits, a lowered limit):
                    // a write may leave it that large, never larger.
                    if content.len() > self.config.max_file_bytes {
                        let was = match at {
                            Some((oid, NodeKind::File)) => snap.blob_plain_size(oid)?,
                            _ => 0,
                        };
                        if content.len() as u64 > was {
                            return Err(StoreError::Limit(format!(
                                "the content is {} bytes, over this vault's limit of {} bytes per file",
                                content.len(),
                                self.config.max_file_bytes
                            )));
                        }
                    }
                    let existing = match at {
                        Some((oid, NodeKind::File)) => Some(snap.blob_key_id(oid)?),
                        _ => None,
                    };
                    if existing.is_some() {
                        files_change = Some(0);
                    }
                    let mut fresh: Option<(FileKeyId, FileKey)> = None;
                    let (id, key) = match existing {
                        Some(id) => (id, snap.file_key(&id)?),
                        None => {
                            // Known in this process, or from the count the
                            // last process left for this tree, or walked.
                            let files = match base.and_then(|b| self.cached_file_count(b)) {
                                Some(n) => n,
                                None => snap.count_files()?,
                            };
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
                    let oid = stage_blob(&self.repo, sealed, &mut objects)?;
                    if let Some(o) = objects.last() {
                        self.caches.remember_blob(oid, &o.data);
                    }
                    update.upsert(&git_path, oid);
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
                    files_change = isize::try_from(meta.files.len()).ok().map(|n| -n);
                    update.remove(&snap.locate(&path)?.0);
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
                        update.upsert(&snap.locate(&target)?.0, oid);
                    }
                    update.remove(&snap.locate(&from)?.0);
                    meta.files = files.iter().map(|p| p.as_str().to_string()).collect();
                    meta.path = Some(from.as_str().to_string());
                    meta.new_path = Some(to.as_str().to_string());
                    files_change = Some(0);
                }
            }
            drop(snap);
            update
                .write(&self.repo, &self.caches, base, &mut objects)
                .map_err(ge)?
        };
        // The new tree's file count, where the base's is known: the next
        // create's limit check, and the count this process leaves behind
        // (`memvault/file-count`), then need no walk of every tree.
        let base_count = match base_tree {
            None => Some(0),
            Some(b) => self.cached_file_count(b),
        };
        let after = files_after.or_else(|| {
            let n = isize::try_from(base_count?)
                .ok()?
                .checked_add(files_change?)?;
            usize::try_from(n).ok()
        });
        if let Some(quota) = self.quota.filter(|_| adds_content) {
            // Its blobs and trees, and the paths its commit will name (a
            // folder's rename every file in it; a rename the old path and
            // the new), sealed and in base64 in the commit: a third more.
            let named = meta
                .files
                .iter()
                .chain(meta.path.iter())
                .chain(meta.new_path.iter())
                .map(|f| f.len() as u64)
                .sum::<u64>();
            let adds = objects.iter().map(|o| o.data.len() as u64).sum::<u64>() + named * 4 / 3;
            let stored = self.stored_bytes();
            if stored.saturating_add(adds) > quota {
                let why = QuotaRefusal {
                    stored,
                    adds,
                    quota,
                };
                self.quota_refused = Some(why);
                return Err(StoreError::Limit(why.to_string()));
            }
        }
        if let Some(n) = after {
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
        // Under the writer lock, exclusively: views alone grew it. A
        // failure leaves the log as it was, for the next write to retry.
        let _ = self.compact_access_if_grown();
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
        self.publish_with(parent, None, tree, change, meta, objects)
    }

    /// [`publish`](Self::publish) of a merge: a commit with a second
    /// parent, `other` (a commit this vault holds, checked by the caller).
    pub(crate) fn publish_with(
        &mut self,
        parent: Option<Oid>,
        other: Option<Oid>,
        tree: Oid,
        change: KeyChange,
        meta: &CommitMeta,
        objects: Vec<Object>,
    ) -> Result<Oid, VaultError> {
        let changes_keys = !change.is_empty();
        let result = self.try_publish(parent, other, tree, change, meta, objects);
        if result.is_err() && changes_keys {
            self.reload_keys();
        }
        result
    }

    /// The in-memory tables were edited in place by a change that was
    /// not published: read back the state that is really on disk, with
    /// the shards the log holds beyond it.
    fn reload_keys(&mut self) {
        if let Ok(at) = self.keys_target()
            && self.key_state.reload(&self.repo, &self.keys, at).is_ok()
        {
            self.key_state.apply_pending(self.wal.pending_keys().0);
            self.log.keys_seen = Some(self.wal.pending_keys().1);
        }
    }

    /// Under the writer lock, caught up, with the key state refreshed: if
    /// the log holds shards no key state holds yet (format 7: each create
    /// logs its shard alone, see [`KeyState::stage_deferred`]), log a new
    /// key state that takes them all in, and nothing else (main does not
    /// move). A checkpoint runs this first, so git alone always holds
    /// every file's key.
    pub(crate) fn fold_keys(&mut self) -> Result<(), VaultError> {
        if self.key_state.pending.is_empty() {
            return Ok(());
        }
        let result = self.try_fold_keys();
        if result.is_err() {
            self.reload_keys();
        }
        result
    }

    fn try_fold_keys(&mut self) -> Result<(), VaultError> {
        let old = self.key_state.commit;
        let tip = self.wal.tail_target(MAIN_REF);
        let clock = self.clock(tip.into_iter())?;
        let change = KeyChange {
            bump: true,
            ..Default::default()
        };
        let staged =
            self.key_state
                .stage_changes(&self.repo, &self.keys, &self.caches, change, clock)?;
        let mut record = Record::default();
        self.key_state
            .add_to_record(&self.repo, &mut record, old, staged)?;
        self.wal.append(record)?;
        self.log.unsynced = true;
        self.log.dirty = true;
        self.key_state.published(&self.repo, staged);
        self.log.keys_seen = Some(self.wal.pending_keys().1);
        if let Some((commit, _, _)) = self.verified_tip {
            self.verified_tip = Some((commit, staged, self.key_state.bound_counter()));
        }
        Ok(())
    }

    fn try_publish(
        &mut self,
        parent: Option<Oid>,
        other: Option<Oid>,
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
        // Any other key change (a key destroyed, keyslots, settings, a
        // rekey, a merge) starts from a key state holding every shard the
        // log holds: the state it replaces then holds the shards it drops,
        // and goes to the garbage an erasure prunes (a destroyed key must
        // not stay behind in a shard blob no key state names).
        let defer = self.log.defer_keys && self.key_state.can_defer(&change);
        if !change.is_empty() && !defer && !self.key_state.pending.is_empty() {
            self.try_fold_keys()?;
        }
        let old_keys = self.key_state.commit;
        // A new keyring (rekey): the key state and the commit are sealed and
        // MAC'd under it.
        let keyring = change.keyring.take();
        let new_keys = keyring.as_ref().map(VaultKeys::derive);
        let keys = new_keys.as_ref().unwrap_or(&self.keys);
        let mut record = Record::default();
        let clock = self.clock(parent.into_iter().chain(other).chain(change.merge_parent))?;
        let staged = if change.is_empty() {
            None
        } else if defer {
            // New file keys: the record carries their shards alone (see
            // `KeyState::stage_deferred`); the key state stays as it is.
            let (shards, replaced) = self.key_state.stage_deferred(
                &self.repo,
                keys,
                &self.caches,
                std::mem::take(&mut change.files),
            )?;
            record.objects.extend(shards);
            record.keys = replaced;
            None
        } else {
            let staged =
                self.key_state
                    .stage_changes(&self.repo, keys, &self.caches, change, clock)?;
            self.key_state
                .add_to_record(&self.repo, &mut record, old_keys, staged)?;
            Some(staged)
        };
        let mut meta = meta.clone();
        meta.keys = Some(self.key_state.bound_counter());
        let parents: Vec<Oid> = parent.into_iter().chain(other).collect();
        objects::check(&self.repo, tree)?;
        // The clock is past every parent's date.
        let object = write_main_commit(&self.repo, keys, tree, &parents, &meta, clock as i64)?;
        let commit = object.id;
        record.objects.push(object);
        record.objects.extend(objects);
        record.refs.push((MAIN_REF.to_string(), commit));
        // The record moves the refs: the log's tail is where they point
        // (ref files follow at the next checkpoint). The acknowledgement
        // point is the sync of this record (see `with_writer_lock`).
        self.wal.append(record)?;
        self.log.unsynced = true;
        // This handle's key state is the log's (it was caught up).
        self.log.keys_seen = Some(self.wal.pending_keys().1);
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
        self.verified_tip = Some((
            commit,
            self.key_state.commit,
            self.key_state.bound_counter(),
        ));
        self.tip_date = Some((commit, clock));
        // The next request's snapshot needs the tree: known, not read back.
        *self.caches.commit_tree.borrow_mut() = Some((commit, tree));
        Ok(commit)
    }

    /// The date of the next main commit and of the key state written with
    /// it: one past every date of the commits they name as parents
    /// (`parents`) or may (the current key state). git orders its walks by
    /// date, so main and the key state share this one clock: in a fetch,
    /// the commits a machine offers from both (newest first) then reach
    /// the remote's last tips of both within a round or two, where with a
    /// clock each the newer of the two histories was walked first.
    fn clock(&self, parents: impl Iterator<Item = Oid>) -> Result<u64, VaultError> {
        let mut date = 0u64;
        for c in parents.chain([self.key_state.commit]) {
            // Known without a read: the commits this handle wrote last.
            let known = match self.tip_date {
                Some((tip, d)) if tip == c => Some(d),
                _ if c == self.key_state.commit => self.key_state.known_date(),
                _ => None,
            };
            let d = match known {
                Some(d) => d,
                None if c.is_zero() => continue,
                None => {
                    objects::check(&self.repo, c)?;
                    let s = self.repo.find_commit(c)?.committer().when().seconds();
                    u64::try_from(s).unwrap_or(0)
                }
            };
            date = date.max(d);
        }
        // Within git's (signed) dates, as the commit says it.
        Ok(date.saturating_add(1).min(i64::MAX as u64))
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
        let base = self.tree_of(base)?;
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
            Some(t) => t,
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
            principal: self.principal.clone(),
            machine: self
                .machine
                .get_or_init(|| sync::machine_label(&self.dir))
                .clone(),
            ..Default::default()
        }
    }

    /// Check that the key state is not older than the tip requires: the
    /// tip names the counter of the key state written with it, and an
    /// erasure's tombstone names the keys that must be gone (a format-1
    /// commit names no counter, but its tombstone still binds).
    pub(crate) fn check_binding(&self, tip: Oid) -> Result<(), VaultError> {
        let meta = self.meta_of(tip)?;
        let ks = &self.key_state;
        // While the log holds shards no key state took in, the tip may name
        // the counter of the state that will (see `KeyState::bound_counter`).
        let older = meta.keys.is_some_and(|k| k > ks.bound_counter());
        let erasure_pending = self.dir.join(erase::MARKER).exists();
        let mut unerased = false;
        if !erasure_pending {
            for id in meta
                .erased_keys
                .iter()
                .filter_map(|h| FileKeyId::from_hex(h))
            {
                unerased |= ks.file_key(&self.repo, &self.keys, &id)?.is_some();
            }
        }
        if older || unerased {
            return Err(VaultError::RolledBack(
                "the key state (refs/memvault/keys) was rolled back: it is older than the newest commit requires"
                    .into(),
            ));
        }
        Ok(())
    }
}

/// Write a sealed blob to the object store and keep its bytes for the log
/// record.
pub(crate) fn stage_blob(
    repo: &Repository,
    sealed: Vec<u8>,
    objects: &mut Vec<Object>,
) -> Result<Oid, VaultError> {
    let id = objects::write_object(repo, git2::ObjectType::Blob, &sealed)?;
    objects.push(Object {
        kind: git2::ObjectType::Blob,
        id,
        data: sealed,
    });
    Ok(id)
}

pub(crate) fn write_commit(
    repo: &Repository,
    keys: &VaultKeys,
    tree: &git2::Tree<'_>,
    parents: &[git2::Commit<'_>],
    meta: &CommitMeta,
    at_least: i64,
) -> Result<Oid, VaultError> {
    // The date git sees is no time: a generation number, one past the
    // parents' (format 6; earlier commits say 0), which tells nothing the
    // graph does not. git orders its walks by date and, with every date
    // equal, walked the whole history to tell what a fetch or push must
    // send (40 ms at 20,000 commits, in each of the several git commands
    // of a sync).
    // At least `at_least`: the clock main shares with the key state (see
    // `Vault::clock`).
    let generation = parents
        .iter()
        .map(|p| p.committer().when().seconds().max(0))
        .max()
        .map_or(1, |g| g.saturating_add(1))
        .max(at_least);
    let ids: Vec<Oid> = parents.iter().map(|p| p.id()).collect();
    Ok(write_main_commit(repo, keys, tree.id(), &ids, meta, generation)?.id)
}

/// [`write_commit`] with the parents' ids and the date given (at least
/// one past every parent's), built without libgit2 reading the tree or
/// the parents: the commit object, for a log record.
pub(crate) fn write_main_commit(
    repo: &Repository,
    keys: &VaultKeys,
    tree: Oid,
    parents: &[Oid],
    meta: &CommitMeta,
    date: i64,
) -> Result<Object, VaultError> {
    let plain = Zeroizing::new(meta::encode(meta));
    // Bound to the first parent (a merge's second parent is under the
    // commit's MAC, as every byte of the commit is).
    let aad = meta_aad(tree, parents.first().copied());
    let sealed = keys.seal_meta(&aad, &plain);
    let message = format!("{}\n", data_encoding::BASE64.encode(&sealed));
    let buf = keys::commit_buffer(tree, parents, date.max(0) as u64, &message);
    keys::write_signed_object(repo, keys, &buf)
}
