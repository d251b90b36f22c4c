//! The tenant vaults a server holds open: at most `max_open` at once (the
//! least recently used closed first), each closed after `idle` without a
//! request, its keys wiped as it is dropped.
//!
//! A tenant's requests run one at a time on its vault; a mutation's log
//! record is made durable by one `fdatasync` outside the vault's lock that
//! covers every record written before it (group commit, as in `serve`), so
//! the reply to a mutation is sent only once it is durable.

use std::collections::HashMap;
use std::fs::File;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use super::registry::HexKey;
use crate::crypto::Unlock;
use crate::memory::{Memory, Store};
use crate::vault::{Attribution, FileCount, Vault, VaultConfig, VaultError, fsync};

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

/// An open tenant vault.
pub struct Open {
    /// Counts this vault among the pool's open ones until it is dropped.
    _counted: Counted,
    pub vault: Vault,
    /// Shared by every vault of the same settings (its redaction filter's
    /// compiled rules are most of an open vault's memory otherwise).
    pub memory: Arc<Memory>,
    /// The settings `memory` was made for.
    memory_config: VaultConfig,
    /// A handle on the log for its syncs, shared with the requests that
    /// sync outside the slot's lock (no `dup` per request: with the
    /// process out of file descriptors, a write was answered as not
    /// durable for want of one).
    log: Arc<File>,
}

impl Open {
    /// Run `f` on the vault under a storage quota of `quota` bytes (see
    /// `Vault::set_quota`): its result, or why a write was refused for
    /// the quota.
    pub fn with_quota<T>(
        &mut self,
        quota: Option<u64>,
        f: impl FnOnce(&mut Open) -> T,
    ) -> Result<T, crate::vault::QuotaRefusal> {
        self.vault.set_quota(quota);
        let _ = self.vault.take_quota_refusal();
        let out = f(self);
        self.vault.set_quota(None);
        match self.vault.take_quota_refusal() {
            Some(why) => Err(why),
            None => Ok(out),
        }
    }
}

/// One open vault in the pool's count, for as long as it lives.
struct Counted(Arc<AtomicUsize>);

impl Counted {
    fn new(count: &Arc<AtomicUsize>) -> Counted {
        count.fetch_add(1, Ordering::SeqCst);
        Counted(count.clone())
    }
}

impl Drop for Counted {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::SeqCst);
    }
}

/// What a request ran, before it is made durable.
pub struct Ran<T> {
    out: T,
    seq: u64,
    log: Option<Arc<File>>,
    due: bool,
}

impl<T> Ran<T> {
    /// Whether [`Slot::durable`] has a sync to make.
    pub fn needs_sync(&self) -> bool {
        self.log.is_some()
    }
}

/// The log size at which a tenant vault checkpoints (a standalone vault:
/// 4 MiB), so that an open vault holds at most about this much of new
/// objects in memory.
const CHECKPOINT_BYTES: u64 = 256 << 10;

/// Why nothing more runs on a tenant whose log failed a sync.
pub const FAILED: &str = "a sync of this tenant's log failed earlier; nothing more is acknowledged for it until the server is restarted (check the disk)";

/// Why a change written to the log was not acknowledged.
pub const NOT_DURABLE: &str =
    "the change was written but could not be made durable (an I/O error); check the disk";

/// A per-tenant token bucket: `rate` requests a second, bursts of twice.
struct Bucket {
    tokens: f64,
    at: Instant,
}

/// One tenant's place in the pool.
pub struct Slot {
    dir: PathBuf,
    key: HexKey,
    state: Mutex<Option<Open>>,
    /// Log records appended through this slot (numbered from 1).
    appended: AtomicU64,
    /// The file count the vault last held when it was closed.
    file_count: Mutex<Option<FileCount>>,
    /// The highest record number known durable; held while syncing.
    synced: Mutex<u64>,
    /// Milliseconds since the pool started, at the last request.
    last_used: AtomicU64,
    bucket: Mutex<Bucket>,
    /// The tenant was removed: no request runs any more.
    gone: AtomicBool,
    /// A sync of its log failed: what it wrote since may not be on disk,
    /// and a later sync can succeed without covering it (the kernel
    /// reports a write-back error once), so nothing more is acknowledged
    /// for this tenant until the server restarts and replays the log.
    failed: AtomicBool,
    /// Requests of this tenant wait here, without holding a thread, for
    /// their turn at the vault.
    pub gate: tokio::sync::Mutex<()>,
    /// Its storage quota in bytes, as the registry last said (`NO_QUOTA`:
    /// none).
    quota: AtomicU64,
    /// The request body bytes its requests hold now (a tenant may hold
    /// only part of the server's `--max-bodies`).
    pub body_bytes: AtomicUsize,
}

const NO_QUOTA: u64 = u64::MAX;

/// Why a request could not run on a tenant's vault.
#[derive(Debug)]
pub enum PoolError {
    /// The tenant's vault would not open (damage, I/O): the message says
    /// what, naming no path or content.
    Unavailable(String),
    /// The tenant was removed while the request waited.
    Gone,
}

impl Slot {
    /// The open vault, opened now if it is not.
    fn open<'a>(
        &self,
        pool: &Pool,
        st: &'a mut MutexGuard<'_, Option<Open>>,
    ) -> Result<&'a mut Open, PoolError> {
        if self.gone.load(Ordering::SeqCst) {
            return Err(PoolError::Gone);
        }
        if self.failed.load(Ordering::SeqCst) {
            return Err(PoolError::Unavailable(FAILED.into()));
        }
        if st.is_none() {
            pool.make_room();
            let key = self
                .key
                .key()
                .ok_or_else(|| PoolError::Unavailable("its key is not one memvault made".into()))?;
            let who = Attribution {
                session: "server".into(),
                actor: "memvault".into(),
            };
            let mut vault = Vault::open(&self.dir, &Unlock::KeyFile(&key), who).map_err(|e| {
                // Fixed words: a vault error's text can name a path.
                PoolError::Unavailable(
                    match e {
                        VaultError::Io(_) => "its vault could not be read (an I/O error)",
                        VaultError::NotFound(_) | VaultError::NotAVault(_) => {
                            "its vault is missing"
                        }
                        VaultError::WrongSecret | VaultError::SlotRemoved(_) => {
                            "its vault does not open with its key"
                        }
                        _ => "its vault is damaged or was changed outside memvault",
                    }
                    .into(),
                )
            })?;
            if let Some(count) = *lock(&self.file_count) {
                vault.seed_file_count(count);
            }
            vault.defer_checkpoints(true);
            // The objects written since a checkpoint are held in memory
            // until it: with hundreds of vaults open, each keeps little.
            vault.set_checkpoint_bytes(CHECKPOINT_BYTES);
            let log = Arc::new(
                vault
                    .log_sync_handle()
                    .map_err(|_| PoolError::Unavailable("an I/O error".into()))?,
            );
            vault.defer_sync(true);
            let memory = pool.memory_for(vault.config())?;
            let memory_config = vault.config().clone();
            **st = Some(Open {
                _counted: Counted::new(&pool.opened),
                vault,
                memory,
                memory_config,
                log,
            });
        }
        Ok(st.as_mut().expect("opened above"))
    }

    /// Run `f` on the open vault (attributed to `who` and `principal`),
    /// opening it first if needed; what it wrote is not yet durable (see
    /// [`Slot::durable`]).
    pub fn execute<T>(
        &self,
        pool: &Pool,
        who: &Attribution,
        principal: &str,
        f: impl FnOnce(&mut Open) -> T,
    ) -> Result<Ran<T>, PoolError> {
        let mut st = lock(&self.state);
        self.execute_in(pool, &mut st, who, principal, f)
    }

    /// The same, only if the vault is open and no request holds it: a
    /// short request then runs on the caller's thread, without a hand-off
    /// to another. Gives `f` back otherwise.
    pub fn try_execute<T, F: FnOnce(&mut Open) -> T>(
        &self,
        pool: &Pool,
        who: &Attribution,
        principal: &str,
        f: F,
    ) -> Result<Result<Ran<T>, PoolError>, F> {
        let Ok(mut st) = self.state.try_lock() else {
            return Err(f);
        };
        // Not while another process holds the vault's writer lock: the
        // request would wait for it on a thread every tenant's requests
        // need (a runtime has one per core).
        if !st
            .as_ref()
            .is_some_and(|open| open.vault.writer_lock_free())
        {
            return Err(f);
        }
        Ok(self.execute_in(pool, &mut st, who, principal, f))
    }

    fn execute_in<T>(
        &self,
        pool: &Pool,
        st: &mut MutexGuard<'_, Option<Open>>,
        who: &Attribution,
        principal: &str,
        f: impl FnOnce(&mut Open) -> T,
    ) -> Result<Ran<T>, PoolError> {
        self.last_used.store(pool.now(), Ordering::Relaxed);
        let open = self.open(pool, st)?;
        open.vault.set_attribution(who.clone());
        open.vault.set_principal(Some(principal.to_owned()));
        // Settings changed under the server (`memvault config set` on the
        // tenant's vault) hold from this request on, as in `serve`. A vault
        // that cannot catch up reports it through the request.
        if let Ok(config) = open.vault.refreshed_config()
            && *config != open.memory_config
        {
            let config = config.clone();
            open.memory = pool.memory_for(&config)?;
            open.memory_config = config;
        }
        let out = f(open);
        open.vault.set_principal(None);
        let seq = if open.vault.take_pending_sync() {
            self.appended.fetch_add(1, Ordering::SeqCst) + 1
        } else {
            0
        };
        let log = (seq > 0).then(|| open.log.clone());
        Ok(Ran {
            out,
            seq,
            log,
            due: open.vault.checkpoint_due(),
        })
    }

    /// Make what a request wrote durable (a no-op for one that wrote
    /// nothing); its result, and whether a checkpoint is due.
    pub fn durable<T>(&self, ran: Ran<T>) -> Result<(T, bool), PoolError> {
        if let Some(log) = &ran.log {
            self.make_durable(ran.seq, log)
                .map_err(|_| PoolError::Unavailable(NOT_DURABLE.into()))?;
        }
        Ok((ran.out, ran.due))
    }

    /// Group commit: sync unless a sync begun after record `seq` was
    /// written has finished.
    fn make_durable(&self, seq: u64, log: &File) -> std::io::Result<()> {
        let mut synced = lock(&self.synced);
        if self.failed.load(Ordering::SeqCst) {
            return Err(std::io::Error::other("an earlier sync failed"));
        }
        if *synced >= seq {
            return Ok(());
        }
        let covered = self.appended.load(Ordering::SeqCst);
        if let Err(e) = fsync::sync_data(log) {
            self.failed.store(true, Ordering::SeqCst);
            return Err(e);
        }
        *synced = covered;
        Ok(())
    }

    /// After a reply: run a checkpoint a request made due (off the
    /// request's path).
    pub fn after_reply(&self) {
        if let Some(open) = lock(&self.state).as_mut() {
            open.vault.after_reply();
        }
    }

    /// Its storage quota, if any.
    pub fn quota(&self) -> Option<u64> {
        Some(self.quota.load(Ordering::Relaxed)).filter(|&q| q != NO_QUOTA)
    }

    pub fn set_quota(&self, quota: Option<u64>) {
        self.quota
            .store(quota.unwrap_or(NO_QUOTA), Ordering::Relaxed);
    }

    /// Take a request from the tenant's bucket: false when over its rate.
    pub fn admit(&self, rate: u32) -> bool {
        if rate == 0 {
            return true;
        }
        let mut b = lock(&self.bucket);
        let now = Instant::now();
        let burst = f64::from(rate) * 2.0;
        b.tokens = (b.tokens + now.duration_since(b.at).as_secs_f64() * f64::from(rate)).min(burst);
        b.at = now;
        if b.tokens >= 1.0 {
            b.tokens -= 1.0;
            true
        } else {
            false
        }
    }

    /// Close the vault (its pending records synced first) if no request
    /// holds it; true if it was open and is now closed.
    fn close_if_free(&self) -> bool {
        let Ok(mut st) = self.state.try_lock() else {
            return false;
        };
        let Some(open) = st.take() else {
            return false;
        };
        if fsync::sync_data(&open.log).is_err() {
            self.failed.store(true, Ordering::SeqCst);
        }
        // The next open's first create does not count every file again.
        *lock(&self.file_count) = open.vault.known_file_count();
        self.close(open);
        true
    }

    /// Close `open`: a removed tenant's vault without its closing
    /// checkpoint ([`Vault::abandon`]), as `tenant remove` is moving its
    /// directory away to erase it.
    fn close(&self, open: Open) {
        if self.gone.load(Ordering::SeqCst) {
            let Open { vault, .. } = open;
            vault.abandon();
        }
    }
}

impl Drop for Slot {
    /// The last request on a removed tenant's slot has ended.
    fn drop(&mut self) {
        if let Some(open) = self.state.get_mut().ok().and_then(Option::take) {
            self.close(open);
        }
    }
}

/// Every tenant slot of a server.
pub struct Pool {
    slots: Mutex<HashMap<String, Arc<Slot>>>,
    /// The command executors built so far, by settings.
    memories: Mutex<Vec<(VaultConfig, Arc<Memory>)>>,
    opened: Arc<AtomicUsize>,
    max_open: usize,
    idle: Duration,
    started: Instant,
}

impl Pool {
    pub fn new(max_open: usize, idle: Duration) -> Pool {
        Pool {
            slots: Mutex::new(HashMap::new()),
            memories: Mutex::new(Vec::new()),
            opened: Arc::new(AtomicUsize::new(0)),
            max_open: max_open.max(1),
            idle,
            started: Instant::now(),
        }
    }

    /// The command executor for vaults of these settings: one per
    /// distinct settings (at most 64 kept; tenants rarely differ).
    fn memory_for(&self, config: &VaultConfig) -> Result<Arc<Memory>, PoolError> {
        let mut memories = lock(&self.memories);
        if let Some((_, m)) = memories.iter().find(|(c, _)| c == config) {
            return Ok(m.clone());
        }
        let memory = Arc::new(
            super::super::shared_memory_for(config)
                .map_err(|e| PoolError::Unavailable(e.message))?,
        );
        if memories.len() < 64 {
            memories.push((config.clone(), memory.clone()));
        }
        Ok(memory)
    }

    fn now(&self) -> u64 {
        self.started.elapsed().as_millis() as u64
    }

    /// How many tenant vaults are open.
    pub fn open_count(&self) -> usize {
        self.opened.load(Ordering::SeqCst)
    }

    /// The slot of tenant `id` (its vault in `dir`, unlocked by `key`).
    pub fn slot(&self, id: &str, dir: PathBuf, key: &HexKey, rate: u32) -> Arc<Slot> {
        let mut slots = lock(&self.slots);
        slots
            .entry(id.to_owned())
            .or_insert_with(|| {
                Arc::new(Slot {
                    dir,
                    key: key.clone(),
                    state: Mutex::new(None),
                    appended: AtomicU64::new(0),
                    file_count: Mutex::new(None),
                    synced: Mutex::new(0),
                    last_used: AtomicU64::new(self.now()),
                    bucket: Mutex::new(Bucket {
                        tokens: f64::from(rate) * 2.0,
                        at: Instant::now(),
                    }),
                    gone: AtomicBool::new(false),
                    failed: AtomicBool::new(false),
                    gate: tokio::sync::Mutex::new(()),
                    quota: AtomicU64::new(NO_QUOTA),
                    body_bytes: AtomicUsize::new(0),
                })
            })
            .clone()
    }

    /// Close least recently used vaults until at most `max_open - 1` are
    /// open (room for one more), skipping any a request holds.
    pub fn make_room(&self) {
        if self.open_count() < self.max_open {
            return;
        }
        let mut by_age: Vec<(u64, Arc<Slot>)> = lock(&self.slots)
            .values()
            .map(|s| (s.last_used.load(Ordering::Relaxed), s.clone()))
            .collect();
        by_age.sort_by_key(|(t, _)| *t);
        for (_, slot) in by_age {
            if self.open_count() < self.max_open {
                break;
            }
            slot.close_if_free();
        }
    }

    /// Close every vault idle for longer than the idle period; forget
    /// slots of tenants no longer in `live`.
    pub fn sweep(&self, live: &dyn Fn(&str) -> bool) {
        let now = self.now();
        let idle = self.idle.as_millis() as u64;
        let slots: Vec<(String, Arc<Slot>)> = lock(&self.slots)
            .iter()
            .map(|(k, v)| (k.clone(), v.clone()))
            .collect();
        for (id, slot) in slots {
            if !live(&id) {
                slot.gone.store(true, Ordering::SeqCst);
                slot.close_if_free();
                lock(&self.slots).remove(&id);
            } else if now.saturating_sub(slot.last_used.load(Ordering::Relaxed)) > idle {
                slot.close_if_free();
            }
        }
    }

    /// Forget tenant `id` at once (removed): its vault is closed when the
    /// last request on it ends.
    pub fn forget(&self, id: &str) {
        if let Some(slot) = lock(&self.slots).remove(id) {
            slot.gone.store(true, Ordering::SeqCst);
            slot.close_if_free();
        }
    }

    /// Close every vault (at shutdown, after the last request): each
    /// syncs its log and checkpoints as it is dropped.
    pub fn close_all(&self) {
        let slots: Vec<Arc<Slot>> = lock(&self.slots).drain().map(|(_, v)| v).collect();
        for slot in slots {
            let mut st = lock(&slot.state);
            if let Some(open) = st.take() {
                let _ = fsync::sync_data(&open.log);
                drop(open);
            }
        }
    }
}
