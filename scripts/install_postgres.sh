#!/usr/bin/env bash
# Debian's PostgreSQL server binaries, for tests/test_postgres.py, which starts its own server on
# 127.0.0.1 in a temporary folder (nothing is configured system-wide). Installs the apt package
# `postgresql` unless an initdb is already there; as root, else through passwordless sudo.
set -euo pipefail
found() { ls /usr/lib/postgresql/*/bin/initdb >/dev/null 2>&1 || command -v initdb >/dev/null 2>&1; }
found && exit 0
if [ "$(id -u)" = 0 ]; then
  SUDO=()
elif command -v sudo >/dev/null 2>&1 && sudo -n true 2>/dev/null; then
  SUDO=(sudo -n)
else
  echo "error: PostgreSQL (apt package postgresql) is needed by the tests; install it as root: apt-get install -y postgresql" >&2
  exit 1
fi
export DEBIAN_FRONTEND=noninteractive
"${SUDO[@]}" apt-get update -qq
"${SUDO[@]}" apt-get install -y -qq postgresql > /dev/null
found || { echo "error: apt-get installed postgresql but no initdb is found under /usr/lib/postgresql/*/bin" >&2; exit 1; }
