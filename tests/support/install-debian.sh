#!/bin/sh
# Installs the Debian packages named as arguments that are not installed yet, for tests
# that need a tool the machine may lack (libfaketime, iproute2, iptables). The tests run
# it through their support module and are skipped, with this script's message, when it
# cannot install (not root, no apt-get, no package registry).
#
# Usage: install-debian.sh PACKAGE...
# Exit status: 0 when every package is installed; 1 and the reason on stderr.
set -eu

missing=""
for package in "$@"; do
    if ! dpkg-query -W -f='${Status}' "$package" 2>/dev/null | grep -q "install ok installed"; then
        missing="$missing $package"
    fi
done
if [ -z "$missing" ]; then
    exit 0
fi
if ! command -v apt-get >/dev/null 2>&1; then
    echo "${missing# } not installed and there is no apt-get to install it" >&2
    exit 1
fi
if [ "$(id -u)" != 0 ]; then
    echo "${missing# } not installed and only root can install it (apt-get install${missing})" >&2
    exit 1
fi
export DEBIAN_FRONTEND=noninteractive
# one install at a time (pytest's workers may ask at once): apt-get's own lock fails
# rather than waits; flock (util-linux, essential in Debian) waits for the other
if command -v flock >/dev/null 2>&1; then
    exec 9>/tmp/hamq-install-debian.lock
    flock -w 600 9
fi
log=$(mktemp)
# shellcheck disable=SC2086 # (the package names are words)
if ! { apt-get install -y -q --no-install-recommends $missing >"$log" 2>&1 ||
    { apt-get update -q >>"$log" 2>&1 &&
        apt-get install -y -q --no-install-recommends $missing >>"$log" 2>&1; }; }; then
    echo "apt-get install${missing} failed: $(tail -n 3 "$log" | tr '\n' ' ')" >&2
    rm -f "$log"
    exit 1
fi
rm -f "$log"
