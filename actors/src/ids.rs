//! Small random ids without a `rand` dependency.
//!
//! Session ids and per-session bridge tokens need to be unpredictable to
//! someone who cannot read the server's memory, not cryptographically strong
//! keys. `RandomState` is seeded from the OS once per process; mixing in a
//! counter and the clock gives distinct values on every call.

use std::collections::hash_map::RandomState;
use std::hash::{BuildHasher, Hasher};
use std::sync::atomic::{AtomicU64, Ordering};

static COUNTER: AtomicU64 = AtomicU64::new(0);

/// A fresh pseudo-random 64-bit value.
pub fn random_u64() -> u64 {
    let mut h = RandomState::new().build_hasher();
    h.write_u64(COUNTER.fetch_add(1, Ordering::Relaxed));
    h.write_u128(
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_nanos())
            .unwrap_or(0),
    );
    h.finish()
}

/// A 128-bit hex token (two independent draws).
pub fn random_token() -> String {
    format!("{:016x}{:016x}", random_u64(), random_u64())
}
