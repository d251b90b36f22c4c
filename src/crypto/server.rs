//! The keys of a `memvault server` root: one keyring, wrapped in a keyslot
//! under the operator's key file or passphrase (as a vault's is), from
//! which two keys derive: one seals the tenant registry (tenant names,
//! their vaults' keys, token hashes), the other hashes bearer tokens.
//!
//! Tokens are stored only as HMAC-SHA256 under the token key, and checked
//! in constant time: a copy of the registry, even decrypted, does not give
//! a token that works.

use hmac::Mac;
use zeroize::Zeroizing;

use super::primitives::{SecretBytes, hkdf, hmac, open, seal};
use super::{CryptoError, Keyring, labels};

/// The registry, token and high-water mark keys of one server root.
pub struct ServerKeys {
    registry: SecretBytes<32>,
    token: SecretBytes<32>,
    seen: SecretBytes<32>,
}

impl std::fmt::Debug for ServerKeys {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("ServerKeys([redacted])")
    }
}

/// Version byte of the sealed registry.
const REGISTRY_VERSION: u8 = 1;
/// magic || version || nonce (24).
const REGISTRY_HEADER_LEN: usize = 4 + 1 + 24;

impl ServerKeys {
    /// The keys of the root whose keyring is `keyring` (its epoch-0 key).
    pub fn derive(keyring: &Keyring) -> Result<ServerKeys, CryptoError> {
        let root = keyring.data_key(0).ok_or(CryptoError::Malformed)?;
        let ikm = root.expose_secret();
        Ok(ServerKeys {
            registry: hkdf(labels::SERVER_SALT, ikm, labels::SERVER_REGISTRY),
            token: hkdf(labels::SERVER_SALT, ikm, labels::SERVER_TOKEN),
            seen: hkdf(labels::SERVER_SALT, ikm, labels::SERVER_SEEN),
        })
    }

    /// Seal the registry's serialised form.
    pub fn seal_registry(&self, plain: &[u8]) -> Vec<u8> {
        let mut header = labels::REGISTRY_MAGIC.to_vec();
        header.push(REGISTRY_VERSION);
        seal(self.registry.expose(), header, labels::REGISTRY_AD, plain)
    }

    /// Open a sealed registry: `Malformed` for a header that is not one,
    /// `DecryptionFailed` for a wrong key or any change.
    pub fn open_registry(&self, sealed: &[u8]) -> Result<Zeroizing<Vec<u8>>, CryptoError> {
        if sealed.len() < REGISTRY_HEADER_LEN
            || &sealed[..4] != labels::REGISTRY_MAGIC
            || sealed[4] != REGISTRY_VERSION
        {
            return Err(CryptoError::Malformed);
        }
        open(
            self.registry.expose(),
            sealed,
            REGISTRY_HEADER_LEN,
            labels::REGISTRY_AD,
        )
    }

    /// The high-water mark file's bytes for `generation`: the generation
    /// (8 bytes, little-endian) and its HMAC-SHA256.
    pub fn seal_seen(&self, generation: u64) -> Vec<u8> {
        let g = generation.to_le_bytes();
        let tag: [u8; 32] = hmac(self.seen.expose(), &[&g])
            .finalize()
            .into_bytes()
            .into();
        let mut out = g.to_vec();
        out.extend_from_slice(&tag);
        out
    }

    /// The generation a high-water mark file names, if its tag checks out.
    pub fn open_seen(&self, bytes: &[u8]) -> Option<u64> {
        let (g, tag) = (bytes.get(..8)?, bytes.get(8..)?);
        if tag.len() != 32 || hmac(self.seen.expose(), &[g]).verify_slice(tag).is_err() {
            return None;
        }
        Some(u64::from_le_bytes(g.try_into().ok()?))
    }

    /// What the registry stores of a token.
    pub fn token_hash(&self, token: &[u8]) -> [u8; 32] {
        hmac(self.token.expose(), &[token])
            .finalize()
            .into_bytes()
            .into()
    }

    /// Whether `token` is the one whose stored hash is `stored`, compared
    /// in constant time.
    pub fn token_matches(&self, token: &[u8], stored: &[u8]) -> bool {
        hmac(self.token.expose(), &[token])
            .verify_slice(stored)
            .is_ok()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_high_water_mark_opens_only_as_written_and_with_its_key() {
        let keys = ServerKeys::derive(&Keyring::new_random()).unwrap();
        let other = ServerKeys::derive(&Keyring::new_random()).unwrap();
        let mark = keys.seal_seen(41);
        assert_eq!(keys.open_seen(&mark), Some(41));
        assert_eq!(other.open_seen(&mark), None);
        for i in 0..mark.len() {
            let mut bad = mark.clone();
            bad[i] ^= 1;
            assert_eq!(keys.open_seen(&bad), None, "byte {i}");
        }
        assert_eq!(keys.open_seen(&mark[..39]), None);
        assert_eq!(keys.open_seen(&[mark.clone(), vec![0]].concat()), None);
    }

    #[test]
    fn registry_round_trips_and_refuses_any_change_or_other_key() {
        let keys = ServerKeys::derive(&Keyring::new_random()).unwrap();
        let sealed = keys.seal_registry(b"{\"v\":1}");
        assert_eq!(&keys.open_registry(&sealed).unwrap()[..], b"{\"v\":1}");
        for i in 0..sealed.len() {
            let mut bad = sealed.clone();
            bad[i] ^= 1;
            assert!(keys.open_registry(&bad).is_err(), "byte {i}");
        }
        let other = ServerKeys::derive(&Keyring::new_random()).unwrap();
        assert_eq!(
            other.open_registry(&sealed).unwrap_err(),
            CryptoError::DecryptionFailed
        );
    }

    #[test]
    fn token_hashes_match_only_their_token_and_key() {
        let keys = ServerKeys::derive(&Keyring::new_random()).unwrap();
        let h = keys.token_hash(b"mvt_a");
        assert!(keys.token_matches(b"mvt_a", &h));
        assert!(!keys.token_matches(b"mvt_b", &h));
        assert!(!keys.token_matches(b"mvt_a", &h[..31]));
        let other = ServerKeys::derive(&Keyring::new_random()).unwrap();
        assert!(!other.token_matches(b"mvt_a", &h));
    }
}
