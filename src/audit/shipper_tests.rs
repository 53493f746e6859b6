//! Tests of the retry backoff schedule.

use super::*;

const MIN: Duration = Duration::from_millis(200);
const MAX: Duration = Duration::from_secs(30);

#[test]
fn backoff_doubles_per_attempt_up_to_the_ceiling() {
    // jitter 1.0 gives the full (unjittered) delay.
    let full = |a| backoff(a, MIN, MAX, 1.0);
    assert_eq!(full(1), Duration::from_millis(200));
    assert_eq!(full(2), Duration::from_millis(400));
    assert_eq!(full(5), Duration::from_millis(3_200));
    assert_eq!(full(8), Duration::from_millis(25_600));
    assert_eq!(full(9), MAX);
    assert_eq!(full(u32::MAX), MAX);
}

#[test]
fn jitter_keeps_the_delay_between_half_and_full() {
    for j in [0.0, 0.25, 0.5, 0.999] {
        let d = backoff(3, MIN, MAX, j);
        assert!(
            d >= Duration::from_millis(400) && d <= Duration::from_millis(800),
            "{d:?}"
        );
    }
    assert_eq!(backoff(3, MIN, MAX, 0.0), Duration::from_millis(400));
    // Out-of-range jitter is clamped, never negative or above the full delay.
    assert_eq!(backoff(3, MIN, MAX, -5.0), Duration::from_millis(400));
    assert_eq!(backoff(3, MIN, MAX, 7.0), Duration::from_millis(800));
}

#[test]
fn attempt_zero_is_treated_as_the_first() {
    assert_eq!(backoff(0, MIN, MAX, 1.0), MIN);
}

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
