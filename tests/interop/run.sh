#!/usr/bin/env bash
# Interop step: real third-party peers at pinned versions.
#  1. install claude-code-acp, gemini-cli, the MCP Inspector CLI and the
#     official Python MCP SDK (install.sh; idempotent)
#  2. run the server core against the real ACP agents (handshake, auth errors,
#     process-group cleanup), Claude Code through whole turns against a fake
#     Anthropic Messages API on loopback (actors/tests/interop_claude.rs), and
#     Gemini CLI through whole turns against a fake Gemini API
#     (actors/tests/interop_gemini.rs)
#  3. the MCP interop (mcp/run.sh) against the real server binary
set -euo pipefail
HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
ROOT="$(cd "$HERE/../.." && pwd)"
cd "$ROOT"

"$HERE/install.sh"

echo "-- real ACP agents"
cargo test -p intercom-actors --test interop_agents -- --ignored --test-threads=1

echo "-- Claude Code whole turns against the fake Anthropic API"
cargo test -p intercom-actors --test interop_claude -- --ignored --test-threads=1

echo "-- Gemini CLI whole turns against the fake Gemini API"
if [ -x "$HERE/node_modules/.bin/gemini" ]; then
  cargo test -p intercom-actors --test interop_gemini -- --ignored --test-threads=1
else
  echo "SKIPPED: @google/gemini-cli (pinned in tests/interop/package.json) is not installed in tests/interop/node_modules"
fi

if [ -x "$HERE/mcp/run.sh" ]; then
  echo "-- MCP clients"
  "$HERE/mcp/run.sh"
fi
