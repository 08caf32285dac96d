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
sh "$(dirname "$0")/install-debian.sh" libfaketime
if ! find_library; then
    echo "apt-get installed libfaketime but libfaketime.so.1 is not where Debian puts it" >&2
    exit 1
fi
