//! The `agent-intercom` command line: `serve`, `check-config` and `ctl`.
//!
//! Parsing only; each subcommand's work lives in the library
//! ([`agent_intercom::http::server`], [`agent_intercom::config`],
//! [`agent_intercom::ctl`]). Exit codes: 0 ok, 1 failure, 2 usage; `ctl`
//! documents its own.

use std::path::PathBuf;
use std::process::ExitCode;

use agent_intercom::app::choose_config;
use agent_intercom::config::check_config;
use agent_intercom::ctl::{self, CtlArgs};
use agent_intercom::http::server::{ServeOptions, serve};
use agent_intercom::logging::{self, LogFormat};
use clap::{Parser, Subcommand};

/// Supervise AI coding agents from Slack or a local operator API.
#[derive(Debug, Parser)]
#[command(name = "agent-intercom", version, about)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Run the server (HTTP API on [server] bind; Slack when its tokens are set)
    Serve {
        /// Config file [default: ./config.toml, else ./config.toml.example]
        #[arg(long)]
        config: Option<PathBuf>,
        /// Log line format
        #[arg(long, value_enum, default_value_t = LogFormat::Human)]
        log_format: LogFormat,
    },
    /// Validate a config file and print a summary
    CheckConfig {
        /// Config file [default: ./config.toml, else ./config.toml.example]
        #[arg(long)]
        config: Option<PathBuf>,
    },
    /// Talk to a running server
    Ctl(CtlArgs),
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    match cli.command {
        Command::Serve { config, log_format } => run_serve(config, log_format),
        Command::CheckConfig { config } => run_check(config),
        Command::Ctl(args) => exit_code(ctl::run(&args)),
    }
}

fn run_serve(config: Option<PathBuf>, log_format: LogFormat) -> ExitCode {
    logging::init(log_format);
    raise_open_file_limit();
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("error: cannot start the async runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    match runtime.block_on(serve(ServeOptions { config })) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {e}");
            ExitCode::FAILURE
        }
    }
}

/// Each agent holds three pipes and a pidfd: raise the soft open-file limit
/// to the hard one so hundreds of sessions do not run out of descriptors.
fn raise_open_file_limit() {
    let mut lim = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: getrlimit/setrlimit only read and write the struct we pass.
    unsafe {
        if libc::getrlimit(libc::RLIMIT_NOFILE, &mut lim) == 0 && lim.rlim_cur < lim.rlim_max {
            let before = lim.rlim_cur;
            lim.rlim_cur = lim.rlim_max;
            if libc::setrlimit(libc::RLIMIT_NOFILE, &lim) == 0 {
                tracing::debug!(before, after = lim.rlim_max, "raised the open-file limit");
            }
        }
    }
}

fn run_check(config: Option<PathBuf>) -> ExitCode {
    let choice = choose_config(config.as_deref());
    if choice.fallback {
        eprintln!("note: no config.toml; checking config.toml.example");
    }
    match check_config(&choice.path) {
        Ok(summary) => {
            println!("{summary}");
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("{e}");
            ExitCode::FAILURE
        }
    }
}

fn exit_code(code: i32) -> ExitCode {
    ExitCode::from(u8::try_from(code).unwrap_or(1))
}
