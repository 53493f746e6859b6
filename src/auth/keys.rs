//! Verification key material: loading `[[auth.keys]]`, parsing JWKS documents
//! (RFC 7517/7518), and [`KeySet`], the immutable snapshot the verifier looks
//! keys up in.
//!
//! Invariants:
//! - every [`Key`] is pinned to exactly one [`Alg`] and its material was proven
//!   usable for that algorithm when loaded (EC points on the right curve, RSA
//!   moduli of at least [`MIN_RSA_BITS`], HS256 secrets of at least
//!   [`MIN_HS256_SECRET_BYTES`]), so a bad key fails at load, not per request;
//! - JWKS pinning: `alg` if present; else EC `crv` P-256 → ES256, P-384 →
//!   ES384; OKP Ed25519 → EdDSA; RSA → the source's configured `rsa_alg`
//!   (default RS256). Symmetric (`oct`) JWKs, keys not for signatures, and JWKs
//!   carrying private members are skipped, never trusted;
//! - a [`KeySet`] never changes after it is built; refresh builds a new one.

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::Arc;

use crate::digest::Sha256;
use jsonwebtoken::crypto::CryptoProvider;
use jsonwebtoken::{DecodingKey, DecodingKeyKind};
use serde::Deserialize;

use super::config::{Alg, KeyConfig};
use super::token::{shown, TokenError};

/// Smallest RSA modulus accepted, in bits (NIST SP 800-131A).
pub const MIN_RSA_BITS: usize = 2048;

/// Shortest HS256 secret accepted: RFC 7518 §3.2 requires at least the hash
/// size (256 bits).
pub const MIN_HS256_SECRET_BYTES: usize = 32;

/// Key material that could not be loaded.
#[derive(Debug, thiserror::Error)]
pub enum KeyError {
    /// A key, secret, JWKS or CA file could not be read.
    #[error("{key}: cannot read {}: {source}", path.display())]
    Read {
        /// Dotted config key.
        key: String,
        /// The file.
        path: PathBuf,
        /// The I/O error.
        source: std::io::Error,
    },
    /// `secret_env` names a variable that is unset or not UTF-8.
    #[error("{key}: environment variable {var} is not set")]
    SecretEnvMissing {
        /// Dotted config key.
        key: String,
        /// The variable name.
        var: String,
    },
    /// An HS256 secret shorter than [`MIN_HS256_SECRET_BYTES`].
    #[error("{key}: HS256 secret is {len} bytes; at least {min} are required")]
    SecretTooShort {
        /// Dotted config key.
        key: String,
        /// Its length.
        len: usize,
        /// The minimum.
        min: usize,
    },
    /// A PEM that does not hold a public key usable for the pinned algorithm.
    #[error("{key}: not a {alg} public key in PEM form ({problem})")]
    BadPem {
        /// Dotted config key.
        key: String,
        /// The pinned algorithm.
        alg: Alg,
        /// Why it was not usable.
        problem: JwkProblem,
    },
    /// A JWKS document that is not a JSON object with a `keys` array.
    #[error("{key}: not a JWKS document (a JSON object with a keys array)")]
    NotJwks {
        /// Dotted config key.
        key: String,
    },
    /// A JWKS from the config (inline or file) with an unusable key: at start
    /// every configured key must be usable.
    #[error("{key}: keys[{index}] (kid {kid}): {problem}")]
    BadJwk {
        /// Dotted config key.
        key: String,
        /// Position in `keys`.
        index: usize,
        /// Its `kid`, or `-`.
        kid: String,
        /// What is wrong.
        problem: JwkProblem,
    },
    /// The configuration itself is invalid.
    #[error(transparent)]
    Config(#[from] super::config::ConfigError),
    /// The build has no `jsonwebtoken` crypto provider.
    #[error("no jsonwebtoken crypto provider is available")]
    NoCryptoProvider,
}

/// Why a JWK (or PEM key) is not used.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum JwkProblem {
    /// Not a JSON object of the JWK shape.
    #[error("not a JWK object")]
    NotAnObject,
    /// `kty` other than RSA, EC, OKP.
    #[error("kty {0} is not supported")]
    UnsupportedKty(String),
    /// A symmetric (`oct`) key: never trusted from a JWKS.
    #[error("symmetric (oct) keys are not accepted from a JWKS")]
    Symmetric,
    /// `use` other than `sig`, or `key_ops` without `verify`.
    #[error("not a signature verification key")]
    NotForSignatures,
    /// Private key members (`d`, ...) present.
    #[error("carries private key material")]
    PrivateMaterial,
    /// `alg` that is unsupported or does not fit `kty`/`crv`.
    #[error("alg {alg} does not fit kty {kty}")]
    AlgMismatch {
        /// The `alg` member.
        alg: String,
        /// The `kty` member.
        kty: String,
    },
    /// `crv` other than P-256, P-384, Ed25519.
    #[error("crv {0} is not supported")]
    UnsupportedCurve(String),
    /// A required member is absent.
    #[error("member {0} is missing")]
    Missing(&'static str),
    /// The material does not decode into a valid key for the algorithm.
    #[error("key material is invalid for {0}")]
    InvalidMaterial(Alg),
    /// An RSA modulus below [`MIN_RSA_BITS`].
    #[error("RSA modulus has {bits} bits; at least {min} are required", min = MIN_RSA_BITS)]
    RsaTooSmall {
        /// The modulus size.
        bits: usize,
    },
}

/// A verification key pinned to one algorithm.
pub struct Key {
    /// The key id tokens name it by.
    pub kid: Option<Box<str>>,
    /// The only algorithm it verifies.
    pub alg: Alg,
    /// The material, in `jsonwebtoken`'s form (parsed from PEM or JWK).
    pub decoding: DecodingKey,
    /// The signature check, prepared once when the key is loaded.
    check: SignatureCheck,
}

/// How a key checks a signature: `ring`'s constant-time primitives (the same
/// library rustls uses here), prepared once per key instead of per token.
/// Verifying an ES256 token this way costs a fraction of what the pure-Rust
/// backend of `jsonwebtoken` costs, and a first verification is paid on
/// every new run.
enum SignatureCheck {
    /// HS256: the HMAC key schedule, computed once.
    Hmac(ring::hmac::Key),
    /// ECDSA (fixed-size `r || s` as JWS uses), Ed25519, or RSA from a DER
    /// `RSAPublicKey`.
    Public(ring::signature::UnparsedPublicKey<Vec<u8>>),
    /// RSA from JWK components.
    RsaComponents {
        n: Vec<u8>,
        e: Vec<u8>,
        params: &'static ring::signature::RsaParameters,
    },
}

impl SignatureCheck {
    fn new(alg: Alg, key: &DecodingKey) -> SignatureCheck {
        use ring::signature;
        let rsa: &'static signature::RsaParameters = match alg {
            Alg::PS256 => &signature::RSA_PSS_2048_8192_SHA256,
            _ => &signature::RSA_PKCS1_2048_8192_SHA256,
        };
        match key.kind() {
            DecodingKeyKind::RsaModulusExponent { n, e } => SignatureCheck::RsaComponents {
                n: n.clone(),
                e: e.clone(),
                params: rsa,
            },
            DecodingKeyKind::SecretOrDer(bytes) => {
                let public: &'static dyn signature::VerificationAlgorithm = match alg {
                    Alg::HS256 => {
                        return SignatureCheck::Hmac(ring::hmac::Key::new(
                            ring::hmac::HMAC_SHA256,
                            bytes,
                        ))
                    }
                    Alg::ES256 => &signature::ECDSA_P256_SHA256_FIXED,
                    Alg::ES384 => &signature::ECDSA_P384_SHA384_FIXED,
                    Alg::EdDSA => &signature::ED25519,
                    Alg::RS256 | Alg::PS256 => rsa,
                };
                SignatureCheck::Public(signature::UnparsedPublicKey::new(public, bytes.clone()))
            }
        }
    }

    fn verify(&self, signing_input: &[u8], signature: &[u8]) -> bool {
        match self {
            SignatureCheck::Hmac(key) => ring::hmac::verify(key, signing_input, signature).is_ok(),
            SignatureCheck::Public(key) => key.verify(signing_input, signature).is_ok(),
            SignatureCheck::RsaComponents { n, e, params } => {
                ring::signature::RsaPublicKeyComponents { n, e }
                    .verify(params, signing_input, signature)
                    .is_ok()
            }
        }
    }
}

impl std::fmt::Debug for Key {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // The material may be an HS256 secret: never print it.
        f.debug_struct("Key")
            .field("kid", &self.kid)
            .field("alg", &self.alg)
            .finish_non_exhaustive()
    }
}

impl Key {
    /// Checks `decoding` is usable for `alg` and wraps it.
    pub fn new(kid: Option<&str>, alg: Alg, decoding: DecodingKey) -> Result<Key, JwkProblem> {
        check_material(alg, &decoding)?;
        Ok(Key {
            kid: kid.map(Into::into),
            alg,
            check: SignatureCheck::new(alg, &decoding),
            decoding,
        })
    }

    /// Whether `signature` (already base64url-decoded) is this key's
    /// signature of `signing_input` (`header.payload`).
    pub fn verifies(&self, signing_input: &[u8], signature: &[u8]) -> bool {
        self.check.verify(signing_input, signature)
    }

    fn fingerprint_into(&self, hasher: &mut Sha256) {
        hasher.update(self.kid.as_deref().unwrap_or("").as_bytes());
        hasher.update([0, self.alg as u8]);
        match self.decoding.kind() {
            DecodingKeyKind::SecretOrDer(bytes) => hasher.update(bytes),
            DecodingKeyKind::RsaModulusExponent { n, e } => {
                hasher.update(n);
                hasher.update([0]);
                hasher.update(e);
            }
        }
        hasher.update([0xff]);
    }
}

/// Proves the material works for `alg` by building the verifier the request
/// path will build (which parses and validates EC/Ed points) and checking RSA
/// modulus size.
fn check_material(alg: Alg, key: &DecodingKey) -> Result<(), JwkProblem> {
    let provider = CryptoProvider::try_get_default().ok_or(JwkProblem::InvalidMaterial(alg))?;
    (provider.verifier_factory)(&alg.jwt(), key).map_err(|_| JwkProblem::InvalidMaterial(alg))?;
    if matches!(alg, Alg::RS256 | Alg::PS256) {
        let modulus = match key.kind() {
            DecodingKeyKind::RsaModulusExponent { n, .. } => n.clone(),
            DecodingKeyKind::SecretOrDer(der) => {
                (provider.key_utils.rsa_pub_components_from_public_key)(der)
                    .map_err(|_| JwkProblem::InvalidMaterial(alg))?
                    .0
            }
        };
        let bits = modulus_bits(&modulus);
        if bits < MIN_RSA_BITS {
            return Err(JwkProblem::RsaTooSmall { bits });
        }
    }
    Ok(())
}

fn modulus_bits(n: &[u8]) -> usize {
    let n = match n.iter().position(|b| *b != 0) {
        Some(first) => &n[first..],
        None => return 0,
    };
    n.len() * 8 - n[0].leading_zeros() as usize
}

/// Reads the HS256 secret of a `[[auth.keys]]` entry (shared with minting).
pub(crate) fn load_secret(cfg: &KeyConfig, index: usize) -> Result<Vec<u8>, KeyError> {
    let key = format!("auth.keys[{index}]");
    let secret = if let Some(inline) = &cfg.secret {
        inline.expose().as_bytes().to_vec()
    } else if let Some(var) = &cfg.secret_env {
        std::env::var(var)
            .map_err(|_| KeyError::SecretEnvMissing {
                key: format!("{key}.secret_env"),
                var: var.clone(),
            })?
            .into_bytes()
    } else if let Some(path) = &cfg.secret_file {
        let mut bytes = std::fs::read(path).map_err(|source| KeyError::Read {
            key: format!("{key}.secret_file"),
            path: path.clone(),
            source,
        })?;
        // Files written by editors and `echo` end in a newline that is not
        // part of the secret.
        while bytes.last().is_some_and(|b| *b == b'\n' || *b == b'\r') {
            bytes.pop();
        }
        bytes
    } else {
        Vec::new()
    };
    if secret.len() < MIN_HS256_SECRET_BYTES {
        return Err(KeyError::SecretTooShort {
            key,
            len: secret.len(),
            min: MIN_HS256_SECRET_BYTES,
        });
    }
    Ok(secret)
}

/// Loads one `[[auth.keys]]` entry; `validate` has already run.
pub(crate) fn load_config_key(cfg: &KeyConfig, index: usize) -> Result<Key, KeyError> {
    let alg = cfg.parsed_alg(index)?;
    let kid = cfg.kid.as_deref();
    if alg == Alg::HS256 {
        let secret = load_secret(cfg, index)?;
        let decoding = DecodingKey::from_secret(&secret).map_err(|_| KeyError::SecretTooShort {
            key: format!("auth.keys[{index}]"),
            len: 0,
            min: MIN_HS256_SECRET_BYTES,
        })?;
        return Key::new(kid, alg, decoding).map_err(|problem| KeyError::BadPem {
            key: format!("auth.keys[{index}]"),
            alg,
            problem,
        });
    }
    let key = format!("auth.keys[{index}].pem_file");
    let Some(path) = &cfg.pem_file else {
        return Err(KeyError::BadPem {
            key,
            alg,
            problem: JwkProblem::Missing("pem_file"),
        });
    };
    let pem = std::fs::read(path).map_err(|source| KeyError::Read {
        key: key.clone(),
        path: path.clone(),
        source,
    })?;
    let bad = |problem| KeyError::BadPem {
        key: key.clone(),
        alg,
        problem,
    };
    let decoding = match alg {
        Alg::RS256 | Alg::PS256 => DecodingKey::from_rsa_pem(&pem),
        Alg::ES256 | Alg::ES384 => DecodingKey::from_ec_pem(&pem),
        Alg::EdDSA => DecodingKey::from_ed_pem(&pem),
        Alg::HS256 => return Err(bad(JwkProblem::InvalidMaterial(alg))),
    }
    .map_err(|_| bad(JwkProblem::InvalidMaterial(alg)))?;
    Key::new(kid, alg, decoding).map_err(bad)
}

/// A JWK that was not used, and why (logged by the caller).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Skipped {
    /// Position in `keys`.
    pub index: usize,
    /// Its `kid`, sanitized, or `-`.
    pub kid: String,
    /// Why.
    pub problem: JwkProblem,
}

/// The outcome of parsing a JWKS document.
#[derive(Debug)]
pub struct ParsedJwks {
    /// The usable keys, in document order.
    pub keys: Vec<Arc<Key>>,
    /// The keys left out.
    pub skipped: Vec<Skipped>,
}

#[derive(Deserialize)]
struct RawJwks {
    keys: Vec<serde_json::Value>,
}

#[derive(Deserialize)]
struct RawJwk {
    kty: String,
    #[serde(default)]
    kid: Option<String>,
    #[serde(default)]
    alg: Option<String>,
    #[serde(default, rename = "use")]
    usage: Option<String>,
    #[serde(default)]
    key_ops: Option<Vec<String>>,
    #[serde(default)]
    crv: Option<String>,
    #[serde(default)]
    x: Option<String>,
    #[serde(default)]
    y: Option<String>,
    #[serde(default)]
    n: Option<String>,
    #[serde(default)]
    e: Option<String>,
    // Private members; only their presence matters.
    #[serde(default)]
    d: Option<serde::de::IgnoredAny>,
    #[serde(default)]
    p: Option<serde::de::IgnoredAny>,
    #[serde(default)]
    k: Option<serde::de::IgnoredAny>,
}

/// Parses a JWKS document. `rsa_alg` pins RSA keys that have no `alg`. The
/// document must be a JSON object with a `keys` array; individual unusable keys
/// are returned in [`ParsedJwks::skipped`] rather than failing the whole set,
/// because one exotic key published by an IdP must not take the others down.
pub fn parse_jwks(doc: &[u8], rsa_alg: Alg, key: &str) -> Result<ParsedJwks, KeyError> {
    let not_jwks = || KeyError::NotJwks {
        key: key.to_owned(),
    };
    // A JSON object only: serde would also read a struct from an array
    // (`[[…]]` as `{"keys": […]}`), found by the `token_verify` fuzz target.
    let first = doc
        .iter()
        .find(|b| !matches!(b, b' ' | b'\t' | b'\n' | b'\r'));
    if first != Some(&b'{') {
        return Err(not_jwks());
    }
    // One verdict with any JSON reader (UTF-8, numbers it holds).
    let raw: RawJwks = crate::http_util::read_json(doc).map_err(|_| not_jwks())?;
    let mut parsed = ParsedJwks {
        keys: Vec::with_capacity(raw.keys.len()),
        skipped: Vec::new(),
    };
    for (index, value) in raw.keys.into_iter().enumerate() {
        let kid_of = |v: &serde_json::Value| {
            v.get("kid")
                .and_then(|k| k.as_str())
                .map_or_else(|| "-".to_owned(), shown)
        };
        let kid = kid_of(&value);
        match serde_json::from_value::<RawJwk>(value) {
            Ok(jwk) => match jwk_to_key(&jwk, rsa_alg) {
                Ok(k) => parsed.keys.push(Arc::new(k)),
                Err(problem) => parsed.skipped.push(Skipped {
                    index,
                    kid,
                    problem,
                }),
            },
            Err(_) => parsed.skipped.push(Skipped {
                index,
                kid,
                problem: JwkProblem::NotAnObject,
            }),
        }
    }
    Ok(parsed)
}

fn jwk_to_key(jwk: &RawJwk, rsa_alg: Alg) -> Result<Key, JwkProblem> {
    if jwk.kty == "oct" {
        return Err(JwkProblem::Symmetric);
    }
    if jwk.d.is_some() || jwk.p.is_some() || jwk.k.is_some() {
        return Err(JwkProblem::PrivateMaterial);
    }
    if jwk.usage.as_deref().is_some_and(|u| u != "sig")
        || jwk
            .key_ops
            .as_ref()
            .is_some_and(|ops| !ops.iter().any(|op| op == "verify"))
    {
        return Err(JwkProblem::NotForSignatures);
    }
    let mismatch = || JwkProblem::AlgMismatch {
        alg: jwk.alg.as_deref().map_or_else(|| "-".to_owned(), shown),
        kty: shown(&jwk.kty),
    };
    let member =
        |value: &Option<String>, name: &'static str| value.clone().ok_or(JwkProblem::Missing(name));
    let (alg, decoding) = match jwk.kty.as_str() {
        "RSA" => {
            let alg = match jwk.alg.as_deref() {
                None => rsa_alg,
                Some("RS256") => Alg::RS256,
                Some("PS256") => Alg::PS256,
                Some(_) => return Err(mismatch()),
            };
            let (n, e) = (member(&jwk.n, "n")?, member(&jwk.e, "e")?);
            (
                alg,
                DecodingKey::from_rsa_components(&n, &e)
                    .map_err(|_| JwkProblem::InvalidMaterial(alg))?,
            )
        }
        "EC" => {
            let crv = jwk.crv.as_deref().ok_or(JwkProblem::Missing("crv"))?;
            let alg = match crv {
                "P-256" => Alg::ES256,
                "P-384" => Alg::ES384,
                other => return Err(JwkProblem::UnsupportedCurve(shown(other))),
            };
            if jwk.alg.as_deref().is_some_and(|a| a != alg.name()) {
                return Err(mismatch());
            }
            let (x, y) = (member(&jwk.x, "x")?, member(&jwk.y, "y")?);
            (
                alg,
                DecodingKey::from_ec_components(&x, &y)
                    .map_err(|_| JwkProblem::InvalidMaterial(alg))?,
            )
        }
        "OKP" => {
            let crv = jwk.crv.as_deref().ok_or(JwkProblem::Missing("crv"))?;
            if crv != "Ed25519" {
                return Err(JwkProblem::UnsupportedCurve(shown(crv)));
            }
            // RFC 9864 names the fully-specified algorithm `Ed25519`; tokens
            // still say `EdDSA`.
            if jwk
                .alg
                .as_deref()
                .is_some_and(|a| a != "EdDSA" && a != "Ed25519")
            {
                return Err(mismatch());
            }
            let x = member(&jwk.x, "x")?;
            (
                Alg::EdDSA,
                DecodingKey::from_ed_components(&x)
                    .map_err(|_| JwkProblem::InvalidMaterial(Alg::EdDSA))?,
            )
        }
        other => return Err(JwkProblem::UnsupportedKty(shown(other))),
    };
    Key::new(jwk.kid.as_deref(), alg, decoding)
}

/// An immutable set of keys indexed by `kid` and by algorithm.
#[derive(Debug, Default)]
pub(super) struct KeySet {
    keys: Vec<Arc<Key>>,
    by_kid: HashMap<Box<str>, Vec<usize>>,
    by_alg: [Vec<usize>; 6],
    fingerprint: [u8; 32],
}

impl KeySet {
    /// Indexes `keys`.
    pub(super) fn new(keys: Vec<Arc<Key>>) -> KeySet {
        let mut by_kid: HashMap<Box<str>, Vec<usize>> = HashMap::new();
        let mut by_alg: [Vec<usize>; 6] = Default::default();
        let mut hasher = Sha256::new();
        for (i, key) in keys.iter().enumerate() {
            if let Some(kid) = &key.kid {
                by_kid.entry(kid.clone()).or_default().push(i);
            }
            by_alg[key.alg.index()].push(i);
            key.fingerprint_into(&mut hasher);
        }
        KeySet {
            keys,
            by_kid,
            by_alg,
            fingerprint: hasher.finalize(),
        }
    }

    /// A digest of every key's id, algorithm and material: equal fingerprints
    /// mean the same keys (so a refresh that changed nothing keeps the cache).
    pub(super) fn fingerprint(&self) -> [u8; 32] {
        self.fingerprint
    }

    /// How many keys.
    pub(super) fn len(&self) -> usize {
        self.keys.len()
    }

    /// The keys a token with this header may be verified with: by `kid` when it
    /// names one (and then the key's pinned algorithm must be `alg`), else every
    /// key pinned to `alg`. Allocation-free.
    pub(super) fn candidates(
        &self,
        kid: Option<&str>,
        alg: Alg,
    ) -> Result<Candidates<'_>, TokenError> {
        let indices: &[usize] = match kid {
            Some(kid) => {
                let Some(indices) = self.by_kid.get(kid) else {
                    return Err(TokenError::UnknownKid { kid: shown(kid) });
                };
                if let Some(first) = indices
                    .first()
                    .filter(|_| !indices.iter().any(|i| self.keys[*i].alg == alg))
                {
                    return Err(TokenError::AlgMismatch {
                        kid: shown(kid),
                        token_alg: alg,
                        key_alg: self.keys[*first].alg,
                    });
                }
                indices
            }
            None => {
                let indices = &self.by_alg[alg.index()];
                if indices.is_empty() {
                    return Err(TokenError::NoKeyForAlg { alg });
                }
                indices
            }
        };
        Ok(Candidates {
            set: self,
            indices: indices.iter(),
            alg,
        })
    }
}

/// Iterator over the keys that may verify one token.
pub(super) struct Candidates<'a> {
    set: &'a KeySet,
    indices: std::slice::Iter<'a, usize>,
    alg: Alg,
}

impl<'a> Iterator for Candidates<'a> {
    type Item = &'a Key;

    fn next(&mut self) -> Option<&'a Key> {
        self.indices
            .by_ref()
            .map(|i| &*self.set.keys[*i])
            .find(|key| key.alg == self.alg)
    }
}

#[cfg(test)]
#[path = "keys_tests.rs"]
mod tests;
