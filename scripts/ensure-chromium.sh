#!/usr/bin/env bash
# Make sure Debian's `chromium` is there for the console's browser test
# (tests/e2e/test_console_browser.py drives it headless through playwright,
# with executable_path=/usr/bin/chromium; `playwright install` is never used).
#
#   scripts/ensure-chromium.sh                # what `make test` and .ci/run do first
#
# Installed only when missing and only as root with apt-get. A browser that
# cannot be installed is an error under CI=true (the browser test would fail
# anyway); elsewhere it is a warning and the browser test skips.
set -euo pipefail

CHROMIUM=${CHROMIUM:-/usr/bin/chromium}
if [ -x "$CHROMIUM" ]; then
    exit 0
fi
if [ "$(id -u)" -eq 0 ] && command -v apt-get >/dev/null 2>&1; then
    echo "ensure-chromium: installing Debian's chromium package" >&2
    apt-get update -qq >/dev/null
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium >/dev/null
fi
if [ ! -x "$CHROMIUM" ]; then
    echo "ensure-chromium: $CHROMIUM not found; install it (apt-get install chromium)" >&2
    if [ "${CI:-}" = "true" ]; then
        exit 1
    fi
    echo "ensure-chromium: the console's browser test will be skipped" >&2
fi
