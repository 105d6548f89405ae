#!/bin/bash
# SPDX-License-Identifier: BSD-3-Clause
# serve --cache MODE on raw and qcow2 images (issue 16), every mode: the
# image is opened with O_DIRECT exactly in none and directsync; the direct-I/O
# alignment is advertised as the minimum block (1 for a size that is not a
# multiple of it; a raw file's size is rounded up to whole sectors, as
# QEMU rounds it); writes of 1 byte to 1 MiB at odd offsets and reads of
# random ranges agree with a shadow file, and the image equals the shadow
# afterwards (qemu-img compare and check for qcow2), on a 16 MiB image and
# a raw one of 1000000 bytes (an unaligned last block); fio verify over 4
# connections; flushes as each mode promises (strace with --aio threads,
# ext4's sync tracepoint through perf with io_uring); ramfs, which refuses
# O_DIRECT, gives a clear error.  A loop device with
# 4096-byte sectors (where losetup can make one) checks a 4096 alignment.
# convert -t none copies exactly.  All of it under --aio io_uring and
# --aio threads, and the same seeded workload leaves the same image in both.
source "$(dirname "$0")/lib.sh"
require qemu-img fio cmp truncate
require_py_nbd
cd "$T"
SEED=${CACHE_SEED:-$RANDOM}
echo "random seed: $SEED (set CACHE_SEED to reproduce)"

cat >unaligned.py <<'PY'
import nbd, random, sys
uri, shadow, seed = sys.argv[1], sys.argv[2], int(sys.argv[3])
r = random.Random(seed)
h = nbd.NBD()
h.set_strict_mode(0)  # send unaligned requests: the server must take them
h.connect_uri(uri)
size = h.get_size()
with open(shadow, "r+b") as f:
    # A raw file's export is whole sectors, as qemu-nbd's: its tail past
    # the file's end reads as zeroes (the last write below reaches it).
    f.truncate(size)
    for i in range(300):
        n = min(size, r.choice([1, 2, 511, 513, 4095, 4097, r.randint(1, 1 << 20)]))
        off = r.randint(0, size - n)
        data = r.randbytes(n)
        h.pwrite(data, off, nbd.CMD_FLAG_FUA if i % 7 == 0 else 0)
        f.seek(off)
        f.write(data)
    f.flush()
    for i in range(100):
        n = min(size, r.randint(1, 1 << 20))
        off = r.randint(0, size - n)
        f.seek(off)
        if h.pread(n, off) != f.read(n):
            sys.exit(f"read at {off}+{n} differs from the shadow")
    h.pwrite(bytes(10), 3)  # the first sector: a probed raw image's guard
    f.seek(3)
    f.write(bytes(10))
    tail = size - 1
    h.pwrite(b"\x5a", tail)
    f.seek(tail)
    f.write(b"\x5a")
h.flush()
print("min block", h.get_block_size(nbd.SIZE_MINIMUM))
h.shutdown()
PY

# image_fd_flags PID FILE: the open flags (octal) of PID's descriptors of FILE.
image_fd_flags() {
    local fd
    for fd in /proc/"$1"/fd/*; do
        [[ $(readlink "$fd") == "$2" ]] &&
            awk '/^flags/ {print $2}' /proc/"$1"/fdinfo/"${fd##*/}"
    done
}

# One export: FMT, SIZE bytes, --cache MODE, --aio AIO; MIN the minimum
# block expected.  The image is kept as img.AIO.FMT.MODE.SIZE.
one() {
    local fmt=$1 mode=$2 size=$3 min=$4 aio=$5
    rm -f img shadow
    if [[ $fmt == qcow2 ]]; then
        run qemu-img create -q -f qcow2 img "$size"
    else
        truncate -s "$size" img
    fi
    truncate -s "$size" shadow
    start_server -f "$fmt" --cache "$mode" --aio "$aio" "$T/img"
    local direct=0 f
    for f in $(image_fd_flags "$SERVER_PID" "$T/img"); do
        ((8#$f & 8#40000)) && direct=1
    done
    case $mode in
        none | directsync) ((direct)) || fail "$mode: the image is not open with O_DIRECT" ;;
        *) ((!direct)) || fail "$mode: the image is open with O_DIRECT" ;;
    esac
    local got
    local what="$fmt, --cache $mode, --aio $aio, $size bytes"
    got=$("$PY" unaligned.py "$URI" shadow "$SEED") || fail "$what: $got"
    [[ $got == "min block $min" ]] || fail "$what: $got, expected min block $min"
    stop_server
    if [[ $fmt == qcow2 ]]; then
        run qemu-img check -q img || fail "$what: qemu-img check"
        run qemu-img compare -q -f qcow2 -F raw img shadow || fail "$what: differs"
    else
        cmp img shadow || fail "$what: the image differs from the shadow"
    fi
    mv img "img.$aio.$fmt.$mode.$size"
    ok "$what: O_DIRECT $direct, min block $min, unaligned I/O matches"
}

# The I/O modes built in (CMakeLists.txt BLOCKPORT_IO_URING).
AIOS=(threads)
has_feature io_uring && AIOS=(io_uring threads)

for aio in "${AIOS[@]}"; do
    for mode in none directsync writeback writethrough unsafe; do
        case $mode in none | directsync) min=512 ;; *) min=1 ;; esac
        one raw "$mode" $((16 << 20)) "$min" "$aio"
        # Exported as 1000448 bytes (whole sectors, as qemu-nbd exports
        # it), a multiple of the 512-byte alignment: the file's unaligned
        # end is still read and written through the buffered descriptor.
        one raw "$mode" 1000000 "$min" "$aio"
        one qcow2 "$mode" $((16 << 20)) "$min" "$aio"
    done
done
# The same requests leave the same bytes whichever way they were done.
if has_feature io_uring; then
    for f in img.io_uring.*; do
        t=img.threads.${f#img.io_uring.}
        if [[ $f == *qcow2* ]]; then
            run qemu-img compare -q -f qcow2 -F qcow2 "$f" "$t" ||
                fail "$f and $t differ"
        else
            cmp "$f" "$t" || fail "$f and $t differ"
        fi
    done
    ok "--aio io_uring and --aio threads leave identical images"
else
    skip_case "built without io_uring: --aio threads only"
fi
rm -f img.io_uring.* img.threads.*

for aio in "${AIOS[@]}"; do
    for mode in none writeback; do
        for fmt in raw qcow2; do
            rm -f img
            run qemu-img create -q -f "$fmt" img 64M
            start_server -f "$fmt" --cache "$mode" --aio "$aio" "$T/img"
            fio_verify "$URI"
            stop_server
            [[ $fmt == raw ]] || run qemu-img check -q img ||
                fail "qcow2 --cache $mode --aio $aio: check after fio"
            ok "$fmt --cache $mode --aio $aio: fio verify over 4 connections"
        done
    done
done

# A qcow2 overlay whose raw backing file is 1000000 bytes: with --cache
# none the backing file is direct too, and its unaligned end is read in
# the worker that asks (core bd_run), not through the pool.
head -c 1000000 /dev/urandom >back.raw
run qemu-img create -q -f qcow2 -b back.raw -F raw over.qcow2 1M
start_server -f qcow2 --cache none "$T/over.qcow2"
run qemu-img compare -q -f raw -F raw back.raw "$URI" ||
    fail "qcow2 over an odd-sized raw backing file, --cache none: differs"
stop_server
ok "qcow2 over an odd-sized backing file reads it whole with --cache none"

# What each mode does with flushes: fdatasync calls seen by strace while
# a client makes 20 writes (FUA in unsafe) and one flush.  strace writes
# each call before the server replies, so the count is complete when the
# client is done.
cat >writes.py <<'PY'
import nbd, sys
h = nbd.NBD()
h.connect_uri(sys.argv[1])
fua = nbd.CMD_FLAG_FUA if sys.argv[2] == "fua" else 0
for i in range(20):
    h.pwrite(b"x" * 4096, i * 65536, fua)
h.flush()
h.shutdown()
PY
all_traced() { # PID TRACER: every thread of PID is traced by TRACER
    local f
    for f in /proc/"$1"/task/*/status; do
        grep -q "^TracerPid:[[:space:]]*$2\$" "$f" || return 1
    done
}
syncs() { # MODE: fdatasync calls for the workload, with --aio threads
    local mode=$1 fua=plain
    [[ $mode == unsafe ]] && fua=fua
    rm -f img trace strace.err
    truncate -s 16M img
    start_server -f raw --cache "$mode" --aio threads "$T/img" >&2
    strace -f -qq -e trace=fdatasync -o trace -p "$SERVER_PID" 2>strace.err &
    local st=$!
    wait_until 10 all_traced "$SERVER_PID" "$st" || fail "strace did not attach"
    "$PY" writes.py "$URI" "$fua" || fail "$mode: writes failed"
    # Counted before the server stops: closing flushes once in every mode
    # (a qcow2 image writes its cached metadata then).
    grep -c '^[0-9]* *fdatasync(' trace || true
    # Detach before the server exits: LeakSanitizer cannot run traced.
    kill -INT "$st"
    wait "$st" 2>/dev/null || true
    stop_server >&2
}
if command -v strace >/dev/null; then
    n=$(syncs writethrough)
    ((n >= 20)) || fail "writethrough: $n fdatasync calls for 20 writes"
    n=$(syncs writeback)
    ((n >= 1 && n < 20)) || fail "writeback: $n fdatasync calls for 20 writes and a flush"
    n=$(syncs unsafe)
    ((n == 0)) || fail "unsafe: $n fdatasync calls (flushes and FUA must be ignored)"
    ok "writethrough syncs every write, writeback at the flush, unsafe never"
else
    echo "SKIP: no strace: flush behaviour of the modes not checked"
fi

# The same with io_uring, whose fdatasync and RWF_DSYNC writes no strace
# sees: ext4 counts its file syncs (ext4_sync_file_enter, which a flush
# and a buffered RWF_DSYNC write both reach) for perf.
ring_syncs() { # MODE: ext4 file syncs for the workload
    local mode=$1 fua=plain
    [[ $mode == unsafe ]] && fua=fua
    rm -f img perf.out
    truncate -s 16M img
    start_server -f raw --cache "$mode" --aio io_uring "$T/img" >&2
    perf stat -x, -e ext4:ext4_sync_file_enter -p "$SERVER_PID" \
        -o perf.out 2>perf.err &
    local ps=$!
    wait_until 10 perf_attached "$ps" || fail "perf stat did not attach"
    "$PY" writes.py "$URI" "$fua" || fail "$mode: writes failed"
    kill -INT "$ps"
    wait "$ps" 2>/dev/null || true
    stop_server >&2
    # "<not counted>": the event never ran, so nothing was counted.
    awk -F, '/ext4_sync_file_enter/ {print $1 + 0}' perf.out
}
perf_attached() { # PID: perf has opened its events
    ls -l /proc/"$1"/fd 2>/dev/null | grep -q perf_event
}
perf_ok() {
    [[ $(stat -f -c %T "$T") == ext2/ext3 ]] &&
        perf stat -e ext4:ext4_sync_file_enter -o /dev/null true 2>/dev/null
}
if has_feature io_uring && command -v perf >/dev/null && perf_ok; then
    n=$(ring_syncs writethrough)
    ((n >= 20)) || fail "io_uring writethrough: $n syncs for 20 writes"
    n=$(ring_syncs writeback)
    ((n >= 1 && n < 20)) || fail "io_uring writeback: $n syncs for 20 writes and a flush"
    n=$(ring_syncs unsafe)
    ((n == 0)) || fail "io_uring unsafe: $n syncs (flushes and FUA must be ignored)"
    ok "io_uring: writethrough syncs every write, writeback at the flush, unsafe never"
else
    echo "SKIP: no io_uring, or no perf with ext4 tracepoints here: io_uring flushes not counted"
fi

# A file system that refuses O_DIRECT (ramfs): a clear error at open.
mkdir -p rfs
if mount -t ramfs none rfs 2>/dev/null; then
    trap 'rc=$?; set +e; umount rfs; (exit $rc); _cleanup' EXIT
    truncate -s 1M rfs/x
    if "$BLOCKPORT" serve --unix "$T/rsock" -f raw --cache none rfs/x 2>rerr; then
        fail "--cache none on ramfs was accepted"
    fi
    grep -q "refuses direct I/O (O_DIRECT)" rerr || fail "unclear error: $(cat rerr)"
    umount rfs
    trap _cleanup EXIT
    ok "--cache none on ramfs: $(cat rerr)"
else
    echo "SKIP: cannot mount ramfs: the refused-O_DIRECT case not checked"
fi

# convert -t none (DST with O_DIRECT), an odd size included.
head -c 3000001 /dev/urandom >src.raw
run "$BLOCKPORT" convert -O raw -t none -T none src.raw dst.raw
# DST is whole sectors, as qemu-img convert makes it: SRC, then zeroes.
[[ $(stat -c %s dst.raw) == 3000320 ]] || fail "convert -t none: DST is $(stat -c %s dst.raw) bytes"
run qemu-img compare -q -f raw -F raw src.raw dst.raw || fail "convert -t none: DST differs from SRC"
ok "convert -t none -T none copies exactly"

# A 4096-byte direct-I/O alignment: a loop device with 4096-byte sectors.
if LOOP=$(losetup -f --show --sector-size 4096 "$(truncate -s 16M big && echo "$T/big")" 2>/dev/null); then
    trap 'rc=$?; set +e; losetup -d "$LOOP"; (exit $rc); _cleanup' EXIT
    truncate -s 16M shadow4
    cp big shadow4
    for aio in "${AIOS[@]}"; do
        # Probed, not -f raw: the guard of the first sector reads it, 512
        # bytes, which direct I/O must widen to 4096.
        start_server --cache none --aio "$aio" "$LOOP"
        got=$("$PY" unaligned.py "$URI" shadow4 "$SEED") || fail "loop device: $got"
        [[ $got == "min block 4096" ]] || fail "loop device: $got, expected min block 4096"
        stop_server
        cmp "$LOOP" shadow4 || fail "loop device, --aio $aio: differs from the shadow"
        ok "--cache none --aio $aio on a 4096-byte-sector device: min block 4096, unaligned I/O matches"
    done
else
    echo "SKIP: losetup cannot make a 4096-byte-sector loop device here"
fi
