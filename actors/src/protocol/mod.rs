//! The agent protocols: how bytes on a child's stdio become messages.
//!
//! Three layers, each in its own file: [`framing`] (NDJSON lines or LSP
//! `Content-Length` frames), [`jsonrpc`] (JSON-RPC 2.0 envelopes and id
//! correlation types), and the two dialects spoken over them: [`acp`] (the
//! standard Agent Client Protocol) and [`intercom`] (the older NDJSON dialect).

pub mod acp;
pub mod agent_options;
pub mod diff_paths;
pub mod framing;
pub mod intercom;
pub mod jsonrpc;
pub mod surrogates;
