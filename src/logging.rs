//! Log setup for the server: `tracing` to stderr, human-readable or JSON.
//!
//! The level comes from `RUST_LOG` (default `info`). Nothing logged anywhere
//! in the server includes the API token or Slack tokens.

use std::io::IsTerminal;

use tracing_subscriber::EnvFilter;

/// How log lines look.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, clap::ValueEnum)]
pub enum LogFormat {
    /// One readable line per event.
    #[default]
    Human,
    /// One JSON object per event.
    Json,
}

/// Installs the global subscriber. Calling it twice is harmless (the second
/// call keeps the first subscriber).
pub fn init(format: LogFormat) {
    let filter = EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new("info"));
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr);
    let result = match format {
        LogFormat::Human => builder
            .with_target(false)
            .with_ansi(std::io::stderr().is_terminal())
            .try_init(),
        LogFormat::Json => builder.json().try_init(),
    };
    // Already installed (tests): keep it.
    drop(result);
}
