//! Loopback ports for servers a test starts as child processes (included
//! with `#[path]` by the test harnesses).
//!
//! A port read from a socket bound to port 0 and released is only free at
//! that moment: the kernel may hand the same port to the next `bind(0)`,
//! and tests in one binary run in parallel. Two servers given one port
//! meant one test talked to another test's server (a CI run saw "wrong API
//! token" from a server that was not its own). So every port handed out
//! here is remembered for the life of the test process and never handed
//! out twice.

use std::collections::HashSet;
use std::sync::{Mutex, OnceLock};

/// A loopback port free at the moment of asking and not handed out before
/// by this process.
pub fn free_port() -> u16 {
    static GIVEN: OnceLock<Mutex<HashSet<u16>>> = OnceLock::new();
    let given = GIVEN.get_or_init(|| Mutex::new(HashSet::new()));
    loop {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("bind 0");
        let port = listener.local_addr().expect("addr").port();
        if given.lock().expect("port registry").insert(port) {
            return port;
        }
    }
}
