//! Which `config.toml` a start uses when none is named: `config.toml` in
//! the working directory, else the shipped example, said out loud.

use std::path::{Path, PathBuf};

/// The config file used when `--config` is not given.
pub const DEFAULT_CONFIG: &str = "config.toml";

/// The fallback when [`DEFAULT_CONFIG`] does not exist (a fresh clone).
pub const EXAMPLE_CONFIG: &str = "config.toml.example";

/// Which config file to load, and whether it is the example fallback.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ConfigChoice {
    /// The file.
    pub path: PathBuf,
    /// True when `./config.toml` is missing and `./config.toml.example` is used.
    pub fallback: bool,
}

/// `explicit` when given; else `./config.toml`, or `./config.toml.example`
/// when only that exists (so one command works on a fresh clone).
pub fn choose_config(explicit: Option<&Path>) -> ConfigChoice {
    if let Some(path) = explicit {
        return ConfigChoice {
            path: path.to_path_buf(),
            fallback: false,
        };
    }
    let default = PathBuf::from(DEFAULT_CONFIG);
    let example = PathBuf::from(EXAMPLE_CONFIG);
    if !default.exists() && example.is_file() {
        return ConfigChoice {
            path: example,
            fallback: true,
        };
    }
    ConfigChoice {
        path: default,
        fallback: false,
    }
}
