//! The writer's side of the hash chain ([`super::chain`]): links every row
//! the shipper sends into this replica's chain, in spool order, and signs
//! checkpoints of what ClickHouse acknowledged.
//!
//! Rows are linked when a batch is formed, on the shipper's thread: the
//! request path pays nothing. A batch's chain entries go to the chain table
//! before its rows go to the audit table.
//!
//! Invariants:
//! * The chain follows the spool's order, which never changes: a batch sent
//!   again (retry, replay after a crash) is linked to the same `seq` and
//!   hashes, so a row delivered twice has two identical entries.
//! * The head is known before the first row is linked: from the spool's
//!   chain head file when it belongs to the cursor the reader starts from;
//!   otherwise from what the writer can prove it wrote, its last checkpoint
//!   (its local checkpoint file, else the table's, checked with its own
//!   key), never from entries after it (`Shipper::resume_from`); without a
//!   key, from ClickHouse (the entry of the first row to be sent, if it was
//!   sent before; else the writer's last entry; else the chain starts).
//! * A checkpoint only vouches for acknowledged rows, and is appended to the
//!   local checkpoint file before it is sent.

use std::io::Write as _;
use std::path::PathBuf;
use std::time::{Duration, Instant};

use crate::digest::Sha256;

use super::chain::{encode_entry, Chain, Hash, SignedCheckpoint, Signer, GENESIS};
use super::spool::{Batch, ChainHead, Position};

/// The chain of this writer and its checkpoints.
pub(crate) struct Linker {
    /// `audit.chain`: false links nothing.
    enabled: bool,
    writer_id: String,
    writer_tag: [u8; 8],
    /// `None` until the head is known.
    chain: Option<Chain>,
    signer: Option<Signer>,
    every_rows: u64,
    every: Duration,
    /// The last acknowledged row.
    acked: Option<(u64, Hash)>,
    /// The last signed row, and when; whether that was a final checkpoint.
    signed_seq: u64,
    signed_final: bool,
    signed_at: Instant,
    file: PathBuf,
}

/// The first 8 bytes of SHA-256 of a writer id: what the chain head file
/// keeps to tell whether it is this writer's.
pub(crate) fn writer_tag(writer_id: &str) -> [u8; 8] {
    let d = Sha256::digest(writer_id.as_bytes());
    let mut tag = [0u8; 8];
    tag.copy_from_slice(&d[..8]);
    tag
}

impl Linker {
    /// A linker for `writer_id`, continuing from the spool's `head` when it
    /// belongs to the `cursor` the reader starts at.
    pub(crate) fn new(
        enabled: bool,
        writer_id: String,
        signer: Option<Signer>,
        (every_rows, every_s): (u64, u64),
        file: PathBuf,
        head: Option<ChainHead>,
        cursor: Option<Position>,
    ) -> Linker {
        let writer_tag = writer_tag(&writer_id);
        // A head of a release before links: its chain so far is legacy,
        // links begin after it.
        let chain = head
            .filter(|h| Some(h.at) == cursor && h.writer_tag == writer_tag)
            .map(|h| {
                let from = if h.linked_from == 0 {
                    h.seq + 1
                } else {
                    h.linked_from
                };
                Chain::resume(&writer_id, h.seq, h.hash, from)
            });
        Linker {
            enabled,
            acked: chain.as_ref().map(Chain::head),
            signed_seq: chain.as_ref().map_or(0, |c| c.head().0),
            signed_final: false,
            chain,
            writer_id,
            writer_tag,
            signer,
            every_rows,
            every: Duration::from_secs(every_s),
            signed_at: Instant::now(),
            file,
        }
    }

    /// The writer.
    pub(crate) fn writer_id(&self) -> &str {
        &self.writer_id
    }

    /// Whether the head must be learnt (from ClickHouse) before linking.
    pub(crate) fn needs_head(&self) -> bool {
        self.enabled && self.chain.is_none()
    }

    /// Continues after entry `seq` with link `hash` (0 and [`GENESIS`]: a
    /// new chain), links beginning at `linked_from`.
    pub(crate) fn resume(&mut self, seq: u64, hash: Hash, linked_from: u64) {
        self.chain = Some(Chain::resume(&self.writer_id, seq, hash, linked_from));
        self.acked = Some((seq, hash));
        self.signed_seq = seq;
    }

    /// The last checkpoint this writer can prove it signed: the last line
    /// of its local checkpoint file for this writer that its own key
    /// verifies (`seq`, link).
    pub(crate) fn last_signed_locally(&self) -> Option<(u64, Hash)> {
        let key: [u8; 32] = self.signer.as_ref()?.public_key().try_into().ok()?;
        let text = std::fs::read_to_string(&self.file).ok()?;
        text.lines()
            .filter_map(SignedCheckpoint::from_line)
            .filter(|c| c.checkpoint.writer_id == self.writer_id && c.verify(&[key]))
            .map(|c| (c.checkpoint.seq, c.checkpoint.row_hash))
            .max_by_key(|(seq, _)| *seq)
    }

    /// This writer's public key, if it signs.
    pub(crate) fn public_key(&self) -> Option<[u8; 32]> {
        self.signer.as_ref()?.public_key().try_into().ok()
    }

    /// Links the rows of `batch` and appends their chain entries to `out`;
    /// the chain's head after them (`None` when the head is not known:
    /// [`Self::needs_head`] first).
    pub(crate) fn link(&mut self, batch: &Batch, out: &mut Vec<u8>) -> Option<(u64, Hash)> {
        if !self.enabled {
            return None;
        }
        let chain = self.chain.as_mut()?;
        let now_s = u32::try_from(crate::clock::now_ms() / 1000).unwrap_or(u32::MAX);
        let mut starts = batch.row_starts.iter().peekable();
        while let Some(&start) = starts.next() {
            let end = starts.peek().map_or(batch.body.len(), |&&e| e);
            let Some(row) = batch.body.get(start..end) else {
                continue;
            };
            let link = chain.link(row);
            let version = super::record::row_version(row).unwrap_or(1);
            encode_entry(&self.writer_id, &link, row, version, now_s, out);
        }
        Some(chain.head())
    }

    /// Rows up to `head` are in ClickHouse: the head for the spool's chain
    /// head file at `at`.
    pub(crate) fn acknowledged(&mut self, at: Position, head: (u64, Hash)) -> ChainHead {
        self.acked = Some(head);
        ChainHead {
            at,
            writer_tag: self.writer_tag,
            seq: head.0,
            hash: head.1,
            linked_from: self.chain.as_ref().map_or(head.0 + 1, Chain::linked_from),
        }
    }

    /// A checkpoint of the acknowledged head, if one is due (`now`: at
    /// a clean stop, whatever the interval: the final checkpoint, which
    /// says nothing after it is this writer's until a later checkpoint
    /// signs it), already appended to the local checkpoint file.
    pub(crate) fn checkpoint(&mut self, now: bool) -> Option<SignedCheckpoint> {
        let signer = self.signer.as_ref()?;
        let (seq, hash) = self.acked?;
        if hash == GENESIS || seq < self.signed_seq {
            return None;
        }
        // The head signed already: only a clean stop signs it again, as
        // final.
        if seq == self.signed_seq && (!now || self.signed_final) {
            return None;
        }
        let due = now
            || seq - self.signed_seq >= self.every_rows
            || self.signed_at.elapsed() >= self.every;
        if !due {
            return None;
        }
        let cp = SignedCheckpoint::sign_as(
            signer,
            &self.writer_id,
            seq,
            hash,
            crate::clock::now_ms(),
            now,
        );
        self.signed_seq = seq;
        self.signed_final = now;
        self.signed_at = Instant::now();
        if let Err(e) = self.append_file(&cp) {
            tracing::error!(error = %e, file = %self.file.display(), "audit: cannot append the checkpoint to the local checkpoint file");
        }
        Some(cp)
    }

    fn append_file(&self, cp: &SignedCheckpoint) -> std::io::Result<()> {
        use std::os::unix::fs::OpenOptionsExt;
        let mut f = std::fs::OpenOptions::new()
            .append(true)
            .create(true)
            .mode(0o600)
            .open(&self.file)?;
        let mut line = cp.to_line();
        line.push('\n');
        f.write_all(line.as_bytes())?;
        f.sync_data()
    }
}
