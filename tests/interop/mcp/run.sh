#!/usr/bin/env bash
# MCP interop: real MCP clients against the real server binary.
#
# Starts `agent-intercom serve --config <tmp config>` (one workspace `ws`, no
# agents, no Slack) with a known operator token, then:
#   - the MCP Inspector CLI (pinned in ../package.json) lists the tools and
#     calls auto_check over streamable HTTP;
#   - client.py, with the official Python SDK `mcp` (pinned in
#     ../requirements.txt), runs a blocking check_clearance that the operator
#     approves through POST /api/approvals/{id}, applies it with check_diff,
#     and gets steering (POST /api/sessions/{id}/prompt) back from ping.
# Tools come from ../install.sh (idempotent). Exit 0 = pass; on failure the
# server log is printed.
set -euo pipefail

HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
INTEROP="$(cd "$HERE/.." && pwd)"
REPO="$(cd "$INTEROP/../.." && pwd)"

"$INTEROP/install.sh" >/dev/null
# shellcheck source=/dev/null
source "$INTEROP/.install/paths.env"

TARGET_DIR="${CARGO_TARGET_DIR:-$REPO/target}"
(cd "$REPO" && cargo build --quiet --bin agent-intercom)
BIN="$TARGET_DIR/debug/agent-intercom"
[[ -x "$BIN" ]] || {
    echo "mcp interop: $BIN was not built" >&2
    exit 1
}

TMP="$(mktemp -d)"
SERVER_PID=""
cleanup() {
    if [[ -n "$SERVER_PID" ]] && kill -0 "$SERVER_PID" 2>/dev/null; then
        kill -TERM "$SERVER_PID" 2>/dev/null || true
        for _ in $(seq 50); do
            kill -0 "$SERVER_PID" 2>/dev/null || break
            sleep 0.1
        done
        kill -KILL "$SERVER_PID" 2>/dev/null || true
    fi
    rm -rf "$TMP"
}
trap cleanup EXIT

fail() {
    echo "mcp interop: FAIL: $*" >&2
    if [[ -s "$TMP/server.log" ]]; then
        echo "---- server log (last 60 lines) ----" >&2
        tail -n 60 "$TMP/server.log" >&2
    fi
    exit 1
}

py() { "$INTEROP_PYTHON" - "$@"; }

PORT="$(py <<'EOF'
import socket
s = socket.socket()
s.bind(("127.0.0.1", 0))
print(s.getsockname()[1])
EOF
)"
TOKEN="$(py <<'EOF'
import secrets
print(secrets.token_hex(16))
EOF
)"
BASE="http://127.0.0.1:$PORT"
URL="$BASE/mcp?workspace_id=ws"

mkdir -p "$TMP/ws"
cat >"$TMP/config.toml" <<EOF
workspace_root = "."

[server]
bind = "127.0.0.1:$PORT"

[database]
path = "data/agent-intercom.db"

[[workspace]]
id = "ws"
path = "ws"
channel_id = ""
label = "MCP interop"
EOF

(cd "$TMP" && exec env -u SLACK_BOT_TOKEN -u SLACK_APP_TOKEN AGENT_INTERCOM_TOKEN="$TOKEN" \
    "$BIN" serve --config "$TMP/config.toml" >"$TMP/server.log" 2>&1) &
SERVER_PID=$!

# Wait for /healthz.
py "$BASE/healthz" "$SERVER_PID" <<'EOF' || fail "the server did not come up"
import os, sys, time, urllib.request
url, pid = sys.argv[1], int(sys.argv[2])
deadline = time.monotonic() + 30
while time.monotonic() < deadline:
    try:
        os.kill(pid, 0)
    except OSError:
        sys.exit(1)
    try:
        with urllib.request.urlopen(url, timeout=2):
            sys.exit(0)
    except Exception:
        time.sleep(0.2)
sys.exit(1)
EOF

# Is /mcp mounted, and does it want a credential? (Without one: 401; with
# the operator token an initialize without a session must not be a 404.)
probe() {
    py "$BASE/mcp" "$1" <<'EOF'
import sys, urllib.request, urllib.error
body = b'{"jsonrpc":"2.0","id":1,"method":"initialize","params":{"protocolVersion":"2025-06-18","capabilities":{},"clientInfo":{"name":"probe","version":"0"}}}'
headers = {"Content-Type": "application/json", "Accept": "application/json, text/event-stream"}
if sys.argv[2]:
    headers["Authorization"] = "Bearer " + sys.argv[2]
req = urllib.request.Request(sys.argv[1], data=body, method="POST", headers=headers)
try:
    with urllib.request.urlopen(req, timeout=5) as r:
        print(r.status)
except urllib.error.HTTPError as e:
    print(e.code)
EOF
}
STATUS="$(probe "")"
[[ "$STATUS" == 401 ]] || fail "POST /mcp without a token answered HTTP $STATUS, expected 401"
STATUS="$(probe "$TOKEN")"
[[ "$STATUS" == 200 ]] || fail "POST /mcp answered HTTP $STATUS (is the MCP router mounted on the server?)"
echo "ok: /mcp refuses a request without a token and serves one with it"

# MCP Inspector CLI.
inspector() {
    "$MCP_INSPECTOR_BIN" --cli "$URL" --header "Authorization: Bearer $TOKEN" --transport http "$@" 2>"$TMP/inspector.err" ||
        fail "mcp-inspector $*: $(tail -n 20 "$TMP/inspector.err")"
}
LISTED="$(inspector --method tools/list)"
for tool in check_clearance check_diff auto_check transmit standby ping broadcast reboot; do
    grep -q "\"$tool\"" <<<"$LISTED" || fail "mcp-inspector tools/list lacks $tool: $LISTED"
done
echo "ok: mcp-inspector tools/list has all eight tools"
CALLED="$(inspector --method tools/call --tool-name auto_check --tool-arg tool_name=ls)"
grep -q 'auto_approved' <<<"$CALLED" || fail "mcp-inspector auto_check gave: $CALLED"
echo "ok: mcp-inspector tools/call auto_check"

# The official Python SDK, with the operator API.
"$INTEROP_PYTHON" "$HERE/client.py" --url "$URL" --api "$BASE" --token "$TOKEN" \
    --workspace "$TMP/ws" || fail "python mcp client"

echo "mcp interop: PASS"
