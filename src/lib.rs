//! agent-intercom: supervise AI coding agents from Slack or a local operator API.
//!
//! The binary's building blocks: configuration ([`config`]), SQLite storage
//! ([`storage`]), the application wiring over the core's actors ([`app`]),
//! the operator HTTP API and the `serve` command ([`http`]), its terminal
//! client ([`ctl`]), log setup ([`logging`]), the Slack edge ([`slack`]) and
//! the MCP endpoint ([`mcp`]), the top of the actor tree ([`root`]), the stored operator event journal ([`journal`])
//! and the web console ([`web`]).

pub mod app;
pub mod config;
pub mod ctl;
pub mod http;
pub mod journal;
pub mod logging;
pub mod mcp;
pub mod root;
pub mod slack;
pub mod storage;
pub mod web;
