//! `auto_check`'s request facts: the action an MCP client describes,
//! judged by the same rules as an ACP agent's permission request.

use super::*;

/// What `auto_check` knows about the action, as rule facts. `kind` accepts
/// ACP tool kinds and the older names (`terminal_command` = execute,
/// `file_operation` = edit); `context` may carry `path`/`file_path`/`paths`
/// and `command`.
pub(super) fn auto_check_facts(
    args: &Args,
    t: &Target,
    server_files: &intercom_actors::workspace_fs::ServerFiles,
) -> Result<intercom_actors::rules::RequestFacts, Fail> {
    use intercom_actors::rules::RULE_KINDS;
    let tool = args.str_or("tool_name", "").trim().to_owned();
    // A kind no rule knows would skip every rule that names a kind (a deny
    // on `execute` among them), which looks like "not denied".
    let kind = match args.str("kind").map(str::trim) {
        Some("terminal_command" | "command" | "shell") => Some("execute".to_owned()),
        Some("file_operation" | "file_write" | "write") => Some("edit".to_owned()),
        Some(k) if RULE_KINDS.contains(&k) => Some(k.to_owned()),
        Some(k) if !k.is_empty() => {
            return Err(Fail::Params(format!(
                "argument `kind`: {k:?} is not a kind of action; use one of {}, or terminal_command / file_operation",
                RULE_KINDS.join(", ")
            )));
        }
        _ => None,
    };
    let context = match args.value("context") {
        None | Some(serde_json::Value::Null) => serde_json::Value::Null,
        Some(c @ serde_json::Value::Object(_)) => c.clone(),
        Some(_) => {
            return Err(Fail::Params(
                "argument `context`: an object such as {\"path\": \"src/x.rs\"} or {\"command\": \"cargo test\"}"
                    .to_owned(),
            ));
        }
    };
    let mut paths: Vec<String> = ["path", "file_path"]
        .iter()
        .filter_map(|k| {
            context
                .get(*k)
                .and_then(serde_json::Value::as_str)
                .map(str::to_owned)
        })
        .collect();
    if let Some(list) = context.get("paths").and_then(serde_json::Value::as_array) {
        paths.extend(
            list.iter()
                .filter_map(serde_json::Value::as_str)
                .map(str::to_owned),
        );
    }
    let command = context
        .get("command")
        .and_then(serde_json::Value::as_str)
        .map(str::to_owned)
        .or_else(|| (kind.as_deref() == Some("execute")).then(|| tool.clone()));
    // Each path is resolved on the filesystem: past a bound, the answer is
    // "ask" (as for a path outside), without resolving any.
    let too_many = paths.len() > intercom_actors::rules::MAX_REQUEST_PATHS;
    let judged = match &t.cwd {
        _ if too_many => intercom_actors::fsjail::Judged::default(),
        Some(cwd) => {
            let guard = server_files.checker();
            intercom_actors::fsjail::judge_paths(cwd, &paths, |p| guard.covers(p))
        }
        None => intercom_actors::fsjail::Judged {
            relative: paths.clone(),
            ..Default::default()
        },
    };
    let named = match (&command, &t.cwd) {
        (Some(c), Some(cwd)) => server_files.checker().named_in_command(c, cwd),
        _ => false,
    };
    Ok(intercom_actors::rules::RequestFacts {
        kind,
        paths: judged.relative,
        paths_inside: judged.inside,
        server_file: judged.server_file || named,
        command,
        agent: "mcp".to_owned(),
        workspace: t.workspace.clone(),
        session: t.id.clone(),
        root: t.cwd.clone(),
        written: paths,
    })
}
