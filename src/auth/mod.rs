//! Tool-token verification: what the proxy calls to turn the JWT on a request
//! into trusted [`Claims`], or into a precise refusal.
//!
//! A tool token is minted for one run of one agent and restricted to the
//! firewall's audience; a leaked one must be able to do nothing but call that
//! run's allowed tools until it expires. Hence the invariants kept here:
//! - every key is pinned to exactly one algorithm, and the token's `alg` must
//!   equal it (no algorithm confusion, `none` never);
//! - the MCP and admin audiences are separate worlds: a token naming both is
//!   refused, a token for one is refused by the other;
//! - lifetimes are bounded (`exp - iat <= max_lifetime_s`) and `exp`, `iat`,
//!   `nbf` are checked with a fixed leeway;
//! - a cached verification is never returned for a token that would now fail
//!   (expiry re-checked on every hit; key-set changes invalidate);
//! - the request path never waits on a slow key server for longer than
//!   [`UNKNOWN_KID_WAIT`].
//!
//! Layout: [`config`] (the `[auth]` section), [`token`] (finding the token on a
//! request and its error type), `keys` (key material and JWKS parsing), `jwks`
//! (background refresh), [`verify`] (the checks), `cache` (verified tokens),
//! [`mod@mint`] (developer minting and inspection).

mod cache;
pub(crate) mod config;
mod jwks;
mod keys;
pub(crate) mod mint;
mod shared;
#[cfg(test)]
mod testkit;
pub(crate) mod token;
pub(crate) mod verify;
pub(crate) use config::is_loopback;
pub use config::{Alg, AuthConfig, ConfigError, JwksSourceConfig, KeyConfig, SecretString};
pub use jwks::JwksError;
pub use jwks::{FETCH_TIMEOUT, MAX_JWKS_BYTES, UNKNOWN_KID_WAIT};
pub use keys::{
    parse_jwks, JwkProblem, KeyError, ParsedJwks, MIN_HS256_SECRET_BYTES, MIN_RSA_BITS,
};
pub use mint::{inspect, mint, mint_with, Inspection, MintClaims, MintError, SigningKey};
pub use token::{extract, ClaimProblem, Malformed, TokenError};
pub use verify::{Verifier, VerifierError};
mod claims;
pub use self::claims::*;
