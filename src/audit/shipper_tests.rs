//! Tests of the shipper's parts (the retry schedule is `crate::backoff`'s).

use super::*;

#[test]
fn buffer_pool_reuses_unshared_bodies_up_to_its_size() {
    let mut pool = BufferPool::new(2);
    let mut first = pool.take(64);
    assert!(first.is_empty() && first.capacity() >= 64);
    first.extend_from_slice(b"rows of a batch");
    let ptr = first.as_ptr();
    pool.give(Bytes::from(first));
    let again = pool.take(64);
    assert!(again.is_empty(), "a recycled buffer comes back empty");
    assert_eq!(again.as_ptr(), ptr, "the same allocation is reused");

    // A body something else still refers to is not taken back.
    let shared = Bytes::from(vec![1u8; 32]);
    let other = shared.clone();
    pool.give(shared);
    assert_eq!(pool.take(8).capacity(), 8, "nothing recycled: a new buffer");
    drop(other);

    // At most `keep` spares.
    for _ in 0..3 {
        pool.give(Bytes::from(vec![0u8; 16]));
    }
    assert_eq!(pool.spares.len(), 2);
}

#[test]
fn buffer_pool_lets_oversized_buffers_go_when_batches_shrink() {
    let mut pool = BufferPool::new(2);
    // A small batch in a buffer a busier time grew: not kept.
    let mut big = Vec::with_capacity(4 << 20);
    big.extend_from_slice(&[7u8; 1024]);
    pool.give(Bytes::from(big));
    assert!(pool.spares.is_empty());
    // A batch that used most of its buffer: kept.
    let mut full = Vec::with_capacity(4 << 20);
    full.resize(3 << 20, 7);
    pool.give(Bytes::from(full));
    assert_eq!(pool.spares.len(), 1);
    assert!(pool.take(16).capacity() >= 3 << 20);
    // Below the floor, any use keeps it.
    let mut small = Vec::with_capacity(KEEP_ANY_BELOW);
    small.push(1);
    pool.give(Bytes::from(small));
    assert_eq!(pool.spares.len(), 1);
}
