//! agent-intercom: supervise AI coding agents from Slack or a local operator API.
//!
//! The binary's building blocks: configuration ([`config`]), SQLite storage
//! ([`storage`]), the application wiring over the core's actors ([`app`]),
//! the operator HTTP API and the `serve` command ([`http`]), its terminal
//! client ([`ctl`]) and log setup ([`logging`]).

pub mod app;
pub mod config;
pub mod ctl;
pub mod http;
pub mod logging;
pub mod mcp;
pub mod storage;
