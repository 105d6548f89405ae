#!/bin/bash
# SPDX-License-Identifier: BSD-3-Clause
# Install what blockport needs on Debian 12: to build it and serve images
# (the default; contrib/quickstart.sh), or with --tests also what the test
# suite, the fuzzers, the build matrix and the benchmarks use
# (contrib/run-tests.sh, CI).  Idempotent; apt-get runs as root, through
# sudo when not run as root.
#
#   contrib/install-deps.sh [--tests] [--check]
#
# --check installs nothing: it lists the missing packages and exits 1 when
# there are any (contrib/run-tests.sh asks so before it starts).
set -euo pipefail
# Building and serving: the compiler, the libraries' headers, and the
# client the quick start prints (nbdinfo).
BUILD_PACKAGES=(
  build-essential cmake pkg-config
  libnbd-dev libnbd-bin                   # nbd:// sources; nbdinfo to connect
  libfuse3-dev fuse3                      # blockport mount
  nbdkit-plugin-dev                       # the plugin host's API
  zlib1g-dev libzstd-dev libgnutls28-dev
  liburing-dev                            # io_uring for local images (--aio)
  librbd-dev librados-dev                 # the rbd: source (headers; librbd1 is loaded on use)
)
TEST_PACKAGES=(
  git clang clang-format libclang-rt-14-dev # fuzzers, formatting, the build matrix
  libcriterion-dev                        # unit tests
  python3-libnbd nbdkit                   # nbdsh/nbdcopy peers, the plugin tests
  qemu-utils fio util-linux python3       # peers and test tools
  fdisk                                   # sfdisk: partitioned disks for the mount tests
  qemu-system-common                      # qemu-storage-daemon: FUSE export, for contrib/bench/mount-bench.sh
  e2fsprogs                               # mkfs.ext4 on mounted partition files
  qemu-system-x86 busybox-static cpio     # the test guest (contrib/guest/) for vhost
  gnutls-bin                              # psktool, certtool: keys for the TLS tests
  systemd                                 # systemd-socket-activate: socket activation tests
  strace                                  # test-config.sh: --check-config opens images read-only
  lintian                                 # package-check.sh: the .deb has no errors or warnings
  bash-completion                         # test-completion.sh: the completion with _filedir too
  groff-base man-db                       # test-man.sh: the pages format without warnings
  ceph-mon ceph-osd ceph-common           # contrib/ceph-cluster.sh: a throw-away test cluster
  qemu-block-extra                        # QEMU's rbd driver, the RBD tests' peer
)
tests=0 check=0
for arg in "$@"; do
  case $arg in
  --tests) tests=1 ;;
  --check) check=1 ;;
  *)
    echo "usage: contrib/install-deps.sh [--tests] [--check]" >&2
    exit 2
    ;;
  esac
done
packages=("${BUILD_PACKAGES[@]}")
if [ $tests -eq 1 ]; then packages+=("${TEST_PACKAGES[@]}"); fi

missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "ok installed" || missing+=("$p")
done
if [ $check -eq 1 ]; then
  if [ ${#missing[@]} -gt 0 ]; then echo "${missing[*]}"; exit 1; fi
  exit 0
fi
if [ ${#missing[@]} -gt 0 ]; then
  SUDO=
  if [ "$(id -u)" -ne 0 ]; then
    if ! command -v sudo >/dev/null; then
      echo "install-deps: not root and no sudo; as root, run: apt-get install ${missing[*]}" >&2
      exit 1
    fi
    SUDO=sudo
  fi
  echo "installing: ${missing[*]}"
  $SUDO env DEBIAN_FRONTEND=noninteractive apt-get update -qq
  $SUDO env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${missing[@]}"
fi
# The test guest's kernel (tests/integration/test-vhost-guest.sh), once:
# the tests themselves never download anything.
if [ $tests -eq 1 ]; then
  "$(dirname "$0")/guest/make-guest.sh" --fetch-kernel ||
    echo "install-deps: no guest kernel; test-vhost-guest.sh will be skipped" >&2
fi
