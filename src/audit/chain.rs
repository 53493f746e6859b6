//! The audit trail's hash chain and its signed checkpoints: what makes a
//! deleted, altered or forged row visible.
//!
//! Every writer (a replica, by its `writer_id`) numbers its rows 1, 2, 3…
//! and links each to the one before. An entry carries the row's content
//! hash, `row_hash = SHA-256(domain, row)` over the row's one canonical
//! encoding (the ClickHouse `RowBinary` bytes [`super::record`] writes
//! once, which the verifier reads back byte for byte), and its **link**,
//! `link = SHA-256(domain, writer_id, seq, linked_from, prev_link,
//! row_hash)`. A link is checked without its row, so an intent that a
//! merge folded into its completion is still a checked link of the chain;
//! changing any `row_hash` changes every link up to the next signed
//! checkpoint. `linked_from`, the first `seq` its writer linked this way,
//! is inside every link: moving it (to pass links off as the older kind)
//! changes them all. Every so often the writer signs `(writer_id, seq,
//! link, time)` with Ed25519: a checkpoint (a clean stop's last one is
//! signed as *final*). Deleting a row leaves a gap in `seq`; altering one
//! breaks its content hash, or, re-hashed, every link after it; forging one
//! needs a `seq` and link the chain does not have; cutting the tail is
//! caught by the last checkpoint.
//!
//! Entries written by releases before links (`link` empty, "legacy")
//! verify as they were made: their `row_hash` is `SHA-256(domain,
//! writer_id, seq, prev_hash, row)` and is their link.
//!
//! Invariants: the hash input is unambiguous (every variable-length part
//! carries its length, and a domain string separates each kind of hash); a
//! chain resumed from its last `(seq, link)` continues exactly as if it had
//! not stopped; the verifier streams (state per writer is one `seq` and one
//! hash) so any number of rows fits.

use std::fmt::Write as _;

use crate::digest::Sha256;
use ring::signature::{Ed25519KeyPair, KeyPair, UnparsedPublicKey, ED25519};

use super::record::{leb128, put_str};

/// A SHA-256 digest.
pub type Hash = [u8; 32];

/// The `prev_hash` of a writer's first row.
pub const GENESIS: Hash = [0; 32];

const ROW_DOMAIN: &[u8] = b"mcp-firewall audit row v1\0";
const CONTENT_DOMAIN: &[u8] = b"mcp-firewall audit row content v2\0";
const LINK_DOMAIN: &[u8] = b"mcp-firewall audit link v2\0";
const CHECKPOINT_DOMAIN: &[u8] = b"mcp-firewall audit checkpoint v1\0";
/// A writer's last checkpoint before a clean stop: whatever follows it
/// that no later checkpoint signs was not written by that writer.
const FINAL_CHECKPOINT_DOMAIN: &[u8] = b"mcp-firewall audit final checkpoint v1\0";

/// A row's place in its writer's chain.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Link {
    /// 1, 2, 3… per writer.
    pub seq: u64,
    /// The link of the entry before (the writer's first: [`GENESIS`]).
    pub prev_hash: Hash,
    /// The row's content hash (legacy entries: their link).
    pub row_hash: Hash,
    /// This entry's link (legacy entries: their `row_hash`).
    pub link: Hash,
    /// Made by a release before links: `row_hash` covers the row, writer,
    /// `seq` and `prev_hash`, and is the link.
    pub legacy: bool,
}

/// The legacy hash of row `seq` of `writer_id` after `prev`, over its
/// canonical encoding `row` (entries of releases before links).
pub fn row_hash(writer_id: &str, seq: u64, prev: &Hash, row: &[u8]) -> Hash {
    let row = super::record::hashed_part(row);
    let mut h = Sha256::new();
    h.update(ROW_DOMAIN);
    h.update((writer_id.len() as u64).to_be_bytes());
    h.update(writer_id.as_bytes());
    h.update(seq.to_be_bytes());
    h.update(prev);
    h.update((row.len() as u64).to_be_bytes());
    h.update(row);
    h.finalize()
}

/// The content hash of a row (its canonical encoding `row`).
pub fn content_hash(row: &[u8]) -> Hash {
    let row = super::record::hashed_part(row);
    let mut h = Sha256::new();
    h.update(CONTENT_DOMAIN);
    h.update((row.len() as u64).to_be_bytes());
    h.update(row);
    h.finalize()
}

/// The link of entry `seq` of `writer_id` (whose links begin at
/// `linked_from`) after the link `prev`, over the content hash `row_hash`.
pub fn link_hash(
    writer_id: &str,
    seq: u64,
    linked_from: u64,
    prev: &Hash,
    row_hash: &Hash,
) -> Hash {
    let mut h = Sha256::new();
    h.update(LINK_DOMAIN);
    h.update((writer_id.len() as u64).to_be_bytes());
    h.update(writer_id.as_bytes());
    h.update(seq.to_be_bytes());
    h.update(linked_from.to_be_bytes());
    h.update(prev);
    h.update(row_hash);
    h.finalize()
}

impl Link {
    /// Whether this entry's own hashes agree (its link is the link of its
    /// fields, in a chain whose links begin at `linked_from`).
    pub fn holds(&self, writer_id: &str, linked_from: u64) -> bool {
        self.legacy
            || self.link
                == link_hash(
                    writer_id,
                    self.seq,
                    linked_from,
                    &self.prev_hash,
                    &self.row_hash,
                )
    }

    /// Whether `row` is the row this entry was made of.
    pub fn covers(&self, writer_id: &str, row: &[u8]) -> bool {
        if self.legacy {
            row_hash(writer_id, self.seq, &self.prev_hash, row) == self.row_hash
        } else {
            content_hash(row) == self.row_hash
        }
    }
}

/// One writer's chain: the next row's link.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Chain {
    writer_id: String,
    seq: u64,
    last: Hash,
    linked_from: u64,
}

impl Chain {
    /// A new writer's chain (its first row gets `seq` 1).
    pub fn new(writer_id: &str) -> Chain {
        Chain::resume(writer_id, 0, GENESIS, 1)
    }

    /// A chain that continues after entry `seq` whose link was `last`,
    /// linked from `linked_from` (the first `seq` with a link; after a
    /// legacy chain, `seq + 1`).
    pub fn resume(writer_id: &str, seq: u64, last: Hash, linked_from: u64) -> Chain {
        Chain {
            writer_id: writer_id.to_owned(),
            seq,
            last,
            linked_from: linked_from.clamp(1, seq + 1),
        }
    }

    /// Links the next row.
    pub fn link(&mut self, row: &[u8]) -> Link {
        let seq = self.seq + 1;
        let prev_hash = self.last;
        let row_hash = content_hash(row);
        let link = link_hash(
            &self.writer_id,
            seq,
            self.linked_from,
            &prev_hash,
            &row_hash,
        );
        self.seq = seq;
        self.last = link;
        Link {
            seq,
            prev_hash,
            row_hash,
            link,
            legacy: false,
        }
    }

    /// The last entry's `seq` and link (0 and [`GENESIS`] before any).
    pub fn head(&self) -> (u64, Hash) {
        (self.seq, self.last)
    }

    /// The first `seq` linked.
    pub fn linked_from(&self) -> u64 {
        self.linked_from
    }

    /// The writer.
    pub fn writer_id(&self) -> &str {
        &self.writer_id
    }
}

/// What a checkpoint vouches for: the writer's chain up to `seq`, ending
/// in `row_hash`, at `time_ms`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Checkpoint {
    /// The writer.
    pub writer_id: String,
    /// Its last row.
    pub seq: u64,
    /// That row's hash.
    pub row_hash: Hash,
    /// When it was signed, ms since the Unix epoch.
    pub time_ms: u64,
}

impl Checkpoint {
    /// The signed bytes.
    pub fn message(&self) -> Vec<u8> {
        self.message_in(CHECKPOINT_DOMAIN)
    }

    /// The signed bytes of a final checkpoint (a clean stop's).
    pub fn final_message(&self) -> Vec<u8> {
        self.message_in(FINAL_CHECKPOINT_DOMAIN)
    }

    fn message_in(&self, domain: &[u8]) -> Vec<u8> {
        let mut m = Vec::with_capacity(domain.len() + self.writer_id.len() + 56);
        m.extend_from_slice(domain);
        m.extend_from_slice(&(self.writer_id.len() as u64).to_be_bytes());
        m.extend_from_slice(self.writer_id.as_bytes());
        m.extend_from_slice(&self.seq.to_be_bytes());
        m.extend_from_slice(&self.row_hash);
        m.extend_from_slice(&self.time_ms.to_be_bytes());
        m
    }

    /// Whether `signature` is `public_key`'s over this checkpoint.
    pub fn verify(&self, public_key: &[u8], signature: &[u8]) -> bool {
        self.verify_kind(public_key, signature) == Some(false)
    }

    /// `Some(final)` when `signature` is `public_key`'s over this
    /// checkpoint, as a final one or not.
    pub fn verify_kind(&self, public_key: &[u8], signature: &[u8]) -> Option<bool> {
        let key = UnparsedPublicKey::new(&ED25519, public_key);
        if key.verify(&self.message(), signature).is_ok() {
            Some(false)
        } else if key.verify(&self.final_message(), signature).is_ok() {
            Some(true)
        } else {
            None
        }
    }
}

/// Why a signing key cannot be used.
#[derive(Debug, thiserror::Error)]
pub enum KeyError {
    /// Not a PEM `PRIVATE KEY` block.
    #[error("not a PEM PRIVATE KEY block (write one with `mcp-firewall audit keygen --out FILE`)")]
    NotPem,
    /// Not an Ed25519 PKCS#8 key.
    #[error("not an Ed25519 PKCS#8 key: {0}")]
    Rejected(String),
    /// The system's random source failed.
    #[error("the system's random source failed")]
    Random,
}

/// An Ed25519 signing key (PKCS#8, PEM).
pub struct Signer {
    key: Ed25519KeyPair,
}

impl std::fmt::Debug for Signer {
    /// The public key only: the private key never reaches a log.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Signer")
            .field("public_key", &self.public_key_text())
            .finish_non_exhaustive()
    }
}

const PEM_BEGIN: &str = "-----BEGIN PRIVATE KEY-----";
const PEM_END: &str = "-----END PRIVATE KEY-----";

impl Signer {
    /// A new key, as the PEM text to store.
    pub fn generate_pem() -> Result<String, KeyError> {
        use base64::Engine as _;
        let rng = ring::rand::SystemRandom::new();
        let der = Ed25519KeyPair::generate_pkcs8(&rng).map_err(|_| KeyError::Random)?;
        let b64 = base64::engine::general_purpose::STANDARD.encode(der.as_ref());
        let mut pem = String::with_capacity(b64.len() + 64);
        let _ = writeln!(pem, "{PEM_BEGIN}");
        for chunk in b64.as_bytes().chunks(64) {
            let _ = writeln!(pem, "{}", String::from_utf8_lossy(chunk));
        }
        let _ = writeln!(pem, "{PEM_END}");
        Ok(pem)
    }

    /// The key of a PEM text.
    pub fn from_pem(pem: &str) -> Result<Signer, KeyError> {
        use base64::Engine as _;
        let body = pem
            .split_once(PEM_BEGIN)
            .and_then(|(_, rest)| rest.split_once(PEM_END))
            .map(|(b, _)| b)
            .ok_or(KeyError::NotPem)?;
        let b64: String = body.chars().filter(|c| !c.is_whitespace()).collect();
        let der = base64::engine::general_purpose::STANDARD
            .decode(b64)
            .map_err(|_| KeyError::NotPem)?;
        let key = Ed25519KeyPair::from_pkcs8_maybe_unchecked(&der)
            .map_err(|e| KeyError::Rejected(e.to_string()))?;
        Ok(Signer { key })
    }

    /// Signs a checkpoint.
    pub fn sign(&self, checkpoint: &Checkpoint) -> [u8; 64] {
        self.sign_bytes(&checkpoint.message())
    }

    /// Signs a final checkpoint (a clean stop's).
    pub fn sign_final(&self, checkpoint: &Checkpoint) -> [u8; 64] {
        self.sign_bytes(&checkpoint.final_message())
    }

    fn sign_bytes(&self, message: &[u8]) -> [u8; 64] {
        let mut out = [0u8; 64];
        out.copy_from_slice(self.key.sign(message).as_ref());
        out
    }

    /// The public key (32 bytes).
    pub fn public_key(&self) -> &[u8] {
        self.key.public_key().as_ref()
    }

    /// The public key as an auditor publishes it: `ed25519:<base64>`.
    pub fn public_key_text(&self) -> String {
        use base64::Engine as _;
        format!(
            "ed25519:{}",
            base64::engine::general_purpose::STANDARD.encode(self.public_key())
        )
    }
}

/// Columns of the chain table (`<table>_chain`, a plain `MergeTree`: an
/// entry is never collapsed, so a merge of the audit table cannot look like
/// a deletion and a second entry under a used `seq` stays visible), in
/// [`encode_entry`]'s `RowBinary` order.
pub const CHAIN_COLUMNS: &[&str] = &[
    "writer_id",
    "seq",
    "event_id",
    "row_version",
    "time_ms",
    "prev_hash",
    "row_hash",
    "chained",
    "link",
];

/// Appends the chain entry of `row` (its `RowBinary` bytes, whose first 16
/// bytes are its `event_id` and bytes 20..28 its `time_ms`) linked as
/// `link`, chained at `chained_s` (Unix seconds).
pub fn encode_entry(
    writer_id: &str,
    link: &Link,
    row: &[u8],
    row_version: u8,
    chained_s: u32,
    out: &mut Vec<u8>,
) {
    put_str(out, writer_id);
    out.extend_from_slice(&link.seq.to_le_bytes());
    out.extend_from_slice(row.get(..16).unwrap_or(&[0; 16]));
    out.push(row_version);
    out.extend_from_slice(row.get(20..28).unwrap_or(&[0; 8]));
    out.extend_from_slice(&link.prev_hash);
    out.extend_from_slice(&link.row_hash);
    out.extend_from_slice(&chained_s.to_le_bytes());
    out.extend_from_slice(if link.legacy { &GENESIS } else { &link.link });
}

/// A chain entry read back (`SELECT` [`CHAIN_COLUMNS`] `FORMAT RowBinary`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Entry {
    /// The writer.
    pub writer_id: String,
    /// The row's link.
    pub link: Link,
    /// The row's `event_id`, as ClickHouse stores a UUID (two little-endian
    /// halves, high first: the row's first 16 bytes).
    pub event_id: [u8; 16],
    /// The row's `row_version` (0: an intent, 1: final).
    pub row_version: u8,
    /// The row's `time_ms`.
    pub time_ms: u64,
    /// When it was chained, Unix seconds.
    pub chained_s: u32,
}

impl Entry {
    /// The entry `data` starts with and its length; `None` when `data` does
    /// not start with a whole one.
    pub fn decode(data: &[u8]) -> Option<(Entry, usize)> {
        let (len, mut at) = leb128(data, 0)?;
        let end = at.checked_add(usize::try_from(len).ok()?)?;
        let writer_id = String::from_utf8(data.get(at..end)?.to_vec()).ok()?;
        at = end;
        let mut take = |n: usize| -> Option<&[u8]> {
            let b = data.get(at..at + n)?;
            at += n;
            Some(b)
        };
        let seq = u64::from_le_bytes(take(8)?.try_into().ok()?);
        let event_id: [u8; 16] = take(16)?.try_into().ok()?;
        let row_version = *take(1)?.first()?;
        let time_ms = u64::from_le_bytes(take(8)?.try_into().ok()?);
        let prev_hash: Hash = take(32)?.try_into().ok()?;
        let row_hash: Hash = take(32)?.try_into().ok()?;
        let chained_s = u32::from_le_bytes(take(4)?.try_into().ok()?);
        let stored: Hash = take(32)?.try_into().ok()?;
        // An empty link: an entry of a release before links.
        let legacy = stored == GENESIS;
        Some((
            Entry {
                writer_id,
                link: Link {
                    seq,
                    prev_hash,
                    row_hash,
                    link: if legacy { row_hash } else { stored },
                    legacy,
                },
                event_id,
                row_version,
                time_ms,
                chained_s,
            },
            at,
        ))
    }
}

/// Columns of the checkpoint table (`<table>_checkpoints`), in
/// [`SignedCheckpoint::encode`]'s order.
pub const CHECKPOINT_COLUMNS: &[&str] = &[
    "writer_id",
    "seq",
    "row_hash",
    "time_ms",
    "signature",
    "public_key",
    "time",
];

/// A checkpoint with its signature and the key that made it: a row of the
/// checkpoint table and a line of the local checkpoint file.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SignedCheckpoint {
    /// What is vouched for.
    pub checkpoint: Checkpoint,
    /// Ed25519 signature over [`Checkpoint::message`].
    pub signature: [u8; 64],
    /// The signer's public key as published (`ed25519:<base64>`).
    pub public_key: String,
}

/// A checkpoint file line.
#[derive(serde::Serialize, serde::Deserialize)]
struct CheckpointLine {
    writer_id: String,
    seq: u64,
    row_hash: String,
    time_ms: u64,
    signature: String,
    public_key: String,
}

impl SignedCheckpoint {
    /// Signs the chain's head at `time_ms`.
    pub fn sign(signer: &Signer, writer_id: &str, seq: u64, row_hash: Hash, time_ms: u64) -> Self {
        Self::sign_as(signer, writer_id, seq, row_hash, time_ms, false)
    }

    /// Signs the chain's head at `time_ms`, as the final checkpoint of a
    /// clean stop when `last`.
    pub fn sign_as(
        signer: &Signer,
        writer_id: &str,
        seq: u64,
        row_hash: Hash,
        time_ms: u64,
        last: bool,
    ) -> Self {
        let checkpoint = Checkpoint {
            writer_id: writer_id.to_owned(),
            seq,
            row_hash,
            time_ms,
        };
        let signature = if last {
            signer.sign_final(&checkpoint)
        } else {
            signer.sign(&checkpoint)
        };
        SignedCheckpoint {
            checkpoint,
            signature,
            public_key: signer.public_key_text(),
        }
    }

    /// Appends its checkpoint-table row (`RowBinary`).
    pub fn encode(&self, out: &mut Vec<u8>) {
        let c = &self.checkpoint;
        put_str(out, &c.writer_id);
        out.extend_from_slice(&c.seq.to_le_bytes());
        out.extend_from_slice(&c.row_hash);
        out.extend_from_slice(&c.time_ms.to_le_bytes());
        out.extend_from_slice(&self.signature);
        put_str(out, &self.public_key);
        let secs = u32::try_from(c.time_ms / 1000).unwrap_or(u32::MAX);
        out.extend_from_slice(&secs.to_le_bytes());
    }

    /// The checkpoint-table row `data` starts with, and its length.
    pub fn decode(data: &[u8]) -> Option<(SignedCheckpoint, usize)> {
        let (writer_id, mut at) = get_str(data, 0)?;
        let seq = u64::from_le_bytes(data.get(at..at + 8)?.try_into().ok()?);
        at += 8;
        let row_hash: Hash = data.get(at..at + 32)?.try_into().ok()?;
        at += 32;
        let time_ms = u64::from_le_bytes(data.get(at..at + 8)?.try_into().ok()?);
        at += 8;
        let signature: [u8; 64] = data.get(at..at + 64)?.try_into().ok()?;
        at += 64;
        let (public_key, next) = get_str(data, at)?;
        at = next + 4;
        data.get(..at)?;
        Some((
            SignedCheckpoint {
                checkpoint: Checkpoint {
                    writer_id,
                    seq,
                    row_hash,
                    time_ms,
                },
                signature,
                public_key,
            },
            at,
        ))
    }

    /// Its line in the local checkpoint file (JSON, no newline).
    pub fn to_line(&self) -> String {
        let c = &self.checkpoint;
        let line = CheckpointLine {
            writer_id: c.writer_id.clone(),
            seq: c.seq,
            row_hash: hex::encode(c.row_hash),
            time_ms: c.time_ms,
            signature: hex::encode(self.signature),
            public_key: self.public_key.clone(),
        };
        serde_json::to_string(&line).unwrap_or_default()
    }

    /// A line of a checkpoint file.
    pub fn from_line(line: &str) -> Option<SignedCheckpoint> {
        let l: CheckpointLine = serde_json::from_str(line).ok()?;
        Some(SignedCheckpoint {
            checkpoint: Checkpoint {
                writer_id: l.writer_id,
                seq: l.seq,
                row_hash: hex::decode(&l.row_hash).ok()?.try_into().ok()?,
                time_ms: l.time_ms,
            },
            signature: hex::decode(&l.signature).ok()?.try_into().ok()?,
            public_key: l.public_key,
        })
    }

    /// Whether one of `keys` (32-byte Ed25519 public keys) signed it.
    pub fn verify(&self, keys: &[[u8; 32]]) -> bool {
        self.verify_kind(keys).is_some()
    }

    /// `Some(final)` when one of `keys` signed it (as a clean stop's final
    /// checkpoint, or not).
    pub fn verify_kind(&self, keys: &[[u8; 32]]) -> Option<bool> {
        keys.iter()
            .find_map(|k| self.checkpoint.verify_kind(k, &self.signature))
    }
}

/// A published public key (`ed25519:<base64>`, what `audit pubkey` prints).
pub fn parse_public_key(text: &str) -> Option<[u8; 32]> {
    use base64::Engine as _;
    let b64 = text.trim().strip_prefix("ed25519:")?;
    base64::engine::general_purpose::STANDARD
        .decode(b64)
        .ok()?
        .try_into()
        .ok()
}

/// What a chain entry is, next to the one before it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Step {
    /// The next `seq`, linked to the one before (or the first, from
    /// [`GENESIS`] or an anchor).
    Linked,
    /// An identical copy of the entry before (at-least-once delivery).
    Duplicate,
    /// Another entry under a `seq` already seen (forged).
    Conflict,
    /// Entries before this one are missing (deleted): `from..=to`.
    Gap {
        /// First missing `seq`.
        from: u64,
        /// Last missing `seq`.
        to: u64,
    },
    /// Its `prev_hash` is not the hash of the entry before (altered or
    /// forged chain).
    Broken,
}

/// Checks one writer's chain entries, in ascending `seq`, one at a time:
/// one `seq` and one hash of state, so any length fits.
#[derive(Debug, Default)]
pub struct Links {
    head: Option<(u64, Hash)>,
}

impl Links {
    /// A chain checked from its first row (`seq` 1 after [`GENESIS`]).
    pub fn from_genesis() -> Links {
        Links {
            head: Some((0, GENESIS)),
        }
    }

    /// A chain checked from wherever its first entry is (a window of it):
    /// that entry's own link is taken as given.
    pub fn anchored() -> Links {
        Links { head: None }
    }

    /// A chain checked from a signed checkpoint at `seq` whose link is
    /// `link` (a window anchored there).
    pub fn after(seq: u64, link: Hash) -> Links {
        Links {
            head: Some((seq, link)),
        }
    }

    /// The next entry.
    pub fn push(&mut self, l: &Link) -> Step {
        let Some((seq, hash)) = self.head else {
            self.head = Some((l.seq, l.link));
            return Step::Linked;
        };
        if l.seq <= seq {
            // Entries come sorted: a copy of the last, or another entry
            // under a used number.
            return if l.seq == seq && l.link == hash {
                Step::Duplicate
            } else {
                Step::Conflict
            };
        }
        self.head = Some((l.seq, l.link));
        if l.seq > seq + 1 {
            Step::Gap {
                from: seq + 1,
                to: l.seq - 1,
            }
        } else if l.prev_hash != hash {
            Step::Broken
        } else {
            Step::Linked
        }
    }

    /// The last `seq` and hash seen.
    pub fn head(&self) -> Option<(u64, Hash)> {
        self.head
    }
}

/// The `String` at `at` and where it ends.
fn get_str(data: &[u8], at: usize) -> Option<(String, usize)> {
    let (len, start) = leb128(data, at)?;
    let end = start.checked_add(usize::try_from(len).ok()?)?;
    Some((String::from_utf8(data.get(start..end)?.to_vec()).ok()?, end))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rows(n: usize) -> Vec<Vec<u8>> {
        (0..n).map(|i| format!("row {i}").into_bytes()).collect()
    }

    fn chained(writer: &str, rows: &[Vec<u8>]) -> Vec<(Link, Vec<u8>)> {
        let mut c = Chain::new(writer);
        rows.iter().map(|r| (c.link(r), r.clone())).collect()
    }

    fn steps(links: &[Link]) -> Vec<Step> {
        let mut l = Links::from_genesis();
        links.iter().map(|x| l.push(x)).collect()
    }

    #[test]
    fn a_chain_verifies_and_resumes_exactly() {
        let rows = rows(10);
        let whole = chained("fw-a", &rows);
        let links: Vec<Link> = whole.iter().map(|(l, _)| *l).collect();
        assert!(steps(&links).iter().all(|s| *s == Step::Linked));
        assert_eq!(whole[0].0.prev_hash, GENESIS);
        for (l, r) in &whole {
            assert!(l.covers("fw-a", r) && l.holds("fw-a", 1));
            assert!(!l.covers("fw-a", b"another row"));
        }
        // Stopped after 4 rows and resumed from the spool's head.
        let mut first = Chain::new("fw-a");
        for r in &rows[..4] {
            first.link(r);
        }
        let (seq, last) = first.head();
        let mut resumed = Chain::resume("fw-a", seq, last, 1);
        let rest: Vec<Link> = rows[4..].iter().map(|r| resumed.link(r)).collect();
        assert_eq!(rest, links[4..].to_vec());
        // Another writer's chain of the same rows is another chain.
        assert_ne!(chained("fw-b", &rows)[0].0.link, whole[0].0.link);
        // Where links begin is inside every link.
        let mut later = Chain::resume("fw-a", 0, GENESIS, 1);
        let mut moved = Chain::resume("fw-a", 0, GENESIS, 1);
        moved.linked_from = 2;
        assert_ne!(later.link(&rows[0]).link, moved.link(&rows[0]).link);
    }

    #[test]
    fn deletion_forgery_and_duplicates_are_told_apart() {
        let rows = rows(8);
        let links: Vec<Link> = chained("w", &rows).iter().map(|(l, _)| *l).collect();
        // A deleted entry: a gap, the next link not checked across it.
        let mut deleted = links.clone();
        deleted.remove(3);
        assert_eq!(steps(&deleted)[3], Step::Gap { from: 4, to: 4 });
        // A forged entry re-hashed to look whole breaks the next link.
        let mut forged = links.clone();
        forged[2].row_hash = content_hash(b"never happened");
        forged[2].link = link_hash("w", 3, 1, &forged[2].prev_hash, &forged[2].row_hash);
        assert!(forged[2].holds("w", 1));
        assert_eq!(steps(&forged)[3], Step::Broken);
        // Not re-linked: the entry itself does not hold.
        let mut lazy = links.clone();
        lazy[2].row_hash = content_hash(b"never happened");
        assert!(!lazy[2].holds("w", 1));
        // Delivered twice: a duplicate; another entry under a used number:
        // a conflict.
        let mut twice = links.clone();
        twice.insert(4, links[3]);
        assert_eq!(steps(&twice)[4], Step::Duplicate);
        let mut other = links.clone();
        let mut copy = links[3];
        copy.link = [9; 32];
        other.insert(4, copy);
        assert_eq!(steps(&other)[4], Step::Conflict);
        // The first rows deleted: a gap from 1; a window is anchored.
        assert_eq!(steps(&links[2..])[0], Step::Gap { from: 1, to: 2 });
        let mut window = Links::anchored();
        assert_eq!(window.push(&links[2]), Step::Linked);
        assert_eq!(window.push(&links[3]), Step::Linked);
    }

    #[test]
    fn entries_and_checkpoints_round_trip_their_encodings() {
        let row = {
            let mut r = vec![7u8; 16];
            r.extend_from_slice(&1u32.to_le_bytes());
            r.extend_from_slice(&1_796_500_000_123u64.to_le_bytes());
            r.extend_from_slice(b"rest");
            r
        };
        let link = Chain::new("fw").link(&row);
        // A legacy entry (empty link) reads back as one.
        let mut old = Vec::new();
        let legacy = Link {
            legacy: true,
            link: [4; 32],
            row_hash: [4; 32],
            ..link
        };
        encode_entry("fw", &legacy, &row, 1, 1, &mut old);
        assert_eq!(Entry::decode(&old).unwrap().0.link, legacy);
        let mut out = Vec::new();
        encode_entry("fw", &link, &row, 0, 1_796_500_001, &mut out);
        let (e, n) = Entry::decode(&out).unwrap();
        assert_eq!(n, out.len());
        assert_eq!(e.link, link);
        assert_eq!(
            (e.event_id, e.row_version, e.time_ms),
            ([7; 16], 0, 1_796_500_000_123)
        );
        assert!(Entry::decode(&out[..out.len() - 1]).is_none());
        let signer = Signer::from_pem(&Signer::generate_pem().unwrap()).unwrap();
        let cp = SignedCheckpoint::sign(&signer, "fw", 5, [3; 32], 1_796_500_000_000);
        let mut out = Vec::new();
        cp.encode(&mut out);
        let (back, n) = SignedCheckpoint::decode(&out).unwrap();
        assert_eq!((back, n), (cp.clone(), out.len()));
        assert_eq!(SignedCheckpoint::from_line(&cp.to_line()), Some(cp.clone()));
        let key = parse_public_key(&signer.public_key_text()).unwrap();
        assert!(cp.verify(&[key]));
        let mut tampered = cp.clone();
        tampered.checkpoint.seq = 6;
        assert!(!tampered.verify(&[key]));
    }

    #[test]
    fn checkpoints_are_signed_and_bound_to_every_field() {
        let pem = Signer::generate_pem().unwrap();
        assert!(pem.starts_with(PEM_BEGIN));
        let signer = Signer::from_pem(&pem).unwrap();
        let cp = Checkpoint {
            writer_id: "fw-a".into(),
            seq: 1000,
            row_hash: [7; 32],
            time_ms: 1_796_500_000_000,
        };
        let sig = signer.sign(&cp);
        assert!(cp.verify(signer.public_key(), &sig));
        for changed in [
            Checkpoint {
                seq: 999,
                ..cp.clone()
            },
            Checkpoint {
                row_hash: [8; 32],
                ..cp.clone()
            },
            Checkpoint {
                writer_id: "fw-b".into(),
                ..cp.clone()
            },
            Checkpoint {
                time_ms: cp.time_ms + 1,
                ..cp.clone()
            },
        ] {
            assert!(!changed.verify(signer.public_key(), &sig), "{changed:?}");
        }
        let other = Signer::from_pem(&Signer::generate_pem().unwrap()).unwrap();
        assert!(!cp.verify(other.public_key(), &sig));
        // A final checkpoint is told apart, and is not an ordinary one.
        let last = signer.sign_final(&cp);
        assert_eq!(cp.verify_kind(signer.public_key(), &last), Some(true));
        assert_eq!(cp.verify_kind(signer.public_key(), &sig), Some(false));
        assert!(!cp.verify(signer.public_key(), &last));
        assert!(signer.public_key_text().starts_with("ed25519:"));
        assert!(matches!(
            Signer::from_pem("nonsense"),
            Err(KeyError::NotPem)
        ));
    }

    #[test]
    fn the_hash_input_is_unambiguous() {
        // Moving bytes between the writer id and the row changes the hash.
        assert_ne!(
            row_hash("ab", 1, &GENESIS, b"c"),
            row_hash("a", 1, &GENESIS, b"bc")
        );
        // Pinned: the hash of a known input never changes across releases
        // (an auditor's verifier must agree with every writer ever shipped).
        assert_eq!(
            hex::encode(row_hash("fw", 1, &GENESIS, b"row")),
            "628b3a2bf033416cd9989910fb1d7346b4de53a6486777ba0968ef35f822e596"
        );
    }
}
