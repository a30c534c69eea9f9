//! The message-passing core of agent-intercom.
//!
//! Every actor (session, supervisor, workspace registry), the agent protocols
//! they speak (framing, JSON-RPC, ACP, the intercom dialect), and the ports
//! (traits) through which they reach storage and the operator. Nothing here
//! knows about Slack, SQLite or HTTP.

#![deny(missing_docs)]

pub mod child;
pub mod fsjail;
pub mod gateway;
pub mod ids;
#[cfg(any(test, feature = "test-hooks"))]
pub mod memory;
pub mod model;
pub mod pipes;
pub mod ports;
pub mod process_tree;
pub mod protocol;
pub mod registry;
pub mod rules;
pub mod session;
pub mod settings;
pub mod slack_port;
pub mod supervisor;
pub mod text;
pub mod transcript;
pub mod workspace_fs;
