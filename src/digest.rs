//! SHA-256, the product's one implementation: the verified-token cache key,
//! the arguments' hash, every audit row's content and link on the request
//! path and the chain, and off it the key set's fingerprint, the policy's
//! content hash and the console's script hash: `ring`'s implementation, which picks the CPU's SHA
//! extensions, AVX2 or SSSE3 code at run time, where `sha2` without them
//! falls back to portable code about three times dearer (on CPUs without
//! SHA-NI, and under callgrind, whose virtual CPU has none: there it was a
//! third of every instruction an audited call executes). The output is
//! SHA-256 either way; the tests hold it to `sha2`'s.

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

#[cfg(test)]
mod tests {
    use super::Sha256;
    use sha2::Digest as _;

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
