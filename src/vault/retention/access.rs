//! Access tracking for expiry: when each file was last viewed and last
//! written, kept outside git (reads must not create commits or reveal
//! reading patterns in history) in `memvault/access`, encrypted.
//!
//! Files are tracked by file-key id, which follows a file across renames
//! and edits and names no path. The file is a log of records, each
//! `u16 LE length || sealed(n × (key id 16 || kind 1 || time_ms u64 LE))`
//! under the access subkey. Views and writes append a record without
//! fsync: after a crash a record may be missing, so a time can only be
//! older than the truth, never newer. Appending takes the writer lock
//! shared; compaction (by the sweeper, holding it exclusively) rewrites the
//! log as one record and renames it into place, so no append is lost to a
//! rewrite. A record that does not open is skipped. A view's record is
//! appended before its reply, in every process.
//!
//! The log grows by a record per view, so it is compacted once it passes
//! twice the size its last compaction left (and at least
//! [`COMPACT_AT_LEAST`]): by the next write, which holds the writer lock
//! exclusively, or by the view itself when no other process holds the
//! lock. Views alone cannot grow it past that bound, which is set by the
//! number of files.

use std::collections::HashMap;
use std::io::Write;

use zeroize::Zeroizing;

use crate::crypto::FileKeyId;
use crate::vault::{Vault, VaultError, write_durable};

pub(crate) const ACCESS_FILE: &str = "memvault/access";
const AAD: &[u8] = b"memvault access v1\0";
const ENTRY: usize = 16 + 1 + 8;
const VIEWED: u8 = 1;
/// The access log is never compacted below this size.
pub(crate) const COMPACT_AT_LEAST: u64 = 64 * 1024;
const WRITTEN: u8 = 2;

/// What is known of one file's use.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Access {
    pub viewed_ms: Option<u64>,
    pub written_ms: Option<u64>,
}

impl Access {
    /// The later of the two, if any.
    pub fn last_active(&self) -> Option<u64> {
        self.viewed_ms.max(self.written_ms)
    }
}

/// The kind of an access record.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    Viewed,
    Written,
}

impl Vault {
    fn seal_access_record(&self, entries: &[(FileKeyId, Kind, u64)]) -> Vec<u8> {
        let mut plain = zeroize::Zeroizing::new(Vec::with_capacity(entries.len() * ENTRY));
        for (id, kind, t) in entries {
            plain.extend_from_slice(&id.0);
            plain.push(match kind {
                Kind::Viewed => VIEWED,
                Kind::Written => WRITTEN,
            });
            plain.extend_from_slice(&t.to_le_bytes());
        }
        let sealed = self.keys.seal_access(AAD, &plain);
        let mut out = (sealed.len() as u16).to_le_bytes().to_vec();
        out.extend_from_slice(&sealed);
        out
    }

    /// Append access records (no fsync). The caller holds the writer lock,
    /// shared or exclusive.
    pub(crate) fn append_access(&self, entries: &[(FileKeyId, Kind, u64)]) {
        // At most 2,000 entries per record keeps the length within u16.
        for chunk in entries.chunks(2_000) {
            let record = self.seal_access_record(chunk);
            if let Err(e) = self.append_access_bytes(&record) {
                // Once a process: a full disk would say it at every view.
                static SAID: std::sync::atomic::AtomicBool =
                    std::sync::atomic::AtomicBool::new(false);
                if !SAID.swap(true, std::sync::atomic::Ordering::Relaxed) {
                    eprintln!(
                        "memvault: warning: a view or write could not be recorded in the access log ({}); until one is, expiry takes that file's last use as older than it is",
                        e.kind()
                    );
                }
            }
        }
    }

    /// Append to the access log through the handle this vault holds,
    /// opened again when the log was replaced (compaction renames a new
    /// one into place: the one held then has no name left) or removed.
    fn append_access_bytes(&self, record: &[u8]) -> std::io::Result<()> {
        use std::os::unix::fs::MetadataExt;
        let mut held = self.access_log.borrow_mut();
        let len = held
            .as_ref()
            .and_then(|f| f.metadata().ok())
            .filter(|m| m.nlink() > 0)
            .map(|m| m.len());
        if len.is_none() {
            *held = None;
            *held = Some(crate::vault::fsx::open_append(&self.dir.join(ACCESS_FILE))?);
        }
        match held.as_mut() {
            Some(f) => {
                f.write_all(record)?;
                // The length after it, for the bound's check that follows
                // (other processes' appends since only make it larger).
                self.access_len.set(len.map(|l| l + record.len() as u64));
                Ok(())
            }
            None => Ok(()),
        }
    }

    /// Record accesses, taking the writer lock shared for the append;
    /// then compact the log if it has grown past its bound and no other
    /// process holds the lock (else the next write compacts it).
    pub(crate) fn record_access(&self, entries: &[(FileKeyId, Kind, u64)]) {
        {
            let Ok(_guard) = crate::vault::FileLock::shared_on(&self.lock) else {
                return;
            };
            self.append_access(entries);
        }
        if self.access_grown()
            && let Ok(Some(_guard)) = crate::vault::FileLock::try_exclusive_on(&self.lock)
        {
            let _ = self.compact_access_if_grown();
        }
    }

    /// Whether the access log has passed its bound (one `fstat`).
    fn access_grown(&self) -> bool {
        let held = self.access_log.borrow();
        let len = match self.access_len.take() {
            Some(len) => len,
            None => held
                .as_ref()
                .and_then(|f| f.metadata().ok())
                .map_or(0, |m| m.len()),
        };
        len > self.access_limit.get().max(COMPACT_AT_LEAST)
    }

    /// Compact the access log if it has passed its bound. The caller
    /// holds the writer lock exclusively.
    pub(crate) fn compact_access_if_grown(&self) -> Result<(), VaultError> {
        if !self.access_grown() {
            return Ok(());
        }
        let table = self.access_table()?;
        self.compact_access(&table)
    }

    /// The access table: the newest view and write time per file key.
    pub fn access_table(&self) -> Result<HashMap<FileKeyId, Access>, VaultError> {
        let bytes = match crate::vault::fsx::read_max(
            &self.dir.join(ACCESS_FILE),
            crate::vault::fsx::TABLE,
        ) {
            Ok(b) => b,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Vec::new(),
            Err(e) => return Err(e.into()),
        };
        let mut table: HashMap<FileKeyId, Access> = HashMap::new();
        let mut take = |id, kind, t| {
            let a: &mut Access = table.entry(id).or_default();
            match kind {
                Kind::Viewed => a.viewed_ms = a.viewed_ms.max(Some(t)),
                Kind::Written => a.written_ms = a.written_ms.max(Some(t)),
            }
        };
        self.each_access_entry(&bytes, &mut take);
        Ok(table)
    }

    /// Every entry of sealed access records (the log's form), in order; a
    /// record cut short at the end ends the read. A record that does not
    /// open is skipped, and the next one looked for within the bytes it
    /// claimed: an append cut short (a full disk) leaves part of a record,
    /// and the records appended after it start inside what its length
    /// says (read from there on as one record, every later view would be
    /// lost to expiry).
    fn each_access_entry(&self, bytes: &[u8], mut f: impl FnMut(FileKeyId, Kind, u64)) {
        let overhead = self.keys.seal_access(AAD, &[]).len();
        let opens_at = |at: usize| -> Option<(usize, Zeroizing<Vec<u8>>)> {
            let len = u16::from_le_bytes([*bytes.get(at)?, *bytes.get(at + 1)?]) as usize;
            if len < overhead || !(len - overhead).is_multiple_of(ENTRY) {
                return None;
            }
            let sealed = bytes.get(at + 2..at + 2 + len)?;
            let plain = self.keys.open_access(AAD, sealed).ok()?;
            Some((at + 2 + len, plain))
        };
        // One budget for the whole read: the records tried while looking
        // past ones that do not open may cover at most four times the
        // log (a planted log cannot make the read cost more).
        let mut budget = bytes.len().saturating_mul(4);
        let mut at = 0;
        while at + 2 <= bytes.len() {
            let len = u16::from_le_bytes([bytes[at], bytes[at + 1]]) as usize;
            let plain = match opens_at(at) {
                Some((next, plain)) => {
                    at = next;
                    plain
                }
                None => {
                    // The next record that opens, within the bytes this one
                    // claimed (at most 4,096 tries: a hostile file costs
                    // little), else past them as before. One cut short at
                    // the end (a crash, or a full disk before later
                    // appends) is looked past the same way.
                    let claimed = (at + 2 + len).min(bytes.len());
                    let found = (at + 1..=claimed)
                        .filter(|&k| {
                            bytes.get(k..k + 2).is_some_and(|w| {
                                let l = u16::from_le_bytes([w[0], w[1]]) as usize;
                                l >= overhead
                                    && (l - overhead).is_multiple_of(ENTRY)
                                    && k + 2 + l <= bytes.len()
                            })
                        })
                        .take(4_096)
                        .take_while(|&k| {
                            let l = u16::from_le_bytes([bytes[k], bytes[k + 1]]) as usize;
                            match budget.checked_sub(l) {
                                Some(left) => {
                                    budget = left;
                                    true
                                }
                                None => false,
                            }
                        })
                        .find_map(opens_at);
                    match found {
                        Some((next, plain)) => {
                            at = next;
                            plain
                        }
                        None => {
                            at = claimed;
                            continue;
                        }
                    }
                }
            };
            for e in plain.chunks_exact(ENTRY) {
                let mut id = [0u8; 16];
                id.copy_from_slice(&e[..16]);
                let mut t = [0u8; 8];
                t.copy_from_slice(&e[17..]);
                let kind = match e[16] {
                    VIEWED => Kind::Viewed,
                    WRITTEN => Kind::Written,
                    _ => continue,
                };
                f(FileKeyId(id), kind, u64::from_le_bytes(t));
            }
        }
    }

    /// A table as sealed records (the log's form), in a stable order.
    fn seal_table(&self, table: &HashMap<FileKeyId, Access>) -> Vec<u8> {
        let mut entries = Vec::with_capacity(table.len() * 2);
        for (id, a) in table {
            if let Some(t) = a.viewed_ms {
                entries.push((*id, Kind::Viewed, t));
            }
            if let Some(t) = a.written_ms {
                entries.push((*id, Kind::Written, t));
            }
        }
        entries.sort_by_key(|e| (e.0, e.2));
        let mut bytes = Vec::new();
        for chunk in entries.chunks(2_000) {
            bytes.extend_from_slice(&self.seal_access_record(chunk));
        }
        bytes
    }

    /// The whole access table as sealed records (the log's own form), for
    /// sync: other machines' expiry must see this machine's views.
    pub(crate) fn access_records(&self) -> Result<Vec<u8>, VaultError> {
        Ok(self.seal_table(&self.access_table()?))
    }

    /// A keyed digest of the access table (equal tables, equal digests):
    /// whether it changed since it was last pushed.
    pub(crate) fn access_digest(&self) -> Result<String, VaultError> {
        Ok(self.digest_of(&self.access_table()?))
    }

    fn digest_of(&self, table: &HashMap<FileKeyId, Access>) -> String {
        let mut entries: Vec<_> = table.iter().collect();
        entries.sort_by_key(|e| e.0);
        let mut plain = zeroize::Zeroizing::new(b"memvault access digest v1\0".to_vec());
        for (id, a) in entries {
            plain.extend_from_slice(&id.0);
            plain.extend_from_slice(&a.viewed_ms.unwrap_or(0).to_le_bytes());
            plain.extend_from_slice(&a.written_ms.unwrap_or(0).to_le_bytes());
        }
        data_encoding::HEXLOWER.encode(&self.keys.mac(&plain))
    }

    /// Take in another machine's access records (sealed, in the log's
    /// form): every time newer than this machine's is appended here. A
    /// record that does not open is skipped. Returns the digest of the
    /// table those records hold (equal to [`access_digest`] afterwards when
    /// this machine knows nothing newer: nothing to send back).
    pub(crate) fn merge_access_records(&self, bytes: &[u8]) -> Result<String, VaultError> {
        let mine = self.access_table()?;
        let mut theirs: HashMap<FileKeyId, Access> = HashMap::new();
        let mut newer = Vec::new();
        self.each_access_entry(bytes, |id, kind, t| {
            let known = mine.get(&id).copied().unwrap_or_default();
            let a = theirs.entry(id).or_default();
            let (have, slot) = match kind {
                Kind::Viewed => (known.viewed_ms, &mut a.viewed_ms),
                Kind::Written => (known.written_ms, &mut a.written_ms),
            };
            *slot = (*slot).max(Some(t));
            if have < Some(t) {
                newer.push((id, kind, t));
            }
        });
        if !newer.is_empty() {
            self.record_access(&newer);
        }
        Ok(self.digest_of(&theirs))
    }

    /// Rewrite the log as one record holding `table` (durably). The
    /// caller holds the writer lock exclusively.
    pub(crate) fn compact_access(
        &self,
        table: &HashMap<FileKeyId, Access>,
    ) -> Result<(), VaultError> {
        let bytes = self.seal_table(table);
        write_durable(&self.dir.join(ACCESS_FILE), &bytes)?;
        self.access_limit.set(2 * bytes.len() as u64);
        self.access_len.set(None);
        Ok(())
    }
}
