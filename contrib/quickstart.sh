#!/bin/bash
# SPDX-License-Identifier: BSD-3-Clause
# Quick start: install what building and serving need (not the test
# tools: contrib/install-deps.sh --tests), build, create a demo image and serve it
# on 127.0.0.1 only (the message says how to open it up).
# Usage: contrib/quickstart.sh [PORT]
set -euo pipefail
cd "$(dirname "$0")/.."
PORT=${1:-10809}
# Per user: on a shared machine another user's quick start may run too.
RUNDIR=${XDG_RUNTIME_DIR:-/tmp}
SOCK=$RUNDIR/blockport-demo-$(id -u).sock
MNT=${TMPDIR:-/tmp}/blockport-mnt-$(id -u)
contrib/install-deps.sh
# The unit tests need criterion, which only the test set installs.
cmake -B build -DCMAKE_BUILD_TYPE=RelWithDebInfo -DBLOCKPORT_TESTS=OFF >/dev/null
cmake --build build -j"$(nproc)"

DEMO=build/demo.raw
if [ ! -f "$DEMO" ]; then
  # 1 GiB, sparse, with some data at the start and in the middle.
  truncate -s 1G "$DEMO"
  printf 'Hello from blockport!\n' | dd of="$DEMO" conv=notrunc status=none
  head -c 4M /dev/urandom | dd of="$DEMO" bs=1M seek=512 conv=notrunc status=none
fi
cat <<MSG

Serving $DEMO as NBD export "" on 127.0.0.1 port $PORT (and the Unix
socket $SOCK): this machine only.  To let other
machines in, serve it on every address (no --bind; or --bind one of this
machine's addresses), with an allow list, TLS or both, for example:
  build/blockport serve --port $PORT --allow 192.0.2.0/24 --format raw $DEMO
Connect from another terminal:
  nbdinfo nbd://127.0.0.1:$PORT
  nbdinfo --map nbd://127.0.0.1:$PORT
  qemu-img info nbd://127.0.0.1:$PORT
  qemu-img convert -O qcow2 nbd://127.0.0.1:$PORT copy.qcow2
  mkdir -p $MNT && build/blockport mount nbd://127.0.0.1:$PORT $MNT   # then: ls -l $MNT
  fusermount3 -u $MNT   # unmount it again, before stopping the server
Stop with Ctrl-C.

MSG
# 127.0.0.1, not localhost: a name binds every address it resolves to,
# which may include more than the loopback (tests/integration/test-docs.sh).
exec build/blockport serve --port "$PORT" --bind 127.0.0.1 \
  --unix "$SOCK" --format raw "$DEMO"
