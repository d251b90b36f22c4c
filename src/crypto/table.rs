//! The file-key table and its sealed shards.
//!
//! Owns: `KeyTable` (file-key id -> file key) and the shard format
//! `"MVKT" || version 1 || epoch u32 BE || nonce 24 || ciphertext || tag`,
//! sealed with XChaCha20-Poly1305 under the table key of the epoch, the
//! associated data being every header byte then the shard number. A shard
//! holds the entries whose id starts with its number, so a change rewrites
//! one small object: version 1 (vault format 2), 256 shards by the id's
//! first byte, the number one byte; version 2 (format 3), 4096 shards by
//! the id's first 12 bits, the number two bytes BE (so 100,000 files make
//! shards of about 24 keys). Plaintext: `count u32 BE` then
//! `(id 16 || key 32)*` in ascending id order.
//!
//! Promises: a shard opens only under its own shard number and vault; an
//! entry that does not belong to the shard, a duplicate, or a wrong count
//! is refused; plaintext buffers are wiped.
//!
//! Does not protect: against an older, validly sealed shard being put back
//! (that would resurrect an erased key): the keys ref is replaced, not
//! appended, and the vault must keep it that way.

use std::collections::BTreeMap;

use zeroize::Zeroizing;

use super::primitives::{NONCE_LEN, SecretBytes, be_u32, open, seal};
use super::{CryptoError, FileKey, FileKeyId, VaultKeys, labels};

const HEADER_LEN: usize = 4 + 1 + 4 + NONCE_LEN;
const ENTRY_LEN: usize = 16 + 32;

/// How the table is split into shards (see the module docs).
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum ShardLayout {
    /// 256 shards by the id's first byte (shard version 1, vault format 2).
    Byte,
    /// 4096 shards by the id's first 12 bits (shard version 2, format 3).
    Wide,
}

impl ShardLayout {
    /// The shard an id belongs to.
    pub fn shard_of(self, id: &FileKeyId) -> u16 {
        match self {
            ShardLayout::Byte => u16::from(id.0[0]),
            ShardLayout::Wide => (u16::from(id.0[0]) << 4) | u16::from(id.0[1] >> 4),
        }
    }

    /// How many shards there are.
    pub fn shards(self) -> u16 {
        match self {
            ShardLayout::Byte => 256,
            ShardLayout::Wide => 4096,
        }
    }

    fn version(self) -> u8 {
        match self {
            ShardLayout::Byte => 1,
            ShardLayout::Wide => 2,
        }
    }

    /// The shard number as bound into the shard's associated data.
    fn number(self, shard: u16) -> Vec<u8> {
        match self {
            ShardLayout::Byte => vec![shard as u8],
            ShardLayout::Wide => shard.to_be_bytes().to_vec(),
        }
    }
}

/// File keys by id. Dropping the table wipes every key.
#[derive(Default)]
pub struct KeyTable {
    keys: BTreeMap<FileKeyId, FileKey>,
}

impl KeyTable {
    pub fn new() -> KeyTable {
        KeyTable::default()
    }

    /// Inserts a key, returning the one it replaced.
    pub fn insert(&mut self, id: FileKeyId, key: FileKey) -> Option<FileKey> {
        self.keys.insert(id, key)
    }

    pub fn get(&self, id: &FileKeyId) -> Option<&FileKey> {
        self.keys.get(id)
    }

    /// Removes a key; dropping the returned key wipes it (crypto-erasure
    /// once the shard is resealed and the old one is gone).
    pub fn remove(&mut self, id: &FileKeyId) -> Option<FileKey> {
        self.keys.remove(id)
    }

    pub fn len(&self) -> usize {
        self.keys.len()
    }

    pub fn is_empty(&self) -> bool {
        self.keys.is_empty()
    }

    /// Every entry, moved out, in ascending id order.
    pub fn into_entries(self) -> impl Iterator<Item = (FileKeyId, FileKey)> {
        self.keys.into_iter()
    }

    /// Entries in ascending id order.
    pub fn iter(&self) -> impl Iterator<Item = (&FileKeyId, &FileKey)> {
        self.keys.iter()
    }

    fn shard(
        &self,
        layout: ShardLayout,
        shard: u16,
    ) -> impl Iterator<Item = (&FileKeyId, &FileKey)> {
        let (mut first, mut last) = ([0; 16], [0xff; 16]);
        match layout {
            ShardLayout::Byte => (first[0], last[0]) = (shard as u8, shard as u8),
            ShardLayout::Wide => {
                let (hi, lo) = ((shard >> 4) as u8, ((shard & 0xf) as u8) << 4);
                (first[0], first[1]) = (hi, lo);
                (last[0], last[1]) = (hi, lo | 0x0f);
            }
        }
        self.keys.range(FileKeyId(first)..=FileKeyId(last))
    }
}

impl std::fmt::Debug for KeyTable {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "KeyTable({} keys, [redacted])", self.keys.len())
    }
}

impl VaultKeys {
    /// Seals the entries of `entries` that belong to `shard` of `layout`
    /// (others are left for their own shard), under the current epoch's
    /// table key. An empty shard still seals (count 0).
    pub fn seal_table_shard(&self, layout: ShardLayout, shard: u16, entries: &KeyTable) -> Vec<u8> {
        let selected: Vec<_> = entries.shard(layout, shard).collect();
        let count = u32::try_from(selected.len()).expect("at most 2^32 file keys per shard");
        let mut plain = Zeroizing::new(Vec::with_capacity(4 + selected.len() * ENTRY_LEN));
        plain.extend_from_slice(&count.to_be_bytes());
        for (id, key) in selected {
            plain.extend_from_slice(&id.0);
            plain.extend_from_slice(key.expose_secret());
        }
        let mut header = Vec::with_capacity(HEADER_LEN);
        header.extend_from_slice(labels::TABLE_MAGIC);
        header.push(layout.version());
        header.extend_from_slice(&self.current_epoch().to_be_bytes());
        seal(
            self.current_keys().table.expose(),
            header,
            &layout.number(shard),
            &plain,
        )
    }

    /// Opens a shard sealed under `shard` of `layout` by any epoch of this
    /// vault.
    pub fn open_table_shard(
        &self,
        layout: ShardLayout,
        shard: u16,
        bytes: &[u8],
    ) -> Result<KeyTable, CryptoError> {
        if bytes.len() < HEADER_LEN
            || &bytes[..4] != labels::TABLE_MAGIC
            || bytes[4] != layout.version()
        {
            return Err(CryptoError::Malformed);
        }
        let keys = be_u32(bytes, 5)
            .and_then(|epoch| self.epoch_keys(epoch))
            .ok_or(CryptoError::DecryptionFailed)?;
        let plain = open(
            keys.table.expose(),
            bytes,
            HEADER_LEN,
            &layout.number(shard),
        )?;
        // Authenticated, so a bad layout means a writer bug: still refuse.
        let bad = CryptoError::DecryptionFailed;
        let count = be_u32(&plain, 0).ok_or(bad)? as usize;
        let body = &plain[4..];
        if body.len() != count.checked_mul(ENTRY_LEN).ok_or(bad)? {
            return Err(bad);
        }
        let mut table = KeyTable::new();
        for entry in body.chunks_exact(ENTRY_LEN) {
            let id = FileKeyId(entry[..16].try_into().map_err(|_| bad)?);
            let key = SecretBytes::from_slice(&entry[16..]).ok_or(bad)?;
            let ascending = table
                .keys
                .last_key_value()
                .is_none_or(|(last, _)| *last < id);
            if layout.shard_of(&id) != shard || !ascending {
                return Err(bad);
            }
            table.insert(id, FileKey::from_secret(key));
        }
        Ok(table)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::crypto::Keyring;

    const B: ShardLayout = ShardLayout::Byte;
    const W: ShardLayout = ShardLayout::Wide;

    /// Wide shards: 12 bits of the id, two bytes of shard number, and a
    /// version of their own, so neither layout opens as the other.
    #[test]
    fn wide_shards_hold_their_ids_and_are_bound_to_their_layout() {
        let keys = VaultKeys::derive(&Keyring::new_random());
        let mk = |a: u8, b: u8| {
            let mut id = [0; 16];
            (id[0], id[1]) = (a, b);
            FileKeyId(id)
        };
        let ids = [
            mk(0x12, 0x30),
            mk(0x12, 0x3f),
            mk(0x12, 0x40),
            mk(0x13, 0x30),
        ];
        let t = table(&ids);
        assert_eq!(W.shard_of(&ids[0]), 0x123);
        let sealed = keys.seal_table_shard(W, 0x123, &t);
        let back = keys.open_table_shard(W, 0x123, &sealed).unwrap();
        assert_eq!(
            back.iter().map(|(i, _)| *i).collect::<Vec<_>>(),
            ids[..2].to_vec()
        );
        assert!(keys.open_table_shard(W, 0x124, &sealed).is_err());
        assert!(keys.open_table_shard(B, 0x12, &sealed).is_err());
        let narrow = keys.seal_table_shard(B, 0x12, &t);
        assert_eq!(keys.open_table_shard(B, 0x12, &narrow).unwrap().len(), 3);
        assert!(keys.open_table_shard(W, 0x12, &narrow).is_err());
        assert_eq!(W.shards(), 4096);
    }

    /// Deterministic ids, so their order is known.
    fn id(shard: u8, n: u8) -> FileKeyId {
        let mut id = [0; 16];
        (id[0], id[15]) = (shard, n);
        FileKeyId(id)
    }

    fn table(ids: &[FileKeyId]) -> KeyTable {
        let mut t = KeyTable::new();
        for i in ids {
            t.insert(*i, FileKey::generate());
        }
        t
    }

    /// Seals a raw plaintext with a valid header, to test the parser.
    fn seal_raw(keys: &VaultKeys, shard: u8, plain: &[u8]) -> Vec<u8> {
        let header = [
            &labels::TABLE_MAGIC[..],
            &[1],
            &keys.current_epoch().to_be_bytes(),
        ]
        .concat();
        seal(keys.current_keys().table.expose(), header, &[shard], plain)
    }

    #[test]
    fn table_basics() {
        let a = id(1, 1);
        let mut t = table(&[a]);
        assert_eq!(t.len(), 1);
        assert!(!t.is_empty());
        assert!(t.get(&a).is_some());
        assert!(t.insert(a, FileKey::generate()).is_some());
        assert!(t.remove(&a).is_some());
        assert!(t.get(&a).is_none() && t.is_empty());
        assert_eq!(format!("{t:?}"), "KeyTable(0 keys, [redacted])");
    }

    #[test]
    fn shard_round_trip_keeps_only_its_shard() {
        let keys = VaultKeys::derive(&Keyring::new_random());
        let ids = [id(7, 1), id(7, 2), id(8, 3), id(6, 4), id(0xff, 5)];
        let t = table(&ids);
        let sealed = keys.seal_table_shard(B, 7, &t);
        assert_eq!(sealed.len(), HEADER_LEN + 4 + 2 * ENTRY_LEN + 16);
        let back = keys.open_table_shard(B, 7, &sealed).unwrap();
        assert_eq!(back.len(), 2);
        for i in &ids[..2] {
            assert_eq!(
                back.get(i).unwrap().expose_secret(),
                t.get(i).unwrap().expose_secret()
            );
        }
        let top = keys
            .open_table_shard(B, 0xff, &keys.seal_table_shard(B, 0xff, &t))
            .unwrap();
        assert_eq!(
            top.iter().map(|(i, _)| *i).collect::<Vec<_>>(),
            vec![ids[4]]
        );
        let empty = keys
            .open_table_shard(B, 9, &keys.seal_table_shard(B, 9, &t))
            .unwrap();
        assert!(empty.is_empty());
    }

    #[test]
    fn shard_number_and_vault_are_bound() {
        let keys = VaultKeys::derive(&Keyring::new_random());
        let sealed = keys.seal_table_shard(B, 7, &table(&[id(7, 1)]));
        assert_eq!(
            keys.open_table_shard(B, 8, &sealed).unwrap_err(),
            CryptoError::DecryptionFailed
        );
        let other = VaultKeys::derive(&Keyring::new_random());
        assert!(other.open_table_shard(B, 7, &sealed).is_err());
    }

    #[test]
    fn shard_tamper_flip_truncate_extend() {
        let keys = VaultKeys::derive(&Keyring::new_random());
        let sealed = keys.seal_table_shard(B, 3, &table(&[id(3, 1), id(3, 2)]));
        for i in 0..sealed.len() {
            let mut bad = sealed.clone();
            bad[i] ^= 0x01;
            let err = keys.open_table_shard(B, 3, &bad).unwrap_err();
            assert!(
                matches!(err, CryptoError::DecryptionFailed | CryptoError::Malformed),
                "byte {i}"
            );
        }
        for len in 0..sealed.len() {
            assert!(
                keys.open_table_shard(B, 3, &sealed[..len]).is_err(),
                "truncated to {len}"
            );
        }
        assert!(
            keys.open_table_shard(B, 3, &[&sealed[..], &[0]].concat())
                .is_err()
        );
    }

    #[test]
    fn shard_from_old_epoch_opens_after_rotation() {
        let mut ring = Keyring::new_random();
        let old = VaultKeys::derive(&ring);
        let sealed = old.seal_table_shard(B, 1, &table(&[id(1, 1)]));
        ring.add_epoch();
        let new = VaultKeys::derive(&ring);
        assert_eq!(new.open_table_shard(B, 1, &sealed).unwrap().len(), 1);
        let resealed = new.seal_table_shard(B, 1, &table(&[id(1, 1)]));
        assert_eq!(&resealed[5..9], &1u32.to_be_bytes());
    }

    #[test]
    fn parser_refuses_foreign_duplicate_and_miscounted_entries() {
        let keys = VaultKeys::derive(&Keyring::new_random());
        let entry = |id: FileKeyId| [&id.0[..], &[9u8; 32]].concat();
        let (a, b) = (id(5, 1), id(5, 2));
        let good = [&2u32.to_be_bytes()[..], &entry(a), &entry(b)].concat();
        assert_eq!(
            keys.open_table_shard(B, 5, &seal_raw(&keys, 5, &good))
                .unwrap()
                .len(),
            2
        );
        let cases = [
            [&1u32.to_be_bytes()[..], &entry(id(6, 1))].concat(),
            [&2u32.to_be_bytes()[..], &entry(a), &entry(a)].concat(),
            [&2u32.to_be_bytes()[..], &entry(b), &entry(a)].concat(),
            [&3u32.to_be_bytes()[..], &entry(a), &entry(b)].concat(),
            [&1u32.to_be_bytes()[..], &entry(a), &[0]].concat(),
            vec![0, 0],
        ];
        for plain in cases {
            let sealed = seal_raw(&keys, 5, &plain);
            assert_eq!(
                keys.open_table_shard(B, 5, &sealed).unwrap_err(),
                CryptoError::DecryptionFailed
            );
        }
    }
}
