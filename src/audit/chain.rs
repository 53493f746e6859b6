//! The audit trail's hash chain and its signed checkpoints (issue 36,
//! first part): what makes a deleted, altered or forged row visible.
//!
//! Every writer (a replica, by its `writer_id`) numbers its rows 1, 2, 3…
//! and links each to the one before: `row_hash = SHA-256(domain, writer_id,
//! seq, prev_hash, row)`, where `row` is the row's one canonical encoding,
//! the ClickHouse `RowBinary` bytes [`super::record`] writes once (every
//! column, fixed order, lengths prefixed), which the verifier reads back
//! byte for byte with `SELECT … FORMAT RowBinary`. Every so often the
//! writer signs `(writer_id, seq, row_hash, time)` with Ed25519: a
//! checkpoint. Deleting a row leaves a gap in `seq`; altering one breaks
//! its hash and every link after it; forging one needs a `seq` and hash
//! the chain does not have; cutting the tail is caught by the last
//! checkpoint.
//!
//! Invariants: the hash input is unambiguous (every variable-length part
//! carries its length, and a domain string separates chain hashes from
//! checkpoint messages); a chain resumed from its last `(seq, hash)`
//! continues exactly as if it had not stopped; the verifier streams (state
//! per writer is one `seq` and one hash) so any number of rows fits.

use std::fmt::Write as _;

use ring::signature::{Ed25519KeyPair, KeyPair, UnparsedPublicKey, ED25519};
use sha2::{Digest, Sha256};

/// A SHA-256 digest.
pub type Hash = [u8; 32];

/// The `prev_hash` of a writer's first row.
pub const GENESIS: Hash = [0; 32];

const ROW_DOMAIN: &[u8] = b"mcp-firewall audit row v1\0";
const CHECKPOINT_DOMAIN: &[u8] = b"mcp-firewall audit checkpoint v1\0";

/// A row's place in its writer's chain.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Link {
    /// 1, 2, 3… per writer.
    pub seq: u64,
    /// The hash of the row before (the writer's first: [`GENESIS`]).
    pub prev_hash: Hash,
    /// This row's hash.
    pub row_hash: Hash,
}

/// The hash of row `seq` of `writer_id` after `prev`, over its canonical
/// encoding `row`.
pub fn row_hash(writer_id: &str, seq: u64, prev: &Hash, row: &[u8]) -> Hash {
    let mut h = Sha256::new();
    h.update(ROW_DOMAIN);
    h.update((writer_id.len() as u64).to_be_bytes());
    h.update(writer_id.as_bytes());
    h.update(seq.to_be_bytes());
    h.update(prev);
    h.update((row.len() as u64).to_be_bytes());
    h.update(row);
    h.finalize().into()
}

/// One writer's chain: the next row's link.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Chain {
    writer_id: String,
    seq: u64,
    last: Hash,
}

impl Chain {
    /// A new writer's chain (its first row gets `seq` 1).
    pub fn new(writer_id: &str) -> Chain {
        Chain::resume(writer_id, 0, GENESIS)
    }

    /// A chain that continues after row `seq` whose hash was `last` (from
    /// the spool after a restart).
    pub fn resume(writer_id: &str, seq: u64, last: Hash) -> Chain {
        Chain {
            writer_id: writer_id.to_owned(),
            seq,
            last,
        }
    }

    /// Links the next row.
    pub fn link(&mut self, row: &[u8]) -> Link {
        let seq = self.seq + 1;
        let prev_hash = self.last;
        let hash = row_hash(&self.writer_id, seq, &prev_hash, row);
        self.seq = seq;
        self.last = hash;
        Link {
            seq,
            prev_hash,
            row_hash: hash,
        }
    }

    /// The last row's `seq` and hash (0 and [`GENESIS`] before any).
    pub fn head(&self) -> (u64, Hash) {
        (self.seq, self.last)
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
        let mut m = Vec::with_capacity(CHECKPOINT_DOMAIN.len() + self.writer_id.len() + 56);
        m.extend_from_slice(CHECKPOINT_DOMAIN);
        m.extend_from_slice(&(self.writer_id.len() as u64).to_be_bytes());
        m.extend_from_slice(self.writer_id.as_bytes());
        m.extend_from_slice(&self.seq.to_be_bytes());
        m.extend_from_slice(&self.row_hash);
        m.extend_from_slice(&self.time_ms.to_be_bytes());
        m
    }

    /// Whether `signature` is `public_key`'s over this checkpoint.
    pub fn verify(&self, public_key: &[u8], signature: &[u8]) -> bool {
        UnparsedPublicKey::new(&ED25519, public_key)
            .verify(&self.message(), signature)
            .is_ok()
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
        let mut out = [0u8; 64];
        out.copy_from_slice(self.key.sign(&checkpoint.message()).as_ref());
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

/// What verifying one writer's chain found.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct WriterReport {
    /// Rows whose hash and link held.
    pub verified: u64,
    /// Missing `seq` ranges (inclusive): deleted rows.
    pub gaps: Vec<(u64, u64)>,
    /// Rows whose content no longer gives their hash (altered), by `seq`.
    pub altered: Vec<u64>,
    /// Rows whose `prev_hash` is not the hash of the row before, by `seq`.
    pub broken_links: Vec<u64>,
    /// Copies of a row already seen, identical (at-least-once delivery).
    pub duplicates: u64,
    /// Copies of a `seq` already seen that differ from it (forged), by `seq`.
    pub conflicts: Vec<u64>,
    /// The last `seq` and hash seen.
    pub head: (u64, Hash),
}

impl WriterReport {
    /// Nothing wrong.
    pub fn holds(&self) -> bool {
        self.gaps.is_empty()
            && self.altered.is_empty()
            && self.broken_links.is_empty()
            && self.conflicts.is_empty()
    }
}

/// Verifies one writer's rows in `seq` order, one at a time.
#[derive(Debug)]
pub struct Verifier {
    writer_id: String,
    report: WriterReport,
}

impl Verifier {
    /// Verifies `writer_id`'s chain from its first row.
    pub fn new(writer_id: &str) -> Verifier {
        Verifier {
            writer_id: writer_id.to_owned(),
            report: WriterReport::default(),
        }
    }

    /// The next row (rows must come in ascending `seq`, duplicates next to
    /// each other): its stored link and its canonical encoding.
    pub fn push(&mut self, stored: &Link, row: &[u8]) {
        let r = &mut self.report;
        let (last_seq, last_hash) = r.head;
        let computed = row_hash(&self.writer_id, stored.seq, &stored.prev_hash, row);
        if stored.seq <= last_seq {
            // Delivered twice (identical), or another row under a used
            // number (forged).
            if stored.seq == last_seq && stored.row_hash == last_hash && computed == last_hash {
                r.duplicates += 1;
            } else {
                r.conflicts.push(stored.seq);
            }
            return;
        }
        if stored.seq > last_seq + 1 {
            // Rows deleted: the link across the gap cannot be checked.
            r.gaps.push((last_seq + 1, stored.seq - 1));
        } else if stored.prev_hash != last_hash {
            r.broken_links.push(stored.seq);
        }
        if computed != stored.row_hash {
            r.altered.push(stored.seq);
        } else if stored.seq == last_seq + 1 && stored.prev_hash == last_hash {
            r.verified += 1;
        }
        r.head = (stored.seq, stored.row_hash);
    }

    /// The findings so far.
    pub fn report(&self) -> &WriterReport {
        &self.report
    }
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

    fn verify(writer: &str, links: &[(Link, Vec<u8>)]) -> WriterReport {
        let mut v = Verifier::new(writer);
        for (l, r) in links {
            v.push(l, r);
        }
        v.report().clone()
    }

    #[test]
    fn a_chain_verifies_and_resumes_exactly() {
        let rows = rows(10);
        let whole = chained("fw-a", &rows);
        let r = verify("fw-a", &whole);
        assert!(r.holds(), "{r:?}");
        assert_eq!(r.verified, 10);
        assert_eq!(whole[0].0.prev_hash, GENESIS);
        // Stopped after 4 rows and resumed from the spool's head.
        let mut first = Chain::new("fw-a");
        for r in &rows[..4] {
            first.link(r);
        }
        let (seq, last) = first.head();
        let mut resumed = Chain::resume("fw-a", seq, last);
        let rest: Vec<Link> = rows[4..].iter().map(|r| resumed.link(r)).collect();
        assert_eq!(rest, whole[4..].iter().map(|(l, _)| *l).collect::<Vec<_>>());
        // Another writer's chain of the same rows is another chain.
        assert_ne!(chained("fw-b", &rows)[0].0.row_hash, whole[0].0.row_hash);
    }

    #[test]
    fn deletion_alteration_forgery_and_duplicates_are_told_apart() {
        let rows = rows(8);
        let whole = chained("w", &rows);
        // A deleted row: a gap, and the next row's link is not checked
        // against a row that is not there.
        let mut deleted = whole.clone();
        deleted.remove(3);
        let r = verify("w", &deleted);
        assert_eq!(r.gaps, vec![(4, 4)]);
        assert!(r.altered.is_empty() && r.broken_links.is_empty());
        // An altered row: its own hash fails; the chain after it holds.
        let mut altered = whole.clone();
        altered[5].1 = b"row 5, arguments changed".to_vec();
        let r = verify("w", &altered);
        assert_eq!(r.altered, vec![6]);
        assert!(r.gaps.is_empty());
        // A forged row re-hashed to look whole still breaks the next link.
        let mut forged = whole.clone();
        let fake = b"a call that never happened".to_vec();
        forged[2].1 = fake.clone();
        forged[2].0.row_hash = row_hash("w", 3, &forged[2].0.prev_hash, &fake);
        let r = verify("w", &forged);
        assert_eq!(r.broken_links, vec![4]);
        // Delivered twice: identical copies are fine; a different row under
        // a used number is a conflict.
        let mut twice = whole.clone();
        twice.insert(4, whole[3].clone());
        let r = verify("w", &twice);
        assert!(r.holds(), "{r:?}");
        assert_eq!(r.duplicates, 1);
        let mut other = whole.clone();
        let mut copy = whole[3].clone();
        copy.1 = b"another".to_vec();
        other.insert(4, copy);
        assert_eq!(verify("w", &other).conflicts, vec![4]);
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
