//! Unguessable ids and tokens, drawn from the operating system's CSPRNG.
//!
//! Session ids, ACP-MCP bridge tokens and the generated API token are
//! credentials or close to it: whoever can guess one can act for a session.
//! Every value here comes from `getrandom` (Linux `getrandom(2)`); there is no
//! fallback to anything weaker. If the OS cannot give entropy the process
//! aborts with a clear message instead of issuing a guessable id; `serve`
//! calls [`self_test`] first so that failure shows at start, not mid-session.

/// The OS could not provide random bytes.
#[derive(Debug, thiserror::Error)]
#[error(
    "the operating system's random number generator failed ({0}); agent-intercom will not issue guessable ids or tokens"
)]
pub struct EntropyError(String);

/// Fills `buf` from the OS CSPRNG.
pub fn fill(buf: &mut [u8]) -> Result<(), EntropyError> {
    getrandom::fill(buf).map_err(|e| EntropyError(e.to_string()))
}

/// Checks once that the OS CSPRNG works (call at server start).
pub fn self_test() -> Result<(), EntropyError> {
    fill(&mut [0u8; 16])
}

/// A fresh random 64-bit value from the OS CSPRNG.
pub fn random_u64() -> u64 {
    let mut buf = [0u8; 8];
    or_abort(fill(&mut buf));
    u64::from_le_bytes(buf)
}

/// A 256-bit random token as 64 hex characters.
pub fn random_token() -> String {
    let mut buf = [0u8; 32];
    or_abort(fill(&mut buf));
    buf.iter().map(|b| format!("{b:02x}")).collect()
}

/// Entropy is not optional: without it every id would be guessable.
fn or_abort(result: Result<(), EntropyError>) {
    if let Err(e) = result {
        tracing::error!("{e}");
        eprintln!("agent-intercom: {e}");
        std::process::abort();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tokens_are_256_bit_hex_and_distinct() {
        let a = random_token();
        let b = random_token();
        assert_eq!(a.len(), 64);
        assert!(a.bytes().all(|c| c.is_ascii_hexdigit()));
        assert_ne!(a, b);
        assert!(self_test().is_ok());
    }

    #[test]
    fn u64s_are_not_a_sequence() {
        let draws: std::collections::HashSet<u64> = (0..1000).map(|_| random_u64()).collect();
        assert_eq!(draws.len(), 1000);
    }
}
