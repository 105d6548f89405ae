#!/bin/bash
# SPDX-License-Identifier: BSD-3-Clause
# The optional parts (CMakeLists.txt BLOCKPORT_RBD, _FUSE, _VHOST,
# _PLUGINS, _TLS, _IO_URING; core/features.h): `blockport --version` lists
# each part once, as built with or without; what needs a part left out
# fails with exit 1 and "built without NAME", and what needs a part built
# in does not say so.  Run in the default build and in a minimal one
# (contrib/build-matrix.sh minimal) it covers both sides.
source "$(dirname "$0")/lib.sh"
cd "$T"

check "--version: the version, then every part once"
"$BLOCKPORT" --version >version.txt || fail "--version: exit $?"
grep -qE '^blockport [0-9]+\.[0-9]+\.[0-9]+$' <(sed -n 1p version.txt) ||
    { cat version.txt; fail "the first line is not 'blockport VERSION'"; }
listed=$(sed -n 's/^built with\(out\)\{0,1\}: //p' version.txt | tr ' ' '\n' | sort)
[[ $listed == "$(printf '%s\n' fuse io_uring plugins rbd tls vhost)" ]] ||
    { cat version.txt; fail "--version does not list each part once"; }
((($(wc -l <version.txt)) <= 3)) || { cat version.txt; fail "more than three lines"; }
ok "$(sed -n 2,3p version.txt | tr '\n' ';')"

# expect PART NAME CMD...: with PART left out, CMD exits 1 saying "built
# without NAME"; with PART in, it does not say so.
expect() {
    local part=$1 name=$2 rc=0
    shift 2
    timeout -s KILL 20 "$BLOCKPORT" "$@" </dev/null >out.txt 2>err.txt || rc=$?
    if has_feature "$part"; then
        ! grep -q "built without" err.txt ||
            { cat err.txt; fail "$*: built with $part, yet says built without"; }
    else
        [[ $rc -eq 1 ]] && grep -q "built without $name\$" err.txt ||
            { cat err.txt; fail "$*: exit $rc, expected 1 and 'built without $name'"; }
    fi
}

check "each part's commands and options, in or out"
printf '[export a]\npath = null:1M\naio = io_uring\n' >aio.conf
psktool -u alice -p keys.psk >/dev/null 2>&1 || echo "alice:0123456789abcdef" >keys.psk
expect fuse FUSE mount --help
expect vhost vhost-user vhost --help
expect io_uring io_uring serve --check-config --aio io_uring null:1M
expect io_uring io_uring serve --check-config --config aio.conf
expect tls TLS serve --check-config --tls on --tls-psk keys.psk null:1M
expect plugins "nbdkit plugins" serve --check-config --plugin memory size=1M
if ! has_feature rbd; then
    # With RBD in, these would reach for a cluster: the RBD tests do.
    expect rbd RBD info rbd:pool/image
    expect rbd RBD create -f raw rbd:pool/image 1M
fi
ok "in: $(sed -n 's/^built with: //p' version.txt); out: $(sed -n 's/^built without: //p' version.txt)"
