#!/bin/bash
# SPDX-License-Identifier: BSD-3-Clause
# Quick start: install dependencies, build, create a demo image and serve it
# on localhost (the message says how to open it up).
# Usage: contrib/quickstart.sh [PORT]
set -euo pipefail
cd "$(dirname "$0")/.."
PORT=${1:-10809}
contrib/install-deps.sh
cmake -B build -DCMAKE_BUILD_TYPE=RelWithDebInfo >/dev/null
cmake --build build -j"$(nproc)"

DEMO=build/demo.raw
if [ ! -f "$DEMO" ]; then
  # 1 GiB, sparse, with some data at the start and in the middle.
  truncate -s 1G "$DEMO"
  printf 'Hello from blockport!\n' | dd of="$DEMO" conv=notrunc status=none
  head -c 4M /dev/urandom | dd of="$DEMO" bs=1M seek=512 conv=notrunc status=none
fi
cat <<MSG

Serving $DEMO as NBD export "" on localhost port $PORT (and
/tmp/blockport-demo.sock): this machine only.  To let other machines in,
serve it on every address instead, with an allow list or TLS to taste:
  build/blockport serve --port $PORT --allow 192.0.2.0/24 --format raw $DEMO
Connect from another terminal:
  nbdinfo nbd://localhost:$PORT
  nbdinfo --map nbd://localhost:$PORT
  qemu-img info nbd://localhost:$PORT
  qemu-img convert -O qcow2 nbd://localhost:$PORT copy.qcow2
  mkdir -p /tmp/mnt && build/blockport mount nbd://localhost:$PORT /tmp/mnt   # then: ls -l /tmp/mnt
Stop with Ctrl-C.

MSG
exec build/blockport serve --port "$PORT" --bind localhost \
  --unix /tmp/blockport-demo.sock --format raw "$DEMO"
