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
    keep_inherited_descriptors_from_agents();
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
    let outcome = runtime.block_on(serve(ServeOptions { config }));
    // Everything the server owns has stopped by now; a blocking task still
    // running (a file call past its timeout) must not hold the exit.
    runtime.shutdown_timeout(BLOCKING_AT_EXIT);
    match outcome {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {e}");
            ExitCode::FAILURE
        }
    }
}

/// The longest the process waits at exit for blocking tasks still running.
const BLOCKING_AT_EXIT: std::time::Duration = std::time::Duration::from_secs(2);

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

/// Marks every descriptor above stderr that the server inherited from
/// whoever launched it close-on-exec, before any agent is spawned. The
/// server opens its own with close-on-exec, but one left open by a shell,
/// a supervisor or a terminal multiplexer would otherwise pass on to every
/// agent (a hostile agent could read or write whatever it refers to).
/// Linux only (`/proc/self/fd`); elsewhere nothing is done.
fn keep_inherited_descriptors_from_agents() {
    let Ok(dir) = std::fs::read_dir("/proc/self/fd") else {
        return;
    };
    let fds: Vec<i32> = dir
        .filter_map(|e| e.ok()?.file_name().to_str()?.parse().ok())
        .filter(|fd| *fd > 2)
        .collect();
    for fd in fds {
        // SAFETY: fcntl on a descriptor number only reads or sets its flags;
        // a number that is no longer open (the directory's own) fails harmlessly.
        unsafe {
            let flags = libc::fcntl(fd, libc::F_GETFD);
            if flags >= 0 && flags & libc::FD_CLOEXEC == 0 {
                libc::fcntl(fd, libc::F_SETFD, flags | libc::FD_CLOEXEC);
                tracing::debug!(fd, "inherited descriptor kept from agents (close-on-exec)");
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
