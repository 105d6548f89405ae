#!/bin/bash
# SPDX-License-Identifier: BSD-3-Clause
# A shared writable mmap of the mounted disk (issue 18): in the default
# mode and each --cache mode a program maps the disk file MAP_SHARED with
# PROT_WRITE, writes a pattern, msyncs and unmaps; reads through the mount
# (direct and cached) see it, a direct write afterwards shows in a new
# mapping, and the image holds it after the unmount (qemu-img compare).
# --cache none keeps direct I/O and sets FUSE_DIRECT_IO_ALLOW_MMAP in the
# INIT reply (frontend/fuse-flags.c): without it the kernel refuses the
# mapping with ENODEV.
source "$(dirname "$0")/lib.sh"
require_feature fuse
require fusermount3 qemu-img python3
[[ -c /dev/fuse ]] || skip "no /dev/fuse"
[[ $(id -u) -eq 0 ]] || skip "needs root"
cd "$T"

MNT=$T/mnt
mkdir -p "$MNT"
is_mounted() { awk -v m="$1" '$2 == m {f = 1} END {exit !f}' /proc/self/mounts; }
trap 'rc=$?; set +e; is_mounted "$MNT" && fusermount3 -u -z "$MNT"; (exit $rc); _cleanup' EXIT

# The kernel learnt FUSE_DIRECT_IO_ALLOW_MMAP in 6.6.
kernel_allows() {
  local v=$(uname -r) maj min
  maj=${v%%.*} min=${v#*.} min=${min%%.*}
  ((maj > 6 || (maj == 6 && min >= 6)))
}

# mm.py FILE OFF LEN SEED: map [OFF, OFF+LEN) shared and writable, fill it
# with pattern SEED, msync, munmap; check direct and cached reads of the
# range, then a direct write of its first 4 KiB and a fresh mapping that
# sees that write.  Prints "ok", or "ENODEV" when the mapping is refused.
cat >mm.py <<'PY'
import errno, mmap, os, random, sys
path, off, n, seed = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
pat = random.Random(seed).randbytes(n)
fd = os.open(path, os.O_RDWR)
try:
    m = mmap.mmap(fd, n, mmap.MAP_SHARED, mmap.PROT_READ | mmap.PROT_WRITE, offset=off)
except OSError as e:
    print(errno.errorcode.get(e.errno, str(e.errno)))
    sys.exit(0)
m[:] = pat
m.flush()  # msync(MS_SYNC)
m.close()
buf = mmap.mmap(-1, n)
dfd = os.open(path, os.O_RDWR | os.O_DIRECT)
assert os.preadv(dfd, [buf], off) == n and buf[:] == pat, "direct read after msync"
assert os.pread(fd, n, off) == pat, "cached read after msync"
new = random.Random(seed + 1).randbytes(4096)
buf[:4096] = new
assert os.pwritev(dfd, [memoryview(buf)[:4096]], off) == 4096
os.fsync(dfd)
m = mmap.mmap(fd, n, mmap.MAP_SHARED, mmap.PROT_READ, offset=off)
assert m[:4096] == new, "a new mapping misses a direct write"
assert m[4096:] == pat[4096:], "a new mapping lost the mapped write"
m.close()
os.close(dfd)
os.close(fd)
with open("expect.bin", "r+b") as f:
    f.seek(off)
    f.write(new + pat[4096:])
print("ok")
PY

# one_mode FMT LABEL [MOUNT OPTIONS...]
one_mode() {
  local fmt=$1 label=$2 r
  shift 2
  check "shared writable mmap: $fmt, $label"
  rm -f img expect.bin mount.pid
  head -c $((8 << 20)) /dev/zero >expect.bin
  qemu-img create -q -f "$fmt" img 8M || fail "qemu-img create"
  "${_env_reset[@]}" "$BLOCKPORT" mount --foreground -P mount.pid -f "$fmt" \
    "$@" img "$MNT" </dev/null >mount.log 2>&1 &
  MOUNT_PID=$!
  track_pid "$MOUNT_PID"
  wait_file 15 mount.pid "$MOUNT_PID" || fail "mount not live: $(tail -3 mount.log)"
  r=$(timeout 60 "$PY" mm.py "$MNT/img" $((1 << 20)) $((256 << 10)) 1) ||
    fail "mm.py: $r"
  if [[ $r == ENODEV ]]; then
    [[ $label != page ]] && ! kernel_allows ||
      fail "the mapping was refused on $(uname -r)"
    grep -q "fails with ENODEV" mount.log || fail "refused, and not logged"
  else
    [[ $r == ok ]] || fail "mm.py said $r"
    # Unaligned to the page, inside one cluster and across two.
    r=$(timeout 60 "$PY" mm.py "$MNT/img" $((3 << 20)) $((64 << 10)) 2)
    [[ $r == ok ]] || fail "second mapping: $r"
    grep -q "fails with ENODEV" mount.log && fail "logged a refusal, yet mapped"
  fi
  fusermount3 -u "$MNT"
  wait_until 20 _pid_gone "$MOUNT_PID" || fail "the mount did not exit"
  check_sanitizer_reports mount.log
  [[ $r == ok ]] || { ok "refused with ENODEV, as logged"; return; }
  qemu-img compare -q -f "$fmt" -F raw img expect.bin ||
    fail "the image differs from what was mapped and written"
  ok "the image holds the mapped writes"
}

one_mode raw default
one_mode raw none --cache none
one_mode raw page --cache page
one_mode qcow2 default
one_mode qcow2 page --cache page
