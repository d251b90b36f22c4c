//! The AEAD, KDF and MAC calls every format in this module is built from.
//!
//! Owns: the one XChaCha20-Poly1305 layout (`header || ciphertext || tag`,
//! the header ending in the nonce and authenticated with it), HKDF-SHA256
//! expansion, HMAC-SHA256, the OS random source, and `SecretBytes`, the boxed
//! key buffer that wipes itself.
//!
//! Promises: a sealed message opens only with the same key, the same header
//! bytes and the same context bytes; every buffer that held key material or
//! plaintext is wiped when dropped.
//!
//! Does not protect: against a failing OS random source (we panic rather
//! than continue with a weak nonce or key), or copies the optimiser makes in
//! registers and on the stack.

use chacha20poly1305::aead::{AeadInOut, KeyInit};
use chacha20poly1305::{Tag, XChaCha20Poly1305, XNonce};
use hkdf::Hkdf;
use hmac::{Hmac, Mac};
use sha2::Sha256;
use zeroize::{Zeroize, ZeroizeOnDrop, Zeroizing};

use super::CryptoError;

/// XChaCha20-Poly1305 nonce length.
pub const NONCE_LEN: usize = 24;
/// Poly1305 tag length.
pub const TAG_LEN: usize = 16;

/// `N` bytes from the operating system's random source.
///
/// # Panics
///
/// If the OS random source fails: a key or nonce must never be built from
/// anything weaker.
pub fn random_bytes<const N: usize>() -> [u8; N] {
    let mut out = [0u8; N];
    getrandom::fill(&mut out).expect("the operating system's random source failed");
    out
}

/// A boxed secret of `N` bytes: moves do not leave copies behind, drop
/// wipes it, and the bytes are reached only through `expose`.
pub struct SecretBytes<const N: usize>(Box<[u8; N]>);

impl<const N: usize> SecretBytes<N> {
    pub fn zeroed() -> Self {
        Self(Box::new([0u8; N]))
    }

    pub fn random() -> Self {
        let mut s = Self::zeroed();
        getrandom::fill(&mut s.0[..]).expect("the operating system's random source failed");
        s
    }

    pub fn from_slice(bytes: &[u8]) -> Option<Self> {
        if bytes.len() != N {
            return None;
        }
        let mut s = Self::zeroed();
        s.0.copy_from_slice(bytes);
        Some(s)
    }

    pub fn expose(&self) -> &[u8; N] {
        &self.0
    }

    pub fn expose_mut(&mut self) -> &mut [u8; N] {
        &mut self.0
    }
}

impl<const N: usize> Zeroize for SecretBytes<N> {
    fn zeroize(&mut self) {
        self.0.zeroize();
    }
}

impl<const N: usize> Drop for SecretBytes<N> {
    fn drop(&mut self) {
        self.zeroize();
    }
}

impl<const N: usize> ZeroizeOnDrop for SecretBytes<N> {}

/// HKDF-SHA256 into a fresh secret of `N` bytes.
pub fn hkdf<const N: usize>(salt: &[u8], ikm: &[u8], info: &[u8]) -> SecretBytes<N> {
    let mut out = SecretBytes::zeroed();
    Hkdf::<Sha256>::new(Some(salt), ikm)
        .expand(info, out.expose_mut())
        .expect("HKDF-SHA256 output lengths used here are far below 255 * 32");
    out
}

/// HMAC-SHA256 over the concatenation of `parts`.
pub fn hmac(key: &[u8; 32], parts: &[&[u8]]) -> Hmac<Sha256> {
    let mut mac = <Hmac<Sha256> as KeyInit>::new_from_slice(key)
        .expect("HMAC-SHA256 accepts keys of any length");
    for part in parts {
        mac.update(part);
    }
    mac
}

/// Seals `plaintext` after `header`, returning `header || nonce || ct || tag`.
///
/// The associated data is every byte before the ciphertext (the header and
/// the nonce) followed by `context`, which is not stored: the opener must
/// supply the same context (a path, a shard number, a caller's AAD).
///
/// Nonce rule: each call draws a fresh random 192-bit nonce from the OS. At
/// that size random nonces have no practical collision risk (about 2^-96
/// after 2^48 messages under one key), so no counter or state is kept.
pub fn seal(key: &[u8; 32], mut header: Vec<u8>, context: &[u8], plaintext: &[u8]) -> Vec<u8> {
    let nonce: [u8; NONCE_LEN] = random_bytes();
    header.extend_from_slice(&nonce);
    let aad = [&header[..], context].concat();
    let start = header.len();
    // Reserve first, so the plaintext never sits in a buffer that is
    // reallocated (and freed unwiped) before it is encrypted in place.
    let mut out = header;
    out.reserve_exact(plaintext.len() + TAG_LEN);
    out.extend_from_slice(plaintext);
    let tag = XChaCha20Poly1305::new(key.into())
        .encrypt_inout_detached(&XNonce::from(nonce), &aad, (&mut out[start..]).into())
        .expect("XChaCha20-Poly1305 accepts messages up to 256 GiB");
    out.extend_from_slice(&tag);
    out
}

/// Opens what [`seal`] produced, given the header length (nonce included).
pub fn open(
    key: &[u8; 32],
    sealed: &[u8],
    header_len: usize,
    context: &[u8],
) -> Result<Zeroizing<Vec<u8>>, CryptoError> {
    let body_len = sealed
        .len()
        .checked_sub(header_len + TAG_LEN)
        .ok_or(CryptoError::DecryptionFailed)?;
    let (header, rest) = sealed.split_at(header_len);
    let (ciphertext, tag) = rest.split_at(body_len);
    let nonce = XNonce::try_from(&header[header_len - NONCE_LEN..])
        .map_err(|_| CryptoError::DecryptionFailed)?;
    let tag = Tag::try_from(tag).map_err(|_| CryptoError::DecryptionFailed)?;
    let aad = [header, context].concat();
    let mut buf = Zeroizing::new(ciphertext.to_vec());
    XChaCha20Poly1305::new(key.into())
        .decrypt_inout_detached(&nonce, &aad, buf.as_mut_slice().into(), &tag)
        .map_err(|_| CryptoError::DecryptionFailed)?;
    Ok(buf)
}

/// Reads a big-endian `u32` at `at`, if the bytes are there.
pub fn be_u32(bytes: &[u8], at: usize) -> Option<u32> {
    let b = bytes.get(at..at.checked_add(4)?)?;
    Some(u32::from_be_bytes(b.try_into().ok()?))
}
