//! The product's two hashes, one implementation each.
//!
//! - **SHA-256** (`ring`'s, which picks the CPU's SHA extensions, AVX2 or
//!   SSSE3 code at run time): the arguments' hash, every audit link on the
//!   chain and the checkpoints, and off the request path the key set's
//!   fingerprint, the policy's content hash and the console's script hash.
//!   The tests hold it to `sha2`'s.
//! - **BLAKE3** ([`Blake3`]) where the firewall hashes the most bytes per
//!   request: each audit row's content hash (about 1 KB a row, two rows an
//!   audited call) and the verified-token cache key (the whole token, every
//!   request). Same 256-bit output and second-preimage margin; on a CPU
//!   without SHA extensions (and under callgrind, whose virtual CPU has
//!   none) it costs about a fifth of SHA-256's instructions for 1 KB. The
//!   tests hold it to the published vectors.

/// An incremental SHA-256.
pub(crate) struct Sha256(ring::digest::Context);

impl Sha256 {
    /// A fresh hash.
    pub(crate) fn new() -> Sha256 {
        Sha256(ring::digest::Context::new(&ring::digest::SHA256))
    }

    /// Adds `data`.
    pub(crate) fn update(&mut self, data: impl AsRef<[u8]>) {
        self.0.update(data.as_ref());
    }

    /// The digest.
    pub(crate) fn finalize(self) -> [u8; 32] {
        let mut out = [0u8; 32];
        out.copy_from_slice(self.0.finish().as_ref());
        out
    }

    /// The digest of `data`.
    pub(crate) fn digest(data: impl AsRef<[u8]>) -> [u8; 32] {
        let mut h = Sha256::new();
        h.update(data);
        h.finalize()
    }
}

/// An incremental BLAKE3 (256-bit output).
pub(crate) struct Blake3(blake3::Hasher);

impl Blake3 {
    /// A fresh hash.
    pub(crate) fn new() -> Blake3 {
        Blake3(blake3::Hasher::new())
    }

    /// Adds `data`.
    pub(crate) fn update(&mut self, data: impl AsRef<[u8]>) {
        self.0.update(data.as_ref());
    }

    /// The digest.
    pub(crate) fn finalize(self) -> [u8; 32] {
        *self.0.finalize().as_bytes()
    }

    /// The digest of `data`.
    pub(crate) fn digest(data: impl AsRef<[u8]>) -> [u8; 32] {
        *blake3::hash(data.as_ref()).as_bytes()
    }
}

#[cfg(test)]
mod tests {
    use super::{Blake3, Sha256};
    use sha2::Digest as _;

    #[test]
    fn blake3_is_blake3_whatever_the_split() {
        // The published vectors: the empty input, and 1,024 bytes of
        // `i % 251` (one whole chunk).
        assert_eq!(
            hex::encode(Blake3::digest(b"")),
            "af1349b9f5f9a1a6a0404dea36dcc9499bcb25c9adc112b7cc9a93cae41f3262"
        );
        let data: Vec<u8> = (0..1025u32).map(|i| (i % 251) as u8).collect();
        let want = "42214739f095a406f3fc83deb889744ac00df831c10daa55189b5d121c855af7";
        assert_eq!(hex::encode(Blake3::digest(&data[..1024])), want);
        for split in [0, 1, 63, 64, 65, 512, 1024] {
            let mut h = Blake3::new();
            h.update(&data[..split]);
            h.update(&data[split..1024]);
            assert_eq!(hex::encode(h.finalize()), want, "split {split}");
        }
        assert_ne!(Blake3::digest(&data[..1025]), Blake3::digest(&data[..1024]));
    }

    #[test]
    fn it_is_sha256_whatever_the_input_length_and_split() {
        // Lengths around the 64-byte block and its 55/56-byte padding edge.
        let data: Vec<u8> = (0..300u32).map(|i| (i * 7 + 3) as u8).collect();
        for len in [0, 1, 55, 56, 63, 64, 65, 119, 120, 128, 300] {
            let want: [u8; 32] = sha2::Sha256::digest(&data[..len]).into();
            assert_eq!(Sha256::digest(&data[..len]), want, "len {len}");
            for split in [0, len / 3, len / 2, len] {
                let mut h = Sha256::new();
                h.update(&data[..split]);
                h.update(&data[split..len]);
                assert_eq!(h.finalize(), want, "len {len} split {split}");
            }
        }
        // The published test vector.
        assert_eq!(
            hex::encode(Sha256::digest(b"abc")),
            "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad"
        );
    }
}
