#!/bin/bash
# SPDX-License-Identifier: BSD-3-Clause
# Install what blockport needs to build, test and benchmark on Debian 12.
# Idempotent; needs root (or sudo) for apt-get.
set -euo pipefail
PACKAGES=(
  build-essential cmake pkg-config git
  clang clang-format libclang-rt-14-dev   # fuzzers, formatting
  libcriterion-dev                        # unit tests
  libnbd-dev libnbd-bin python3-libnbd    # NBD client side, nbdinfo/nbdcopy/nbdsh
  libfuse3-dev fuse3
  nbdkit nbdkit-plugin-dev
  zlib1g-dev libzstd-dev libgnutls28-dev
  liburing-dev                            # io_uring for local images (--aio)
  qemu-utils fio util-linux python3       # peers and test tools
  fdisk                                   # sfdisk: partitioned disks for the mount tests
  qemu-system-common                      # qemu-storage-daemon: FUSE export, for contrib/bench/mount-bench.sh
  e2fsprogs                               # mkfs.ext4 on mounted partition files
  qemu-system-x86 busybox-static cpio     # the test guest (contrib/guest/) for vhost
  gnutls-bin                              # psktool, certtool: keys for the TLS tests
  systemd                                 # systemd-socket-activate: socket activation tests
  strace                                  # test-config.sh: --check-config opens images read-only
  bash-completion                         # test-completion.sh: the completion with _filedir too
  groff-base man-db                       # test-man.sh: the pages format without warnings
  librbd-dev librados-dev                 # the rbd: source (headers; librbd1 is loaded on use)
  ceph-mon ceph-osd ceph-common           # contrib/ceph-cluster.sh: a throw-away test cluster
  qemu-block-extra                        # QEMU's rbd driver, the RBD tests' peer
)
missing=()
for p in "${PACKAGES[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
  SUDO=
  if [ "$(id -u)" -ne 0 ]; then SUDO=sudo; fi
  echo "installing: ${missing[*]}"
  $SUDO env DEBIAN_FRONTEND=noninteractive apt-get update -qq
  $SUDO env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${missing[@]}"
fi
# The test guest's kernel (tests/integration/test-vhost-guest.sh), once:
# the tests themselves never download anything.
"$(dirname "$0")/guest/make-guest.sh" --fetch-kernel ||
  echo "install-deps: no guest kernel; test-vhost-guest.sh will be skipped" >&2
