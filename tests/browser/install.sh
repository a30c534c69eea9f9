#!/usr/bin/env bash
# Installs what the browser test needs, idempotently: Debian's Chromium and
# its driver (never a browser download of Playwright's own), and Playwright
# for Python, pinned, in a virtualenv under the build cache. Prints the
# virtualenv's python as its last line.
set -euo pipefail

PLAYWRIGHT_VERSION=1.65.2
VENV="${BROWSER_VENV:-${HOME:-/tmp}/.cache/agent-intercom/browser-venv}"

need=()
[ -x /usr/bin/chromium ] || need+=(chromium)
[ -x /usr/bin/chromedriver ] || need+=(chromium-driver)
python3 -c 'import venv, ensurepip' 2>/dev/null || need+=(python3-venv)
if [ ${#need[@]} -gt 0 ]; then
  sudo=""
  [ "$(id -u)" = 0 ] || sudo=sudo
  echo "installing ${need[*]} from Debian's packages" >&2
  $sudo apt-get update -qq >&2
  DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq "${need[@]}" >&2
fi

installed() {
  "$VENV/bin/python" - "$PLAYWRIGHT_VERSION" 2>/dev/null <<'PY'
import importlib.metadata, sys
sys.exit(importlib.metadata.version("playwright") != sys.argv[1])
PY
}
if ! installed; then
  echo "installing playwright==$PLAYWRIGHT_VERSION into $VENV" >&2
  python3 -m venv "$VENV" >&2
  "$VENV/bin/pip" install -q --disable-pip-version-check "playwright==$PLAYWRIGHT_VERSION" >&2
fi
echo "$VENV/bin/python"
