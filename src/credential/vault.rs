//! Encryption at rest of users' upstream tokens: AES-256-GCM under the
//! `[credentials] key_file` key, a fresh 96-bit nonce per sealing, and
//! the owner (issuer, tenant, subject, upstream) as associated data, so a
//! sealed token copied onto another owner's row does not open. A sealed
//! value names the key it was sealed under (the key's id), so a store
//! sealed under another key says so rather than "corrupt".

use ring::aead::{Aad, LessSafeKey, Nonce, UnboundKey, AES_256_GCM, NONCE_LEN};
use ring::rand::{SecureRandom, SystemRandom};

/// What every sealed value starts with (format version).
const VERSION: u8 = 1;

/// The key and its id.
pub(crate) struct Vault {
    key: LessSafeKey,
    /// The first 8 bytes of a digest of the key (not secret).
    id: [u8; 8],
    rng: SystemRandom,
}

/// Why a sealed value did not open.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub(crate) enum VaultError {
    /// Sealed under another key.
    #[error("sealed under another key (id {0})")]
    OtherKey(String),
    /// Altered, cut, or another owner's.
    #[error("does not open: altered, or another owner's")]
    Corrupt,
    /// No randomness for a nonce.
    #[error("no randomness for a nonce")]
    NoRandom,
}

impl Vault {
    /// The vault of `key`.
    ///
    /// # Errors
    /// The key is not an AES-256 key (never for 32 bytes).
    pub(crate) fn new(key: &[u8; crate::config::KEY_BYTES]) -> Result<Vault, VaultError> {
        let unbound = UnboundKey::new(&AES_256_GCM, key).map_err(|_| VaultError::Corrupt)?;
        let mut h = crate::digest::Sha256::new();
        h.update(b"mcp-firewall credentials key id v1\0");
        h.update(key);
        Ok(Vault {
            key: LessSafeKey::new(unbound),
            id: {
                let d = h.finalize();
                [d[0], d[1], d[2], d[3], d[4], d[5], d[6], d[7]]
            },
            rng: SystemRandom::new(),
        })
    }

    /// `plain` sealed for the owner `parts`: version, key id, nonce,
    /// ciphertext and tag.
    pub(crate) fn seal(&self, parts: &[&str], plain: &[u8]) -> Result<Vec<u8>, VaultError> {
        let mut nonce = [0u8; NONCE_LEN];
        self.rng
            .fill(&mut nonce)
            .map_err(|_| VaultError::NoRandom)?;
        let mut out = Vec::with_capacity(1 + 8 + NONCE_LEN + plain.len() + 16);
        out.push(VERSION);
        out.extend_from_slice(&self.id);
        out.extend_from_slice(&nonce);
        let head = out.len();
        out.extend_from_slice(plain);
        let tag = self
            .key
            .seal_in_place_separate_tag(
                Nonce::assume_unique_for_key(nonce),
                Aad::from(aad(parts)),
                &mut out[head..],
            )
            .map_err(|_| VaultError::Corrupt)?;
        out.extend_from_slice(tag.as_ref());
        Ok(out)
    }

    /// What `sealed` holds, if it was sealed under this key for `parts`.
    pub(crate) fn open(&self, parts: &[&str], sealed: &[u8]) -> Result<Vec<u8>, VaultError> {
        let head = 1 + 8 + NONCE_LEN;
        if sealed.len() < head + 16 || sealed[0] != VERSION {
            return Err(VaultError::Corrupt);
        }
        if sealed[1..9] != self.id {
            return Err(VaultError::OtherKey(hex::encode(&sealed[1..9])));
        }
        let mut nonce = [0u8; NONCE_LEN];
        nonce.copy_from_slice(&sealed[9..head]);
        let mut body = sealed[head..].to_vec();
        let plain = self
            .key
            .open_in_place(
                Nonce::assume_unique_for_key(nonce),
                Aad::from(aad(parts)),
                &mut body,
            )
            .map_err(|_| VaultError::Corrupt)?
            .len();
        body.truncate(plain);
        Ok(body)
    }

    /// `n` random bytes, base64url (states, verifiers, link nonces).
    pub(crate) fn random(&self, n: usize) -> Result<String, VaultError> {
        use base64::Engine as _;
        let mut b = vec![0u8; n];
        self.rng.fill(&mut b).map_err(|_| VaultError::NoRandom)?;
        Ok(base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(b))
    }
}

/// The associated data: a domain, then each part length-prefixed.
fn aad(parts: &[&str]) -> Vec<u8> {
    let mut out = b"mcp-firewall user credential v1\0".to_vec();
    for p in parts {
        out.extend_from_slice(&(p.len() as u64).to_be_bytes());
        out.extend_from_slice(p.as_bytes());
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_sealed_token_opens_only_for_its_owner_under_its_key() {
        let v = Vault::new(&[7u8; 32]).unwrap();
        let owner = ["https://idp", "acme", "olga", "github"];
        let sealed = v.seal(&owner, b"gho_secret").unwrap();
        assert!(!sealed.windows(10).any(|w| w == b"gho_secret"));
        assert_eq!(v.open(&owner, &sealed).unwrap(), b"gho_secret");
        // Another owner's row, another key, an altered byte.
        let other = ["https://idp", "acme", "mallory", "github"];
        assert_eq!(v.open(&other, &sealed), Err(VaultError::Corrupt));
        let w = Vault::new(&[8u8; 32]).unwrap();
        assert!(matches!(
            w.open(&owner, &sealed),
            Err(VaultError::OtherKey(_))
        ));
        let mut bent = sealed.clone();
        let last = bent.len() - 1;
        bent[last] ^= 1;
        assert_eq!(v.open(&owner, &bent), Err(VaultError::Corrupt));
        assert_eq!(v.open(&owner, &sealed[..20]), Err(VaultError::Corrupt));
        // Two sealings of one token differ (fresh nonces).
        assert_ne!(sealed, v.seal(&owner, b"gho_secret").unwrap());
        // Part boundaries count: ("ab","c") is not ("a","bc").
        let s2 = v.seal(&["ab", "c"], b"x").unwrap();
        assert_eq!(v.open(&["a", "bc"], &s2), Err(VaultError::Corrupt));
    }
}
