//! The history index: a local, encrypted cache of every commit's id,
//! parent and metadata, so walking a long history (`history PATH`,
//! `sessions`, `resume`) does not inflate and decrypt 100,000 commits.
//!
//! `memvault/history-index` is a sequence of chunks, each `u32 LE length ||
//! sealed JSON`, sealed with the metadata key. A chunk holds consecutive
//! commits, oldest first, as `[id, parent, meta]`. Readers check that the
//! commits chain (each parent is the previous id, across chunks) and stop at
//! the first chunk that does not open or does not chain, so a cut or
//! damaged file only makes the index shorter. The index is trusted only
//! from a commit that was reached by walking main itself, so it can never
//! add commits to history; it is a cache, rebuilt when it does not match.
//! Appends and rewrites take an exclusive lock on its own lock file; a
//! rewrite is a rename.

use std::collections::HashMap;
use std::fs;
use std::io::Write;

use git2::Oid;
use serde::{Deserialize, Serialize};

use crate::vault::{CommitMeta, Vault, fsx};

const INDEX_FILE: &str = "memvault/history-index";
const INDEX_LOCK: &str = "memvault/history-index.lock";
const AAD: &[u8] = b"memvault history index v1\0";
/// Chunks before the file is rewritten as one.
const MAX_CHUNKS: usize = 64;

/// One commit of main, as the index keeps it. Within a chunk only the
/// first entry stores its parent (the others' is the previous id).
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct Entry {
    #[serde(rename = "i")]
    pub id: String,
    #[serde(rename = "p", default, skip_serializing_if = "Option::is_none")]
    pub parent: Option<String>,
    #[serde(rename = "m")]
    pub meta: CommitMeta,
}

/// The index as read: entries oldest first, and positions by commit id.
pub struct Index {
    pub entries: Vec<Entry>,
    pub position: HashMap<Oid, usize>,
    chunks: usize,
    /// Bytes of the file that were read as valid chunks.
    file_len: u64,
}

impl Vault {
    /// Read the index (empty when absent or unreadable).
    pub(crate) fn read_index(&self) -> Index {
        let mut index = Index {
            entries: Vec::new(),
            position: HashMap::new(),
            chunks: 0,
            file_len: 0,
        };
        let Ok(bytes) = fsx::read_max(&self.dir.join(INDEX_FILE), fsx::TABLE) else {
            return index;
        };
        let mut at = 0usize;
        while at + 4 <= bytes.len() {
            let len = u32::from_le_bytes([bytes[at], bytes[at + 1], bytes[at + 2], bytes[at + 3]])
                as usize;
            let Some(sealed) = bytes.get(at + 4..at + 4 + len) else {
                break;
            };
            at += 4 + len;
            let Ok(plain) = self.keys.open_meta(AAD, sealed) else {
                break;
            };
            let Ok(mut chunk) = serde_json::from_slice::<Vec<Entry>>(&plain) else {
                break;
            };
            let last = index.entries.last().map(|e| e.id.clone());
            if chunk.first().is_none_or(|e| e.parent != last) {
                break;
            }
            for i in 1..chunk.len() {
                chunk[i].parent = Some(chunk[i - 1].id.clone());
            }
            for e in chunk {
                let Ok(id) = Oid::from_str(&e.id) else {
                    return index;
                };
                index.position.insert(id, index.entries.len());
                index.entries.push(e);
            }
            index.chunks += 1;
            index.file_len = at as u64;
        }
        index
    }

    /// Add `newer` (oldest first, continuing from the index's last entry,
    /// or from nothing when `base` is empty) to the index. With `keep` the
    /// index is first cut to its first `keep` entries (a rewrite).
    pub(crate) fn extend_index(&self, index: &Index, keep: usize, newer: &[Entry]) {
        if newer.is_empty() {
            return;
        }
        let Ok(lock) = fsx::open_rw(&self.dir.join(INDEX_LOCK)) else {
            return;
        };
        let Ok(_guard) = crate::vault::FileLock::exclusive(&lock) else {
            return;
        };
        let path = self.dir.join(INDEX_FILE);
        let current = fs::metadata(&path).map(|m| m.len()).unwrap_or(0);
        let rewrite = keep < index.entries.len()
            || index.chunks + 1 > MAX_CHUNKS
            || current != index.file_len;
        let result = if rewrite {
            let mut all: Vec<Entry> = index.entries[..keep].to_vec();
            all.extend_from_slice(newer);
            let tmp = path.with_extension("tmp");
            fsx::create_new(&tmp, fsx::FILE_MODE)
                .and_then(|mut f| {
                    for chunk in all.chunks(16_384) {
                        f.write_all(&self.seal_chunk(chunk))?;
                    }
                    f.sync_all()
                })
                .and_then(|()| fs::rename(&tmp, &path))
                .inspect_err(|_| {
                    let _ = fs::remove_file(&tmp);
                })
        } else {
            fsx::open_append(&path).and_then(|mut f| f.write_all(&self.seal_chunk(newer)))
        };
        let _ = result;
    }

    fn seal_chunk(&self, entries: &[Entry]) -> Vec<u8> {
        let slim: Vec<Entry> = entries
            .iter()
            .enumerate()
            .map(|(i, e)| Entry {
                id: e.id.clone(),
                parent: if i == 0 { e.parent.clone() } else { None },
                meta: e.meta.clone(),
            })
            .collect();
        let json = zeroize::Zeroizing::new(serde_json::to_vec(&slim).unwrap_or_default());
        let sealed = self.keys.seal_meta(AAD, &json);
        let mut out = (sealed.len() as u32).to_le_bytes().to_vec();
        out.extend_from_slice(&sealed);
        out
    }
}
