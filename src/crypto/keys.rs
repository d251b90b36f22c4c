//! Secret key types and the keyring a keyslot protects.
//!
//! Owns: `DataKey`, `FileKey`, `KeyFileKey`, `Passphrase` (secrets),
//! `FileKeyId` (public), and `Keyring`, the list of data-key epochs with its
//! serialised form.
//!
//! Promises: no secret type is `Copy`, `Clone`, `Default` or `Display`; its
//! `Debug` prints `[redacted]`; its bytes live in one heap box, are reached
//! only through `expose_secret()` and are wiped on drop. A `Keyring` always
//! holds epoch 0 (the name key comes from it) and at most `u16::MAX` epochs.
//!
//! Does not protect: a key the caller copies out of `expose_secret()`.

use std::collections::BTreeMap;
use std::fmt;

use data_encoding::HEXLOWER;
use hmac::Mac;
use zeroize::{Zeroize, ZeroizeOnDrop, Zeroizing};

use super::primitives::{SecretBytes, be_u32, hmac, random_bytes};
use super::{CryptoError, labels};

macro_rules! secret_key {
    ($(#[$doc:meta])* $name:ident) => {
        $(#[$doc])*
        pub struct $name(SecretBytes<32>);

        impl $name {
            /// A fresh key from the OS random source.
            pub fn generate() -> Self {
                Self(SecretBytes::random())
            }
        }

        impl Zeroize for $name {
            fn zeroize(&mut self) {
                self.0.zeroize();
            }
        }

        impl ZeroizeOnDrop for $name {}

        impl fmt::Debug for $name {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str(concat!(stringify!($name), "([redacted])"))
            }
        }
    };
}

secret_key! {
    /// A vault's 256-bit data key for one epoch; every subkey derives from it.
    DataKey
}

secret_key! {
    /// A file's 256-bit content key, kept in the key table outside the
    /// history: deleting it erases every version of the file.
    FileKey
}

secret_key! {
    /// The raw 32 bytes of a key file (a keyslot secret for automation).
    KeyFileKey
}

impl DataKey {
    pub(super) fn expose_secret(&self) -> &[u8; 32] {
        self.0.expose()
    }
}

impl FileKey {
    pub(super) fn from_secret(bytes: SecretBytes<32>) -> Self {
        Self(bytes)
    }

    pub(super) fn expose_secret(&self) -> &[u8; 32] {
        self.0.expose()
    }

    /// A second copy of this key (a merge of two key states hands a key
    /// of the other side's table to this side's).
    pub fn duplicate(&self) -> FileKey {
        let mut copy = SecretBytes::zeroed();
        copy.expose_mut().copy_from_slice(self.0.expose());
        FileKey(copy)
    }

    /// HMAC-SHA256(file key, "memvault content hash v1" || plaintext).
    ///
    /// Keyed by the file key, so erasing the key also stops the hash from
    /// confirming a guessed plaintext.
    pub fn content_hash(&self, plaintext: &[u8]) -> [u8; 32] {
        hmac(self.0.expose(), &[labels::CONTENT_HASH, plaintext])
            .finalize()
            .into_bytes()
            .into()
    }
}

impl KeyFileKey {
    /// Takes a key file's content; it must be exactly 32 bytes.
    pub fn from_bytes(bytes: &[u8]) -> Result<KeyFileKey, CryptoError> {
        SecretBytes::from_slice(bytes)
            .map(Self)
            .ok_or(CryptoError::BadKeyFile)
    }

    /// The raw bytes, e.g. to write a new key file.
    pub fn expose_secret(&self) -> &[u8; 32] {
        self.0.expose()
    }
}

/// A passphrase, wiped on drop.
pub struct Passphrase(Zeroizing<String>);

impl Passphrase {
    pub fn new(passphrase: String) -> Self {
        Self(Zeroizing::new(passphrase))
    }

    pub fn expose_secret(&self) -> &str {
        &self.0
    }
}

impl Zeroize for Passphrase {
    fn zeroize(&mut self) {
        self.0.zeroize();
    }
}

impl ZeroizeOnDrop for Passphrase {}

impl fmt::Debug for Passphrase {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("Passphrase([redacted])")
    }
}

/// Names a file key. Not secret: it is stored in every blob header.
#[derive(Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct FileKeyId(pub [u8; 16]);

impl FileKeyId {
    pub fn generate() -> Self {
        Self(random_bytes())
    }

    /// 32 lowercase hex digits.
    pub fn to_hex(&self) -> String {
        HEXLOWER.encode(&self.0)
    }

    /// Parses exactly what [`to_hex`](Self::to_hex) writes.
    pub fn from_hex(hex: &str) -> Option<Self> {
        let bytes = HEXLOWER.decode(hex.as_bytes()).ok()?;
        Some(Self(bytes.try_into().ok()?))
    }
}

impl fmt::Debug for FileKeyId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "FileKeyId({})", self.to_hex())
    }
}

/// The data keys of every epoch, oldest first; what a keyslot protects.
///
/// New data is written under the current (highest) epoch; older epochs stay
/// so data written under them still opens.
pub struct Keyring {
    keys: BTreeMap<u32, DataKey>,
}

const KEYRING_VERSION: u8 = 1;
const KEYRING_ENTRY: usize = 4 + 32;

impl Keyring {
    /// One random data key at epoch 0.
    pub fn new_random() -> Keyring {
        Keyring {
            keys: BTreeMap::from([(0, DataKey::generate())]),
        }
    }

    pub fn current_epoch(&self) -> u32 {
        self.keys.keys().next_back().copied().unwrap_or(0)
    }

    pub fn data_key(&self, epoch: u32) -> Option<&DataKey> {
        self.keys.get(&epoch)
    }

    /// Adds a random data key at `current_epoch() + 1` and returns that epoch.
    ///
    /// # Panics
    ///
    /// If the keyring already holds `u16::MAX` epochs (its serialised limit).
    pub fn add_epoch(&mut self) -> u32 {
        assert!(self.keys.len() < usize::from(u16::MAX), "keyring is full");
        let epoch = self.current_epoch() + 1;
        self.keys.insert(epoch, DataKey::generate());
        epoch
    }

    /// A second copy, for a second handle on the same vault in this
    /// process (the expiry thread of `serve`). Not `Clone`: copies of
    /// secrets are made on purpose only.
    pub fn duplicate(&self) -> Keyring {
        Keyring::from_bytes(&self.to_bytes()).expect("a keyring round-trips")
    }

    pub(super) fn epochs(&self) -> impl Iterator<Item = (u32, &DataKey)> {
        self.keys.iter().map(|(e, k)| (*e, k))
    }

    /// version 1 || count u16 BE || (epoch u32 BE || key 32)*, ascending.
    pub(super) fn to_bytes(&self) -> Zeroizing<Vec<u8>> {
        let mut out = Zeroizing::new(Vec::with_capacity(3 + self.keys.len() * KEYRING_ENTRY));
        out.push(KEYRING_VERSION);
        let count = u16::try_from(self.keys.len()).expect("add_epoch bounds the count");
        out.extend_from_slice(&count.to_be_bytes());
        for (epoch, key) in self.epochs() {
            out.extend_from_slice(&epoch.to_be_bytes());
            out.extend_from_slice(key.expose_secret());
        }
        out
    }

    /// Parses [`to_bytes`](Self::to_bytes): strictly ascending epochs
    /// starting at 0, exact length.
    pub(super) fn from_bytes(bytes: &[u8]) -> Result<Keyring, CryptoError> {
        let (&[version, c0, c1], entries) =
            bytes.split_first_chunk().ok_or(CryptoError::Malformed)?;
        let count = usize::from(u16::from_be_bytes([c0, c1]));
        if version != KEYRING_VERSION || count == 0 || entries.len() != count * KEYRING_ENTRY {
            return Err(CryptoError::Malformed);
        }
        let mut keys = BTreeMap::new();
        let mut prev: Option<u32> = None;
        for entry in entries.chunks_exact(KEYRING_ENTRY) {
            let epoch = be_u32(entry, 0).ok_or(CryptoError::Malformed)?;
            if prev.map_or(epoch != 0, |p| epoch <= p) {
                return Err(CryptoError::Malformed);
            }
            prev = Some(epoch);
            let key = SecretBytes::from_slice(&entry[4..]).ok_or(CryptoError::Malformed)?;
            keys.insert(epoch, DataKey(key));
        }
        Ok(Keyring { keys })
    }
}

impl fmt::Debug for Keyring {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Keyring")
            .field("epochs", &self.keys.keys().collect::<Vec<_>>())
            .finish_non_exhaustive()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn zeroize_wipes_secret_bytes() {
        let mut data = DataKey::generate();
        let mut file = FileKey::generate();
        let mut keyfile = KeyFileKey::generate();
        assert_ne!(keyfile.expose_secret(), &[0u8; 32]);
        data.zeroize();
        file.zeroize();
        keyfile.zeroize();
        assert_eq!(data.expose_secret(), &[0u8; 32]);
        assert_eq!(file.expose_secret(), &[0u8; 32]);
        assert_eq!(keyfile.expose_secret(), &[0u8; 32]);
        let mut pass = Passphrase::new("correct horse".to_owned());
        pass.zeroize();
        assert_eq!(pass.expose_secret(), "");
    }

    #[test]
    fn debug_is_redacted() {
        let key = KeyFileKey::from_bytes(&[0x41; 32]).unwrap();
        assert_eq!(format!("{key:?}"), "KeyFileKey([redacted])");
        let pass = Passphrase::new("hunter2".to_owned());
        assert!(!format!("{pass:?}").contains("hunter2"));
        let mut ring = Keyring::new_random();
        ring.add_epoch();
        assert_eq!(format!("{ring:?}"), "Keyring { epochs: [0, 1], .. }");
    }

    #[test]
    fn key_file_must_be_32_bytes() {
        assert!(KeyFileKey::from_bytes(&[7; 32]).is_ok());
        for len in [0, 31, 33, 64] {
            let err = KeyFileKey::from_bytes(&vec![7; len]).unwrap_err();
            assert_eq!(err, CryptoError::BadKeyFile);
        }
    }

    #[test]
    fn file_key_id_hex_round_trip() {
        let id = FileKeyId::generate();
        let hex = id.to_hex();
        assert_eq!(hex.len(), 32);
        assert_eq!(FileKeyId::from_hex(&hex), Some(id));
        let id = FileKeyId([0xab; 16]);
        assert_eq!(FileKeyId::from_hex(&id.to_hex()), Some(id));
        assert_eq!(FileKeyId::from_hex(&id.to_hex().to_uppercase()), None);
        assert_eq!(FileKeyId::from_hex(&hex[..30]), None);
        assert_eq!(FileKeyId::from_hex("zz"), None);
    }

    #[test]
    fn content_hash_is_keyed_and_deterministic() {
        let a = FileKey::generate();
        let b = FileKey::generate();
        assert_eq!(a.content_hash(b"hello"), a.content_hash(b"hello"));
        assert_ne!(a.content_hash(b"hello"), a.content_hash(b"hellp"));
        assert_ne!(a.content_hash(b"hello"), b.content_hash(b"hello"));
    }

    #[test]
    fn keyring_epochs() {
        let mut ring = Keyring::new_random();
        assert_eq!(ring.current_epoch(), 0);
        assert_eq!(ring.add_epoch(), 1);
        assert_eq!(ring.add_epoch(), 2);
        assert_eq!(ring.current_epoch(), 2);
        assert!(ring.data_key(3).is_none());
        assert_ne!(
            ring.data_key(0).unwrap().expose_secret(),
            ring.data_key(2).unwrap().expose_secret()
        );
    }

    #[test]
    fn keyring_serialisation_round_trip_with_three_epochs() {
        let mut ring = Keyring::new_random();
        ring.add_epoch();
        ring.add_epoch();
        let bytes = ring.to_bytes();
        assert_eq!(bytes.len(), 3 + 3 * KEYRING_ENTRY);
        assert_eq!(&bytes[..3], &[1, 0, 3]);
        let back = Keyring::from_bytes(&bytes).unwrap();
        assert_eq!(back.current_epoch(), 2);
        for epoch in 0..3 {
            assert_eq!(
                back.data_key(epoch).unwrap().expose_secret(),
                ring.data_key(epoch).unwrap().expose_secret()
            );
        }
    }

    #[test]
    fn keyring_parse_rejects_bad_shapes() {
        let mut ring = Keyring::new_random();
        ring.add_epoch();
        let good = ring.to_bytes().to_vec();
        let mut cases: Vec<Vec<u8>> = vec![
            vec![],
            vec![1, 0, 0],
            good[..good.len() - 1].to_vec(),
            [&good[..], &[0]].concat(),
        ];
        let mut bad_version = good.clone();
        bad_version[0] = 2;
        cases.push(bad_version);
        let mut no_epoch_zero = good.clone();
        no_epoch_zero[6] = 5;
        cases.push(no_epoch_zero);
        let mut duplicate = good.clone();
        duplicate[3 + KEYRING_ENTRY + 3] = 0;
        cases.push(duplicate);
        for case in cases {
            assert_eq!(
                Keyring::from_bytes(&case).unwrap_err(),
                CryptoError::Malformed
            );
        }
    }
}
