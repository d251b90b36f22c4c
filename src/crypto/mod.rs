//! Cryptography for memvault: the only module that touches the AEAD, KDF,
//! SIV and MAC crates.
//!
//! | file            | owns                                                        |
//! |-----------------|-------------------------------------------------------------|
//! | `labels.rs`     | every HKDF label, associated-data label and magic           |
//! | `primitives.rs` | XChaCha20-Poly1305 layout, HKDF, HMAC, randomness, wiping   |
//! | `keys.rs`       | secret key types, `FileKeyId`, the `Keyring` of epochs      |
//! | `subkeys.rs`    | `VaultKeys`: derived subkeys, commit meta, access, MAC      |
//! | `names.rs`      | deterministic name encryption (AES-256-SIV, base32)         |
//! | `table.rs`      | `KeyTable` and its sealed shards                            |
//! | `blob.rs`       | the file-content envelope                                   |
//! | `slot.rs`       | passphrase and key-file keyslots wrapping the `Keyring`     |
//!
//! # Promises
//!
//! - Every sealed format is authenticated end to end: a flipped, truncated,
//!   extended or moved byte makes opening fail; nothing unauthenticated is
//!   ever returned as plaintext.
//! - Each format binds its context in the associated data: a blob its
//!   logical path, a name its parent path, a shard its shard number, a
//!   keyslot its KDF parameters.
//! - Secrets are types that wipe on drop and never print; decrypted data
//!   comes back in `Zeroizing` buffers.
//! - Errors are coarse ([`CryptoError`]) and never carry key material,
//!   plaintext, names or paths.
//! - Key derivation work is bounded: keyslot parameters above
//!   [`KdfParams::MAX`] are refused before any memory is allocated.
//!
//! # Does not protect
//!
//! - Sizes: blob lengths, name lengths (16-byte buckets) and the number of
//!   files are visible. Names are deterministic by design, so equal paths
//!   give equal ciphertexts.
//! - Rollback: an older, validly sealed value (a previous key-table shard,
//!   a previous commit) still opens; freshness is the vault's job.
//! - Memory outside our buffers: swap, core dumps, register and stack
//!   copies, and AES key schedules inside the `aes`/`cmac` crates.

mod blob;
mod keys;
mod labels;
mod names;
mod primitives;
mod server;
mod slot;
mod subkeys;
mod table;

pub use blob::{BLOB_OVERHEAD, blob_key_id, open_blob, plaintext_len, seal_blob};
pub use keys::{DataKey, FileKey, FileKeyId, KeyFileKey, Keyring, Passphrase};
pub use names::MAX_NAME_LEN;
pub use primitives::random_bytes;
pub use server::ServerKeys;
pub use slot::{
    KdfParams, SlotInfo, SlotKind, Unlock, open_slot, seal_keyfile_slot, seal_passphrase_slot,
    slot_info,
};
pub use subkeys::{LogKey, VaultKeys, serve_tag, serve_tag_ok};
pub use table::{KeyTable, ShardLayout};

/// Why a cryptographic operation failed. Deliberately coarse: it says what
/// to do next, never which byte or key was wrong.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum CryptoError {
    /// Wrong key or secret, or the data was changed.
    #[error("decryption failed")]
    DecryptionFailed,
    /// Hostile or absurd Argon2 parameters: nothing was derived.
    #[error("key derivation parameters exceed the allowed maximum; refusing to derive")]
    ExcessiveWork,
    /// Argon2 parameters below Argon2's own minimums.
    #[error("key derivation parameters are below the allowed minimum")]
    BadParams,
    #[error("a key file must hold exactly 32 bytes")]
    BadKeyFile,
    #[error("a name component is longer than 127 bytes")]
    NameTooLong,
    /// A passphrase offered to a key-file slot or the reverse.
    #[error("this keyslot needs a different kind of secret")]
    WrongKind,
    /// A header that does not parse (bad magic, version, kind or length).
    #[error("malformed encrypted data")]
    Malformed,
}
