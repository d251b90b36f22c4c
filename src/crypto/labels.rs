//! Every domain-separation string and format magic in one place.
//!
//! Owns: the byte strings that keep one key, one MAC and one ciphertext kind
//! from ever being mistaken for another. Changing any of them makes existing
//! vaults unreadable, so each one carries a version and none is built at run
//! time.

/// HKDF salt for every vault subkey.
pub const HKDF_SALT: &[u8] = b"memvault v1";
/// HKDF info: 64-byte AES-256-SIV key for names (from the epoch-0 data key).
pub const NAMES: &[u8] = b"memvault names";
/// HKDF info: XChaCha20-Poly1305 key for commit metadata.
pub const COMMIT_META: &[u8] = b"memvault commit meta";
/// HKDF info: HMAC-SHA256 key for the commit MAC.
pub const COMMIT_MAC: &[u8] = b"memvault commit mac";
/// HKDF info: XChaCha20-Poly1305 key for the access table.
pub const ACCESS_TABLE: &[u8] = b"memvault access table";
/// HKDF info: XChaCha20-Poly1305 key for file-key table shards.
pub const KEY_TABLE: &[u8] = b"memvault key table";
/// HKDF info: XChaCha20-Poly1305 key for the vault settings (kept in the
/// key state, so that nobody without the key can weaken them).
pub const SETTINGS: &[u8] = b"memvault settings";
/// Associated data of the sealed settings.
pub const SETTINGS_AD: &[u8] = b"memvault settings v1\0";
/// HKDF info: HMAC-SHA256 key that authenticates the entries of the
/// write-ahead log (from the epoch-0 data key: stable across rekeys, as
/// the log outlives no checkpoint).
pub const LOG_MAC: &[u8] = b"memvault log mac";
/// Prefix of what the `serve` handshake MACs (under the commit MAC key;
/// a commit buffer starts with `tree `, so the two never coincide).
pub const SERVE_HANDSHAKE: &[u8] = b"memvault serve handshake v1\0";
/// HKDF info: wrap key of a key-file slot (salt = the slot's salt).
pub const KEYFILE_SLOT: &[u8] = b"memvault keyfile slot";

/// HMAC prefix of [`FileKey::content_hash`](super::FileKey::content_hash).
pub const CONTENT_HASH: &[u8] = b"memvault content hash v1";
/// First AES-SIV associated-data header of an encrypted name.
pub const NAME_AD: &[u8] = b"memvault name v1";
/// Label in a blob's associated data, between the header and the path.
pub const BLOB_AD: &[u8] = b"memvault blob v1";

/// Magic of a blob envelope.
pub const BLOB_MAGIC: &[u8; 4] = b"MVB1";
/// Magic of a keyslot.
pub const SLOT_MAGIC: &[u8; 4] = b"MVKS";
/// Magic of a file-key table shard.
pub const TABLE_MAGIC: &[u8; 4] = b"MVKT";

/// HKDF salt of the keys of a `memvault server` root (from its keyring's
/// epoch-0 key).
pub const SERVER_SALT: &[u8] = b"memvault server v1";
/// HKDF info: XChaCha20-Poly1305 key that seals the server's tenant registry.
pub const SERVER_REGISTRY: &[u8] = b"memvault server registry";
/// HKDF info: HMAC-SHA256 key under which bearer tokens are stored hashed.
pub const SERVER_TOKEN: &[u8] = b"memvault server token";
/// HKDF info: HMAC-SHA256 key of the root's high-water mark (the newest
/// registry generation this root has served).
pub const SERVER_SEEN: &[u8] = b"memvault server seen";
/// Magic of a sealed tenant registry.
pub const REGISTRY_MAGIC: &[u8; 4] = b"MVSR";
/// Associated data of the sealed registry.
pub const REGISTRY_AD: &[u8] = b"memvault server registry v1\0";
