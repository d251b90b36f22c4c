//! Deterministic encryption of path components (file and directory names).
//!
//! Owns: `VaultKeys::encrypt_name` / `decrypt_name`. AES-256-SIV with the
//! names key, associated data = ["memvault name v1", parent path], the name
//! padded ISO/IEC 7816-4 style (0x80 then zeros) to the next multiple of 16
//! strictly above its length, the 16-byte SIV then the ciphertext encoded as
//! lowercase unpadded RFC 4648 base32.
//!
//! Promises: the same parent and name always give the same string (so git
//! history by path works on ciphertext); the same name under another parent
//! gives an unrelated string; a name moved under another parent does not
//! decrypt; names of 0..=127 bytes encode to at most 231 characters. The
//! base32 decoder is canonical (lowercase only, zero trailing bits), so
//! each name has exactly one encoding.
//!
//! Does not protect: equality (the same path is recognisable across
//! commits, by design) and length in 16-byte buckets.

use std::sync::LazyLock;

use aes_siv::KeyInit;
use aes_siv::siv::Aes256Siv;
use data_encoding::{Encoding, Specification};
use zeroize::Zeroizing;

use super::{CryptoError, VaultKeys, labels};

/// Longest name component, in bytes of UTF-8.
pub const MAX_NAME_LEN: usize = 127;
const BLOCK: usize = 16;
const SIV_LEN: usize = 16;
/// Base32 length of the longest name: 16 + 128 bytes -> 231 characters.
const MAX_ENCODED_LEN: usize = ((SIV_LEN + MAX_NAME_LEN + 1) * 8).div_ceil(5);

static BASE32_LOWER_NOPAD: LazyLock<Encoding> = LazyLock::new(|| {
    let mut spec = Specification::new();
    spec.symbols.push_str("abcdefghijklmnopqrstuvwxyz234567");
    spec.encoding().expect("a valid base32 specification")
});

impl VaultKeys {
    fn siv(&self) -> Aes256Siv {
        Aes256Siv::new(self.names_key().into())
    }

    /// Encrypts one path component bound to its parent's canonical path.
    pub fn encrypt_name(&self, parent: &str, name: &str) -> Result<String, CryptoError> {
        if name.len() > MAX_NAME_LEN {
            return Err(CryptoError::NameTooLong);
        }
        let padded_len = (name.len() / BLOCK + 1) * BLOCK;
        let mut buf = Zeroizing::new(Vec::with_capacity(padded_len + SIV_LEN));
        buf.extend_from_slice(name.as_bytes());
        buf.push(0x80);
        buf.resize(padded_len, 0);
        self.siv()
            .encrypt_in_place([labels::NAME_AD, parent.as_bytes()], &mut *buf)
            .expect("AES-SIV accepts this input");
        Ok(BASE32_LOWER_NOPAD.encode(&buf))
    }

    /// Reverses [`encrypt_name`](Self::encrypt_name) for the same parent.
    pub fn decrypt_name(&self, parent: &str, encoded: &str) -> Result<String, CryptoError> {
        if encoded.len() > MAX_ENCODED_LEN {
            return Err(CryptoError::DecryptionFailed);
        }
        let data = BASE32_LOWER_NOPAD
            .decode(encoded.as_bytes())
            .map_err(|_| CryptoError::DecryptionFailed)?;
        if data.len() < SIV_LEN + BLOCK || data.len() % BLOCK != 0 {
            return Err(CryptoError::DecryptionFailed);
        }
        let mut buf = Zeroizing::new(data);
        self.siv()
            .decrypt_in_place([labels::NAME_AD, parent.as_bytes()], &mut *buf)
            .map_err(|_| CryptoError::DecryptionFailed)?;
        let end = buf
            .iter()
            .rposition(|&b| b != 0)
            .filter(|&end| buf[end] == 0x80 && buf.len() - end <= BLOCK)
            .ok_or(CryptoError::DecryptionFailed)?;
        std::str::from_utf8(&buf[..end])
            .map(str::to_owned)
            .map_err(|_| CryptoError::DecryptionFailed)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::crypto::Keyring;

    fn keys() -> VaultKeys {
        VaultKeys::derive(&Keyring::new_random())
    }

    #[test]
    fn round_trip_and_determinism() {
        let keys = keys();
        for name in ["", "a", "notes.md", "caf\u{e9} \u{1f600}", &"x".repeat(127)] {
            let enc = keys.encrypt_name("/memories/a", name).unwrap();
            assert_eq!(keys.encrypt_name("/memories/a", name).unwrap(), enc);
            assert_eq!(keys.decrypt_name("/memories/a", &enc).unwrap(), name);
            assert!(
                enc.bytes()
                    .all(|b| b.is_ascii_lowercase() || (b'2'..=b'7').contains(&b))
            );
        }
    }

    #[test]
    fn parent_and_vault_change_the_name() {
        let keys = keys();
        let a = keys.encrypt_name("/memories/a", "notes.md").unwrap();
        let b = keys.encrypt_name("/memories/b", "notes.md").unwrap();
        assert_ne!(a, b);
        assert_ne!(keys.encrypt_name("/memories/a", "notes.mD").unwrap(), a);
        assert_eq!(
            keys.decrypt_name("/memories/b", &a).unwrap_err(),
            CryptoError::DecryptionFailed
        );
        assert!(self::keys().decrypt_name("/memories/a", &a).is_err());
        // The parent is one AD header, not concatenated with the label.
        assert_ne!(
            keys.encrypt_name("", "x").unwrap(),
            keys.encrypt_name("/", "x").unwrap()
        );
    }

    #[test]
    fn lengths_fall_in_16_byte_buckets() {
        let keys = keys();
        for len in 0..=MAX_NAME_LEN {
            let enc = keys.encrypt_name("/memories", &"n".repeat(len)).unwrap();
            let bytes = SIV_LEN + (len / BLOCK + 1) * BLOCK;
            assert_eq!(enc.len(), (bytes * 8).div_ceil(5), "name length {len}");
            assert!(enc.len() <= 255);
        }
        let longest = keys.encrypt_name("/memories", &"n".repeat(127)).unwrap();
        assert_eq!(longest.len(), MAX_ENCODED_LEN);
        assert_eq!(MAX_ENCODED_LEN, 231);
        let e15 = keys.encrypt_name("/m", &"n".repeat(15)).unwrap();
        let e0 = keys.encrypt_name("/m", "").unwrap();
        let e16 = keys.encrypt_name("/m", &"n".repeat(16)).unwrap();
        assert_eq!(e0.len(), e15.len());
        assert!(e16.len() > e15.len());
    }

    #[test]
    fn too_long_is_refused() {
        let keys = keys();
        let err = keys
            .encrypt_name("/memories", &"n".repeat(128))
            .unwrap_err();
        assert_eq!(err, CryptoError::NameTooLong);
        // 43 three-byte characters = 129 bytes.
        assert!(
            keys.encrypt_name("/memories", &"\u{20ac}".repeat(43))
                .is_err()
        );
    }

    #[test]
    fn garbage_and_tampering_fail() {
        let keys = keys();
        let enc = keys.encrypt_name("/memories", "secret-plan.md").unwrap();
        let mut cases = vec![
            String::new(),
            "a".into(),
            enc.to_uppercase(),
            enc[..enc.len() - 1].to_string(),
            format!("{enc}a"),
            format!("{enc}aaaaaaaaaaaaaaaaaaaaaaaaaa"),
            "!!!!".into(),
            "a".repeat(MAX_ENCODED_LEN + 8),
            // Valid base32 of 32 bytes that was never sealed.
            "a".repeat(52),
        ];
        for i in 0..enc.len() {
            let mut chars: Vec<char> = enc.chars().collect();
            chars[i] = if chars[i] == 'a' { 'b' } else { 'a' };
            cases.push(chars.into_iter().collect());
        }
        for case in cases {
            assert_eq!(
                keys.decrypt_name("/memories", &case),
                Err(CryptoError::DecryptionFailed),
                "{case}"
            );
        }
    }
}
