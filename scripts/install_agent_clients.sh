#!/usr/bin/env bash
# Installs the agent clients the client test tier drives (Codex CLI, Claude Code), at the versions
# pinned in scripts/agent_clients.json, each into its own folder of the cache:
# ${KEEPER_AGENT_CLIENTS:-~/.cache/keeper-middleware/agent-clients}/NAME-VERSION/node_modules/.bin/BIN
#
# Usage: scripts/install_agent_clients.sh
#
# Why at install time and not in a test fixture: the tests run with no network (pytest-socket
# guards the test process, and a client's own downloads would be network at run time); the npm
# registry is reached here, once per version, like pip in `make setup`. Both packages ship a native
# binary as an optional platform package (about 400 MB each), so the cache is kept outside the
# worktree and shared by every checkout. Idempotent: a client whose binary already reports the
# pinned version is not fetched again. Without node/npm it says so and installs nothing (the tier
# then skips, naming the reason).
set -euo pipefail

PINS="$(dirname "$0")/agent_clients.json"
CACHE="${KEEPER_AGENT_CLIENTS:-$HOME/.cache/keeper-middleware/agent-clients}"

if ! command -v npm >/dev/null 2>&1 || ! command -v node >/dev/null 2>&1; then
    echo "install_agent_clients: node/npm not found; the agent client tests will be skipped" >&2
    exit 0
fi

python3 - "$PINS" <<'PY' | while read -r name package version bin; do
import json, sys
for name, pin in json.load(open(sys.argv[1])).items():
    print(name, pin["package"], pin["version"], pin["bin"])
PY
    folder="$CACHE/$name-$version"
    binary="$folder/node_modules/.bin/$bin"
    if [[ -x "$binary" ]] && "$binary" --version 2>/dev/null | grep -qF "$version"; then
        echo "install_agent_clients: $package@$version already in $folder"
        continue
    fi
    mkdir -p "$folder"
    echo "install_agent_clients: npm install $package@$version into $folder"
    npm install --prefix "$folder" --no-audit --no-fund --no-save --loglevel=error "$package@$version"
    if ! "$binary" --version 2>/dev/null | grep -qF "$version"; then
        echo "install_agent_clients: $binary does not report $version after the install" >&2
        exit 1
    fi
done
