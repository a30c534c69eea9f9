#!/usr/bin/env bash
# Install the pinned real agents / MCP tooling used by the interop tests.
#
#   tests/interop/node_modules   <- package.json + package-lock.json (npm ci)
#       @zed-industries/claude-code-acp, @google/gemini-cli, @github/copilot,
#       @blowmage/cursor-agent-acp, @modelcontextprotocol/inspector
#   tests/interop/.venv          <- requirements.txt (official MCP SDK `mcp`)
#
# Idempotent: a stamp in tests/interop/.install/ records the hash of the
# inputs; when nothing changed the script does nothing. Quiet unless something
# fails (then the captured log is printed). Set INTEROP_FORCE=1 to reinstall.
# Needs: node >= 20 with npm, python3 >= 3.10 with venv; network access to the
# npm registry and PyPI only (no install scripts are run, nothing else is
# downloaded).
set -euo pipefail

HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
cd "$HERE"

PYTHON="${PYTHON:-python3}"
STATE_DIR="$HERE/.install"
STAMP="$STATE_DIR/stamp"
LOG="$STATE_DIR/install.log"
mkdir -p "$STATE_DIR"
: >"$LOG"

die() {
    echo "interop install: $*" >&2
    if [[ -s "$LOG" ]]; then
        echo "---- $LOG ----" >&2
        cat "$LOG" >&2
    fi
    exit 1
}

# run CMD...: run quietly, output to the log; on failure dump the log and exit.
run() {
    echo "+ $*" >>"$LOG"
    if ! "$@" >>"$LOG" 2>&1; then
        die "failed: $*"
    fi
}

command -v node >/dev/null || die "node not found (need node >= 20)"
command -v npm >/dev/null || die "npm not found"
command -v "$PYTHON" >/dev/null || die "$PYTHON not found (need python >= 3.10)"

NODE_MAJOR="$(node -p 'process.versions.node.split(".")[0]')"
((NODE_MAJOR >= 20)) || die "node $(node --version) is too old (need >= 20)"
"$PYTHON" -c 'import sys; sys.exit(sys.version_info < (3, 10))' ||
    die "$PYTHON is too old (need >= 3.10 for mcp)"

inputs_hash() {
    {
        cat package.json requirements.txt
        [[ -f package-lock.json ]] && cat package-lock.json
        node --version
        "$PYTHON" --version 2>&1
    } | sha256sum | cut -d' ' -f1
}

BINS=(
    "node_modules/.bin/claude-code-acp"
    "node_modules/.bin/gemini"
    "node_modules/.bin/mcp-inspector"
    "node_modules/.bin/copilot"
    "node_modules/.bin/cursor-agent-acp"
    ".venv/bin/python"
)

installed_ok() {
    local b
    for b in "${BINS[@]}"; do
        [[ -x "$b" ]] || return 1
    done
    .venv/bin/python -c 'import mcp' 2>/dev/null
}

if [[ "${INTEROP_FORCE:-0}" != 1 && -f "$STAMP" && "$(cat "$STAMP")" == "$(inputs_hash)" ]] &&
    installed_ok; then
    : # up to date
else
    start=$SECONDS
    rm -f "$STAMP"

    # --- npm -------------------------------------------------------------
    # --ignore-scripts: the optional native deps of gemini-cli (keytar,
    # node-pty) would try to download/build binaries; neither is needed for
    # ACP over stdio (gemini falls back to @lydell/node-pty prebuilt / no
    # keychain). @modelcontextprotocol/inspector 1.0.3 declares
    # engines.node >=22.7.5 but its CLI mode works on node 20 (verified), so
    # the engine check is not strict.
    NPM_FLAGS=(--no-audit --no-fund --ignore-scripts --engine-strict=false
        --loglevel=error --no-update-notifier)
    if [[ -f package-lock.json ]]; then
        run npm ci "${NPM_FLAGS[@]}"
    else
        run npm install "${NPM_FLAGS[@]}"
        echo "interop install: created tests/interop/package-lock.json (commit it)" >&2
    fi

    # --- python venv -----------------------------------------------------
    if [[ ! -x .venv/bin/python ]] || ! .venv/bin/python -c 'import sys' 2>/dev/null; then
        rm -rf .venv
        run "$PYTHON" -m venv .venv
    fi
    run .venv/bin/python -m pip install --quiet --disable-pip-version-check \
        --no-input --require-virtualenv -r requirements.txt

    installed_ok || die "install finished but binaries are missing: ${BINS[*]}"
    inputs_hash >"$STAMP"
    echo "interop install: done in $((SECONDS - start))s" >>"$LOG"
fi

# Machine-readable locations for the tests (KEY=absolute path).
cat >"$STATE_DIR/paths.env" <<EOF
CLAUDE_CODE_ACP_BIN=$HERE/node_modules/.bin/claude-code-acp
GEMINI_BIN=$HERE/node_modules/.bin/gemini
COPILOT_BIN=$HERE/node_modules/.bin/copilot
CURSOR_AGENT_ACP_BIN=$HERE/node_modules/.bin/cursor-agent-acp
MCP_INSPECTOR_BIN=$HERE/node_modules/.bin/mcp-inspector
INTEROP_PYTHON=$HERE/.venv/bin/python
EOF

ver() { node -p "require('$HERE/node_modules/$1/package.json').version"; }
echo "interop tools ready:"
echo "  claude-code-acp $(ver @zed-industries/claude-code-acp): $HERE/node_modules/.bin/claude-code-acp"
echo "  gemini          $(ver @google/gemini-cli): $HERE/node_modules/.bin/gemini  (ACP: --acp)"
echo "  copilot         $(ver @github/copilot): $HERE/node_modules/.bin/copilot  (ACP: --acp)"
echo "  cursor-agent-acp $(ver @blowmage/cursor-agent-acp): $HERE/node_modules/.bin/cursor-agent-acp"
echo "  mcp-inspector   $(ver @modelcontextprotocol/inspector): $HERE/node_modules/.bin/mcp-inspector  (--cli)"
echo "  python + mcp    $(.venv/bin/python -c 'import importlib.metadata as m; print(m.version("mcp"))'): $HERE/.venv/bin/python"
