//! The blob envelope: how a file's content is stored in a git blob.
//!
//! Owns: `"MVB1" || version 1 || file-key id 16 || nonce 24` (45 bytes),
//! then XChaCha20-Poly1305 ciphertext and its 16-byte tag, under the file's
//! own key. Associated data: the header, then `0x00 || "memvault blob v1" ||
//! 0x00 || canonical logical path`.
//!
//! Promises: a blob opens only with its file key and at the path it was
//! sealed for (a blob moved or copied to another path fails); the file-key
//! id is readable without any key; the plaintext size is the blob size
//! minus [`BLOB_OVERHEAD`], so listings need no decryption. No compression.
//!
//! Does not protect: the content's length, or which blobs share a file key
//! (the id is in clear). A blob stays readable for as long as its file key
//! exists: erasure is deleting the key, not the blob.

use zeroize::Zeroizing;

use super::primitives::{NONCE_LEN, TAG_LEN, open, seal};
use super::{CryptoError, FileKey, FileKeyId, labels};

const VERSION: u8 = 1;
const ID_AT: usize = 4 + 1;
const HEADER_LEN: usize = ID_AT + 16 + NONCE_LEN;

/// Bytes a blob adds to its plaintext: 45 header + 16 tag.
pub const BLOB_OVERHEAD: usize = HEADER_LEN + TAG_LEN;

fn context(path: &str) -> Vec<u8> {
    [&[0][..], labels::BLOB_AD, &[0], path.as_bytes()].concat()
}

/// Seals file content for `path` (the canonical logical path, such as
/// `/memories/a/b.txt`) under the file key `key` named `id`.
pub fn seal_blob(key: &FileKey, id: &FileKeyId, path: &str, plaintext: &[u8]) -> Vec<u8> {
    let mut header = Vec::with_capacity(HEADER_LEN);
    header.extend_from_slice(labels::BLOB_MAGIC);
    header.push(VERSION);
    header.extend_from_slice(&id.0);
    seal(key.expose_secret(), header, &context(path), plaintext)
}

/// The id of the file key a blob needs (header parse only, no key).
pub fn blob_key_id(blob: &[u8]) -> Result<FileKeyId, CryptoError> {
    if blob.len() < BLOB_OVERHEAD || &blob[..4] != labels::BLOB_MAGIC || blob[4] != VERSION {
        return Err(CryptoError::Malformed);
    }
    let id = blob[ID_AT..ID_AT + 16]
        .try_into()
        .map_err(|_| CryptoError::Malformed)?;
    Ok(FileKeyId(id))
}

/// Opens a blob sealed for `path` under `key`.
pub fn open_blob(
    key: &FileKey,
    path: &str,
    blob: &[u8],
) -> Result<Zeroizing<Vec<u8>>, CryptoError> {
    blob_key_id(blob)?;
    open(key.expose_secret(), blob, HEADER_LEN, &context(path))
}

/// The plaintext length of a blob of `blob_len` bytes, if it can be a blob.
pub fn plaintext_len(blob_len: u64) -> Option<u64> {
    blob_len.checked_sub(BLOB_OVERHEAD as u64)
}

#[cfg(test)]
mod tests {
    use super::*;

    const PATH: &str = "/memories/a/b.txt";

    #[test]
    fn round_trip_and_sizes() {
        let (key, id) = (FileKey::generate(), FileKeyId::generate());
        assert_eq!(BLOB_OVERHEAD, 61);
        for content in [&b""[..], b"x", &[0x5a; 5000]] {
            let blob = seal_blob(&key, &id, PATH, content);
            assert_eq!(blob.len(), content.len() + BLOB_OVERHEAD);
            assert_eq!(plaintext_len(blob.len() as u64), Some(content.len() as u64));
            assert_eq!(blob_key_id(&blob).unwrap(), id);
            assert_eq!(&open_blob(&key, PATH, &blob).unwrap()[..], content);
        }
        assert_eq!(plaintext_len(60), None);
        assert_ne!(
            seal_blob(&key, &id, PATH, b"same"),
            seal_blob(&key, &id, PATH, b"same")
        );
    }

    #[test]
    fn moved_blob_or_wrong_key_fails() {
        let (key, id) = (FileKey::generate(), FileKeyId::generate());
        let blob = seal_blob(&key, &id, PATH, b"content");
        for path in ["/memories/a/c.txt", "/memories/a/b.txt ", "/memories/a", ""] {
            assert_eq!(
                open_blob(&key, path, &blob).unwrap_err(),
                CryptoError::DecryptionFailed
            );
        }
        assert!(open_blob(&FileKey::generate(), PATH, &blob).is_err());
    }

    #[test]
    fn tamper_flip_truncate_extend() {
        let (key, id) = (FileKey::generate(), FileKeyId::generate());
        let blob = seal_blob(&key, &id, PATH, b"the quick brown fox");
        for i in 0..blob.len() {
            for bit in [0x01, 0x80] {
                let mut bad = blob.clone();
                bad[i] ^= bit;
                let err = open_blob(&key, PATH, &bad).unwrap_err();
                assert!(
                    matches!(err, CryptoError::DecryptionFailed | CryptoError::Malformed),
                    "byte {i}"
                );
            }
        }
        for len in 0..blob.len() {
            assert!(
                open_blob(&key, PATH, &blob[..len]).is_err(),
                "truncated to {len}"
            );
        }
        for extra in [&[0u8][..], &[0; 16]] {
            assert!(open_blob(&key, PATH, &[&blob[..], extra].concat()).is_err());
        }
    }

    #[test]
    fn header_parse_rejects_foreign_data() {
        let blob = seal_blob(&FileKey::generate(), &FileKeyId::generate(), PATH, b"");
        assert!(blob_key_id(&blob[..BLOB_OVERHEAD - 1]).is_err());
        let mut bad = blob.clone();
        bad[0] = b'X';
        assert_eq!(blob_key_id(&bad).unwrap_err(), CryptoError::Malformed);
        bad = blob.clone();
        bad[4] = 2;
        assert_eq!(blob_key_id(&bad).unwrap_err(), CryptoError::Malformed);
    }
}
