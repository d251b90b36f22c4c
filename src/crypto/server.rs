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

/// The registry and token keys of one server root.
pub struct ServerKeys {
    registry: SecretBytes<32>,
    token: SecretBytes<32>,
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
