//! `scripted-agent`: a deterministic fake coding agent for end-to-end tests.
//!
//! This file exists to parse the command line, load the scenario (or the
//! built-in demo), wire up stdin/stdout and hand control to the selected
//! dialect. Usage:
//!
//! ```text
//! scripted-agent [--scenario PATH] [--protocol acp|intercom] [--framing ndjson|lsp]
//! ```
//!
//! Flags override the scenario's `protocol` / `framing`. Diagnostics go to
//! stderr; configuration errors exit with code 2.

mod acp;
mod agent;
mod intercom;
mod scenario;
mod steps;
mod wire;

use std::path::PathBuf;

use agent::{Agent, Phase};
use scenario::{Framing, Protocol, Scenario};

const USAGE: &str =
    "usage: scripted-agent [--scenario PATH] [--protocol acp|intercom] [--framing ndjson|lsp]
  A deterministic ACP (or intercom dialect) agent for tests and demos. Without
  --scenario it plays the built-in demo (asks to write hello.txt, then writes it).
  The scenario format (turns of steps such as chunk, tool_call, permission,
  if_allowed, write_file, exit) is described in docs/testing.md.";

/// Parsed command line.
#[derive(Debug, Default, PartialEq)]
struct Options {
    scenario: Option<PathBuf>,
    protocol: Option<Protocol>,
    framing: Option<Framing>,
}

fn main() {
    let options = parse_args(std::env::args().skip(1)).unwrap_or_else(|e| fail(&e));
    let mut scenario = match &options.scenario {
        Some(path) => Scenario::load(path).unwrap_or_else(|e| fail(&e)),
        None => Scenario::demo(),
    };
    scenario.protocol = options.protocol.unwrap_or(scenario.protocol);
    scenario.framing = options.framing.unwrap_or(scenario.framing);
    run(scenario);
}

fn run(scenario: Scenario) -> ! {
    let protocol = scenario.protocol;
    let writer = wire::Writer::new(scenario.framing);
    let inbox = wire::spawn_reader(scenario.framing);
    let on_start = scenario.on_start.clone();
    let mut agent = Agent::new(scenario, protocol, writer, inbox);
    agent.phase = Phase::Start;
    steps::run(&mut agent, &on_start);
    match protocol {
        Protocol::Acp => acp::run(&mut agent),
        Protocol::Intercom => intercom::run(&mut agent),
    }
}

fn fail(message: &str) -> ! {
    eprintln!("scripted-agent: {message}");
    std::process::exit(2)
}

fn parse_args(args: impl IntoIterator<Item = String>) -> Result<Options, String> {
    let mut options = Options::default();
    let mut args = args.into_iter();
    while let Some(arg) = args.next() {
        let (flag, inline) = match arg.split_once('=') {
            Some((flag, value)) => (flag.to_owned(), Some(value.to_owned())),
            None => (arg, None),
        };
        if flag == "--help" || flag == "-h" {
            println!("{USAGE}");
            std::process::exit(0);
        }
        let value = inline
            .or_else(|| args.next())
            .ok_or_else(|| format!("{flag} needs a value\n{USAGE}"))?;
        apply_flag(&mut options, &flag, &value)?;
    }
    Ok(options)
}

fn apply_flag(options: &mut Options, flag: &str, value: &str) -> Result<(), String> {
    match flag {
        "--scenario" => options.scenario = Some(PathBuf::from(value)),
        "--protocol" => options.protocol = Some(parse_protocol(value)?),
        "--framing" => options.framing = Some(parse_framing(value)?),
        _ => return Err(format!("unknown argument {flag}\n{USAGE}")),
    }
    Ok(())
}

fn parse_protocol(value: &str) -> Result<Protocol, String> {
    match value {
        "acp" => Ok(Protocol::Acp),
        "intercom" => Ok(Protocol::Intercom),
        _ => Err(format!("--protocol must be acp or intercom, not {value:?}")),
    }
}

fn parse_framing(value: &str) -> Result<Framing, String> {
    match value {
        "ndjson" => Ok(Framing::Ndjson),
        "lsp" => Ok(Framing::Lsp),
        _ => Err(format!("--framing must be ndjson or lsp, not {value:?}")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(args: &[&str]) -> Result<Options, String> {
        parse_args(args.iter().map(|s| (*s).to_owned()))
    }

    #[test]
    fn parses_all_flags_in_both_forms() {
        let o = parse(&[
            "--scenario",
            "s.json",
            "--protocol=intercom",
            "--framing",
            "lsp",
        ])
        .unwrap();
        assert_eq!(o.scenario, Some(PathBuf::from("s.json")));
        assert_eq!(o.protocol, Some(Protocol::Intercom));
        assert_eq!(o.framing, Some(Framing::Lsp));
    }

    #[test]
    fn rejects_bad_input() {
        assert!(parse(&["--protocol", "mcp"]).is_err());
        assert!(parse(&["--framing"]).is_err());
        assert!(parse(&["--bogus", "x"]).is_err());
    }
}
