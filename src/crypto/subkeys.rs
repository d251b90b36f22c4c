//! `VaultKeys`: the subkeys an unlocked vault works with, and the sealing of
//! commit metadata, the access table and the commit MAC.
//!
//! Owns: key separation. Every subkey is HKDF-SHA256(salt "memvault v1",
//! ikm = a data key, info = one label of `labels.rs`). The name key comes
//! from the epoch-0 data key only, so names never change when a new epoch
//! is added; the other subkeys exist once per epoch.
//!
//! Promises: new data is sealed or MACed under the current epoch, whose
//! number is stored in front and authenticated; any epoch in the keyring
//! opens or verifies. Meta and access use different keys, so one cannot be
//! passed off as the other.
//!
//! Does not protect: against replay of an older sealed value or MAC made
//! with the same keys (the caller binds context through `aad`/`data`).

use std::collections::BTreeMap;
use std::fmt;

use hmac::Mac;
use zeroize::Zeroizing;

use super::labels;
use super::primitives::{NONCE_LEN, SecretBytes, be_u32, hkdf, hmac, open, seal};
use super::{CryptoError, Keyring};

/// The per-epoch subkeys.
pub(super) struct EpochKeys {
    meta: SecretBytes<32>,
    mac: SecretBytes<32>,
    access: SecretBytes<32>,
    settings: SecretBytes<32>,
    pub(super) table: SecretBytes<32>,
}

/// The key that authenticates the write-ahead log's entries (see
/// `vault::wal`): an HMAC-SHA256 tag over each entry, so a log copied from
/// another vault, or an entry written without the key, is refused.
pub struct LogKey(SecretBytes<32>);

impl LogKey {
    /// The tag of one entry's bytes (given in parts).
    pub fn tag(&self, parts: &[&[u8]]) -> [u8; 32] {
        self.mac(parts).finalize().into_bytes().into()
    }

    /// Checks a [`tag`](Self::tag), in constant time.
    pub fn check(&self, parts: &[&[u8]], tag: &[u8]) -> bool {
        self.mac(parts).verify_slice(tag).is_ok()
    }

    fn mac(&self, parts: &[&[u8]]) -> hmac::Hmac<sha2::Sha256> {
        let mut all: Vec<&[u8]> = Vec::with_capacity(parts.len() + 1);
        all.push(labels::LOG_MAC);
        all.extend_from_slice(parts);
        hmac(self.0.expose(), &all)
    }

    /// A copy, for a second handle on the same vault.
    pub fn duplicate(&self) -> LogKey {
        let mut copy = SecretBytes::zeroed();
        copy.expose_mut().copy_from_slice(self.0.expose());
        LogKey(copy)
    }
}

/// Subkeys derived from a [`Keyring`]; what a running vault keeps in memory.
pub struct VaultKeys {
    names: SecretBytes<64>,
    log: SecretBytes<32>,
    current: u32,
    epochs: BTreeMap<u32, EpochKeys>,
}

const EPOCH_LEN: usize = 4;
const MAC_LEN: usize = EPOCH_LEN + 32;

impl VaultKeys {
    pub fn derive(keyring: &Keyring) -> VaultKeys {
        let sub = |ikm: &[u8; 32], info| hkdf::<32>(labels::HKDF_SALT, ikm, info);
        let epoch0 = keyring.data_key(0).expect("a keyring always holds epoch 0");
        let epochs = keyring
            .epochs()
            .map(|(epoch, key)| {
                let key = key.expose_secret();
                let keys = EpochKeys {
                    meta: sub(key, labels::COMMIT_META),
                    mac: sub(key, labels::COMMIT_MAC),
                    access: sub(key, labels::ACCESS_TABLE),
                    settings: sub(key, labels::SETTINGS),
                    table: sub(key, labels::KEY_TABLE),
                };
                (epoch, keys)
            })
            .collect();
        VaultKeys {
            names: hkdf::<64>(labels::HKDF_SALT, epoch0.expose_secret(), labels::NAMES),
            log: hkdf::<32>(labels::HKDF_SALT, epoch0.expose_secret(), labels::LOG_MAC),
            current: keyring.current_epoch(),
            epochs,
        }
    }

    /// The key of the write-ahead log's entry tags.
    pub fn log_key(&self) -> LogKey {
        let mut copy = SecretBytes::zeroed();
        copy.expose_mut().copy_from_slice(self.log.expose());
        LogKey(copy)
    }

    /// The epoch new data is sealed under.
    pub fn current_epoch(&self) -> u32 {
        self.current
    }

    pub(super) fn names_key(&self) -> &[u8; 64] {
        self.names.expose()
    }

    pub(super) fn current_keys(&self) -> &EpochKeys {
        &self.epochs[&self.current]
    }

    pub(super) fn epoch_keys(&self, epoch: u32) -> Option<&EpochKeys> {
        self.epochs.get(&epoch)
    }

    /// Seals commit metadata: `epoch u32 BE || nonce 24 || ct || tag`,
    /// with the epoch and nonce authenticated ahead of `aad`.
    pub fn seal_meta(&self, aad: &[u8], plaintext: &[u8]) -> Vec<u8> {
        self.seal_epoch(|k| &k.meta, aad, plaintext)
    }

    pub fn open_meta(&self, aad: &[u8], sealed: &[u8]) -> Result<Zeroizing<Vec<u8>>, CryptoError> {
        self.open_epoch(|k| &k.meta, aad, sealed)
    }

    /// Seals the access table; same layout as [`seal_meta`](Self::seal_meta)
    /// under the access key.
    pub fn seal_access(&self, aad: &[u8], plaintext: &[u8]) -> Vec<u8> {
        self.seal_epoch(|k| &k.access, aad, plaintext)
    }

    pub fn open_access(
        &self,
        aad: &[u8],
        sealed: &[u8],
    ) -> Result<Zeroizing<Vec<u8>>, CryptoError> {
        self.open_epoch(|k| &k.access, aad, sealed)
    }

    /// Seals the vault settings (same layout as
    /// [`seal_meta`](Self::seal_meta), under the settings key).
    pub fn seal_settings(&self, plaintext: &[u8]) -> Vec<u8> {
        self.seal_epoch(|k| &k.settings, labels::SETTINGS_AD, plaintext)
    }

    pub fn open_settings(&self, sealed: &[u8]) -> Result<Zeroizing<Vec<u8>>, CryptoError> {
        self.open_epoch(|k| &k.settings, labels::SETTINGS_AD, sealed)
    }

    /// `epoch u32 BE || HMAC-SHA256(current mac key, epoch || data)`.
    pub fn mac(&self, data: &[u8]) -> Vec<u8> {
        let epoch = self.current.to_be_bytes();
        let tag = hmac(self.current_keys().mac.expose(), &[&epoch, data]).finalize();
        [&epoch[..], &tag.into_bytes()].concat()
    }

    /// Checks a [`mac`](Self::mac) tag of any epoch, in constant time.
    pub fn verify_mac(&self, data: &[u8], tag: &[u8]) -> bool {
        if tag.len() != MAC_LEN {
            return false;
        }
        let Some(keys) = be_u32(tag, 0).and_then(|e| self.epoch_keys(e)) else {
            return false;
        };
        hmac(keys.mac.expose(), &[&tag[..EPOCH_LEN], data])
            .verify_slice(&tag[EPOCH_LEN..])
            .is_ok()
    }

    /// The key `serve` processes prove to each other that they hold this
    /// vault's keys with (HMAC of a fixed label under the current epoch's
    /// MAC key; see `cli::serve`).
    pub fn serve_key(&self) -> Zeroizing<[u8; 32]> {
        let tag = hmac(self.current_keys().mac.expose(), &[labels::SERVE_HANDSHAKE]).finalize();
        Zeroizing::new(tag.into_bytes().into())
    }

    fn seal_epoch(
        &self,
        pick: fn(&EpochKeys) -> &SecretBytes<32>,
        aad: &[u8],
        plaintext: &[u8],
    ) -> Vec<u8> {
        let header = self.current.to_be_bytes().to_vec();
        seal(pick(self.current_keys()).expose(), header, aad, plaintext)
    }

    fn open_epoch(
        &self,
        pick: fn(&EpochKeys) -> &SecretBytes<32>,
        aad: &[u8],
        sealed: &[u8],
    ) -> Result<Zeroizing<Vec<u8>>, CryptoError> {
        let keys = be_u32(sealed, 0)
            .and_then(|e| self.epoch_keys(e))
            .ok_or(CryptoError::DecryptionFailed)?;
        open(pick(keys).expose(), sealed, EPOCH_LEN + NONCE_LEN, aad)
    }
}

/// A `serve` handshake proof: HMAC-SHA256 under a [`VaultKeys::serve_key`]
/// of the `role` and both sides' nonces.
pub fn serve_tag(key: &[u8; 32], role: &[u8], nonces: &[u8]) -> [u8; 32] {
    hmac(key, &[role, nonces]).finalize().into_bytes().into()
}

/// Checks a [`serve_tag`] in constant time.
pub fn serve_tag_ok(key: &[u8; 32], role: &[u8], nonces: &[u8], tag: &[u8]) -> bool {
    hmac(key, &[role, nonces]).verify_slice(tag).is_ok()
}

impl fmt::Debug for VaultKeys {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "VaultKeys(epoch {}, [redacted])", self.current)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::crypto::primitives::TAG_LEN;

    fn keys_with_epochs(n: u32) -> (Keyring, VaultKeys) {
        let mut ring = Keyring::new_random();
        for _ in 1..n {
            ring.add_epoch();
        }
        let keys = VaultKeys::derive(&ring);
        (ring, keys)
    }

    #[test]
    fn subkeys_are_distinct_and_deterministic() {
        let (ring, keys) = keys_with_epochs(2);
        let again = VaultKeys::derive(&ring);
        let e0 = keys.epoch_keys(0).unwrap();
        let e1 = keys.epoch_keys(1).unwrap();
        let all = [
            &e0.meta, &e0.mac, &e0.access, &e0.table, &e1.meta, &e1.table,
        ];
        for (i, a) in all.iter().enumerate() {
            for b in &all[i + 1..] {
                assert_ne!(a.expose(), b.expose());
            }
        }
        assert_eq!(again.names_key(), keys.names_key());
        assert_eq!(again.current_keys().meta.expose(), e1.meta.expose());
        assert_eq!(keys.current_epoch(), 1);
    }

    #[test]
    fn meta_and_access_round_trip() {
        let (_, keys) = keys_with_epochs(1);
        let sealed = keys.seal_meta(b"commit", b"op=create");
        assert_eq!(sealed.len(), 4 + NONCE_LEN + 9 + TAG_LEN);
        assert_eq!(
            &keys.open_meta(b"commit", &sealed).unwrap()[..],
            b"op=create"
        );
        assert_eq!(
            keys.open_meta(b"other", &sealed).unwrap_err(),
            CryptoError::DecryptionFailed
        );
        // Meta and access keys differ, so neither opens the other.
        assert!(keys.open_access(b"commit", &sealed).is_err());
        let access = keys.seal_access(b"", b"times");
        assert_eq!(&keys.open_access(b"", &access).unwrap()[..], b"times");
        assert!(keys.open_meta(b"", &access).is_err());
        // Two seals of the same input differ (random nonce).
        assert_ne!(keys.seal_meta(b"", b"x"), keys.seal_meta(b"", b"x"));
    }

    #[test]
    fn meta_tamper_flip_truncate_extend() {
        let (_, keys) = keys_with_epochs(1);
        let sealed = keys.seal_meta(b"aad", b"some commit metadata");
        for i in 0..sealed.len() {
            for bit in [0x01, 0x80] {
                let mut bad = sealed.clone();
                bad[i] ^= bit;
                assert!(keys.open_meta(b"aad", &bad).is_err(), "flip at {i}");
            }
        }
        for len in 0..sealed.len() {
            assert!(
                keys.open_meta(b"aad", &sealed[..len]).is_err(),
                "truncated to {len}"
            );
        }
        let extended = [&sealed[..], &[0]].concat();
        assert!(keys.open_meta(b"aad", &extended).is_err());
    }

    #[test]
    fn meta_sealed_at_epoch_one_opens_after_add_epoch() {
        let (mut ring, keys) = keys_with_epochs(2);
        let sealed = keys.seal_meta(b"a", b"old epoch");
        assert_eq!(&sealed[..4], &1u32.to_be_bytes());
        assert_eq!(ring.add_epoch(), 2);
        let newer = VaultKeys::derive(&ring);
        assert_eq!(&newer.open_meta(b"a", &sealed).unwrap()[..], b"old epoch");
        let fresh = newer.seal_meta(b"a", b"new epoch");
        assert_eq!(&fresh[..4], &2u32.to_be_bytes());
        // The older view of the keyring does not know epoch 2.
        assert_eq!(
            keys.open_meta(b"a", &fresh).unwrap_err(),
            CryptoError::DecryptionFailed
        );
        // Relabelling the epoch does not help: it is authenticated.
        let mut relabelled = sealed.clone();
        relabelled[3] = 0;
        assert!(newer.open_meta(b"a", &relabelled).is_err());
    }

    #[test]
    fn mac_verifies_and_rejects_flipped_bits() {
        let (mut ring, keys) = keys_with_epochs(1);
        let data = b"tree 1234\nauthor memvault 0 +0000\n";
        let tag = keys.mac(data);
        assert_eq!(tag.len(), MAC_LEN);
        assert!(keys.verify_mac(data, &tag));
        for i in 0..tag.len() * 8 {
            let mut bad = tag.clone();
            bad[i / 8] ^= 1 << (i % 8);
            assert!(!keys.verify_mac(data, &bad), "tag bit {i}");
        }
        for i in 0..data.len() * 8 {
            let mut bad = data.to_vec();
            bad[i / 8] ^= 1 << (i % 8);
            assert!(!keys.verify_mac(&bad, &tag), "data bit {i}");
        }
        assert!(!keys.verify_mac(data, &tag[..MAC_LEN - 1]));
        assert!(!keys.verify_mac(data, &[&tag[..], &[0]].concat()));
        // Still valid after a new epoch; a different vault rejects it.
        ring.add_epoch();
        assert!(VaultKeys::derive(&ring).verify_mac(data, &tag));
        let (_, other) = keys_with_epochs(1);
        assert!(!other.verify_mac(data, &tag));
    }
}
