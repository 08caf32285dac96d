#!/bin/sh
# Installs Debian's libfaketime (the LD_PRELOAD library that shifts a process's clock)
# when it is missing, and prints the library's path on stdout. The clock test
# (tests/test_clocks_process.py) runs it through tests/support/faketime.py and is
# skipped, with this script's message, when it cannot install (not root, no apt-get,
# no package registry).
#
# Exit status: 0 and the path on stdout; 1 and the reason on stderr.
set -eu

find_library() {
    for path in /usr/lib/*/faketime/libfaketime.so.1 /usr/lib/faketime/libfaketime.so.1; do
        if [ -f "$path" ]; then
            echo "$path"
            return 0
        fi
    done
    return 1
}

if find_library; then
    exit 0
fi
if ! command -v apt-get >/dev/null 2>&1; then
    echo "libfaketime is not installed and there is no apt-get to install it" >&2
    exit 1
fi
if [ "$(id -u)" != 0 ]; then
    echo "libfaketime is not installed and only root can install it (apt-get install libfaketime)" >&2
    exit 1
fi
export DEBIAN_FRONTEND=noninteractive
log=$(mktemp)
if ! { apt-get install -y -q --no-install-recommends libfaketime >"$log" 2>&1 ||
    { apt-get update -q >>"$log" 2>&1 &&
        apt-get install -y -q --no-install-recommends libfaketime >>"$log" 2>&1; }; }; then
    echo "apt-get install libfaketime failed: $(tail -n 3 "$log" | tr '\n' ' ')" >&2
    rm -f "$log"
    exit 1
fi
rm -f "$log"
if ! find_library; then
    echo "apt-get installed libfaketime but libfaketime.so.1 is not where Debian puts it" >&2
    exit 1
fi
