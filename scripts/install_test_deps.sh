#!/usr/bin/env bash
# The system packages the tests need, from Debian's archive, when missing: `postgresql` (its server
# binaries: tests/test_postgres.py starts its own server on 127.0.0.1 in a temporary folder; nothing
# is configured system-wide) and `chromium` (tests/test_ui.py drives it headless through Playwright,
# which never downloads a browser of its own). As root, else through passwordless sudo; a no-op
# when both are there.
set -euo pipefail
have_postgres() { ls /usr/lib/postgresql/*/bin/initdb >/dev/null 2>&1 || command -v initdb >/dev/null 2>&1; }
have_chromium() { [ -x /usr/bin/chromium ]; }
missing=()
have_postgres || missing+=(postgresql)
have_chromium || missing+=(chromium)
[ ${#missing[@]} -eq 0 ] && exit 0
if [ "$(id -u)" = 0 ]; then
  SUDO=()
elif command -v sudo >/dev/null 2>&1 && sudo -n true 2>/dev/null; then
  SUDO=(sudo -n)
else
  echo "error: the tests need the apt package(s) ${missing[*]}; install them as root: apt-get install -y ${missing[*]}" >&2
  exit 1
fi
export DEBIAN_FRONTEND=noninteractive
"${SUDO[@]}" apt-get update -qq
"${SUDO[@]}" apt-get install -y -qq "${missing[@]}" > /dev/null
have_postgres || { echo "error: apt-get installed postgresql but no initdb is found under /usr/lib/postgresql/*/bin" >&2; exit 1; }
have_chromium || { echo "error: apt-get installed chromium but /usr/bin/chromium is missing" >&2; exit 1; }
