//! Agent commands that cannot be started, said before the first session.
//!
//! A profile whose `command` does not exist (or is not on `PATH`) loads
//! fine, and starting a session with it already fails clearly; this check
//! makes `check-config` and `serve` say so up front, naming the profile. It
//! looks the command up the way `exec` will (a path with a separator as
//! given, a bare name on the server's `PATH`), so it only warns: the file
//! may be installed later.

use std::path::Path;

use intercom_actors::settings::AgentProfile;

/// One warning per profile whose command cannot be found.
pub fn agent_command_warnings(agents: &[AgentProfile]) -> Vec<String> {
    let path = std::env::var_os("PATH").unwrap_or_default();
    agents
        .iter()
        .filter_map(|a| command_problem(&a.command, &path).map(|p| (a, p)))
        .map(|(a, problem)| {
            format!(
                "agent profile `{}`: command `{}` {problem}; sessions with it will fail to start until it is installed or `command` is fixed",
                a.id, a.command
            )
        })
        .collect()
}

/// Why `command` cannot be executed, or `None` when it can be found.
fn command_problem(command: &str, path: &std::ffi::OsStr) -> Option<&'static str> {
    if command.contains('/') {
        return (!is_executable(Path::new(command)))
            .then_some("does not exist or is not executable");
    }
    let found = std::env::split_paths(path).any(|dir| is_executable(&dir.join(command)));
    (!found).then_some("was not found on PATH")
}

fn is_executable(path: &Path) -> bool {
    use std::os::unix::fs::PermissionsExt;
    std::fs::metadata(path).is_ok_and(|m| m.is_file() && m.permissions().mode() & 0o111 != 0)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn profile(id: &str, command: &str) -> AgentProfile {
        AgentProfile {
            id: id.into(),
            command: command.into(),
            args: vec![],
            env: vec![],
            protocol: Default::default(),
            framing: Default::default(),
            auth_method: None,
        }
    }

    #[test]
    fn missing_commands_are_named_with_their_profile() {
        let warnings = agent_command_warnings(&[
            profile("shell", "sh"),
            profile("ghost", "no-such-agent-binary-xyz"),
            profile("gone", "/nonexistent/dir/agent"),
        ]);
        assert_eq!(warnings.len(), 2, "{warnings:?}");
        assert!(warnings[0].contains("`ghost`") && warnings[0].contains("not found on PATH"));
        assert!(warnings[1].contains("`gone`") && warnings[1].contains("does not exist"));
    }

    #[test]
    fn a_directory_or_a_plain_file_is_not_a_command() {
        let dir = tempfile::tempdir().expect("tempdir");
        let file = dir.path().join("agent");
        std::fs::write(&file, "not executable").expect("write");
        let path = dir.path().as_os_str();
        assert!(command_problem("agent", path).is_some());
        assert!(command_problem(&dir.path().display().to_string(), path).is_some());
    }
}
