# SPDX-License-Identifier: BSD-3-Clause
# shellcheck shell=bash
# Shared by the benchmark scripts in this directory: source it after
# `set -euo pipefail`.  Each script runs blockport and its peers side by
# side; this file holds what they all do the same way: a scratch
# directory, a random test disk, fio job files and their terse output,
# starting a server and waiting for its socket, ratios.

# bench_require TOOL...: exit with a message when a tool is missing.
bench_require() {
  local t
  for t in "$@"; do
    command -v "$t" >/dev/null || { echo "missing $t" >&2; exit 1; }
  done
}

# bench_workdir NAME: a scratch directory in W, removed at exit with
# every background job killed (KEEP=1 keeps it for a look afterwards).
# A script with more to undo defines bench_cleanup_hook, which runs first.
bench_workdir() {
  W=$(mktemp -d "/tmp/$1.XXXX")
  trap _bench_exit EXIT
}
_bench_exit() {
  set +e
  declare -F bench_cleanup_hook >/dev/null && bench_cleanup_hook
  kill $(jobs -p) 2>/dev/null
  wait 2>/dev/null
  [ -n "${KEEP:-}" ] || rm -rf "$W"
}

# random_disk PATH MIB: a raw file of MIB MiB of random data (fio would
# otherwise read zeros and holes, which some servers answer for free).
random_disk() {
  qemu-img create -f raw "$1" "$2M" >/dev/null
  dd if=/dev/urandom of="$1" bs=1M count="$2" conv=notrunc status=none
}

# fio_job FILE [KEY=VALUE...]: a job file for the project's origin
# workload (4k random read/write 75/25, iodepth 64, time based, RT
# seconds, 1 GiB), with KEY=VALUE lines overriding or adding options.
fio_job() {
  local file=$1 kv key
  shift
  local -A opt=([rw]=randrw [rwmixread]=75 [bs]=4k [iodepth]=64
    [time_based]=1 [runtime]=$RT [size]=1G [randrepeat]=1 [gtod_reduce]=1)
  local order=(rw rwmixread bs iodepth time_based runtime size randrepeat
    gtod_reduce)
  for kv in "$@"; do
    key=${kv%%=*}
    [[ -v opt[$key] ]] || order+=("$key")
    opt[$key]=${kv#*=}
  done
  {
    echo "[global]"
    for key in "${order[@]}"; do echo "$key=${opt[$key]}"; done
    echo "[test]"
  } >"$file"
}

# fio_run FIO-ARGS...: run fio, set FIO_IOPS (read + write) and FIO_MIBS.
fio_run() {
  local out
  out=$(fio --output-format=terse --terse-version=3 "$@" 2>/dev/null | tail -n 1)
  # terse v3: field 7 read bw KiB/s, 8 read IOPS, 48 write bw, 49 write IOPS
  FIO_IOPS=$(awk -F';' '{print $8 + $49}' <<<"$out")
  FIO_MIBS=$(awk -F';' '{printf "%.0f", ($7 + $48) / 1024}' <<<"$out")
}

# wait_sock PATH: until a Unix socket exists at PATH (10 s at most).
wait_sock() {
  local _
  for _ in $(seq 200); do [ -S "$1" ] && return 0; sleep 0.05; done
  echo "no socket at $1 after 10 s" >&2
  return 1
}

# wait_mount PATH: until PATH is a FUSE mount (10 s at most).
wait_mount() {
  local _
  for _ in $(seq 200); do
    grep -qs " $1 fuse" /proc/mounts && return 0
    sleep 0.05
  done
  echo "no FUSE mount at $1 after 10 s" >&2
  return 1
}

# start_server SOCKET CMD...: run a server in the background (its output
# thrown away) and wait for its socket; its pid in SERVER_PID.
start_server() {
  local sock=$1
  shift
  rm -f "$sock"
  "$@" >/dev/null 2>&1 &
  SERVER_PID=$!
  wait_sock "$sock"
}

stop_server() {
  kill "$SERVER_PID" 2>/dev/null || true
  wait "$SERVER_PID" 2>/dev/null || true
}

# ratio A B: A / B to two places, or n/a.
ratio() {
  awk -v a="$1" -v b="$2" 'BEGIN { if (b > 0) printf "%.2f", a / b; else print "n/a" }'
}

# callgrind_serve BIN SERVE-ARGS...: `BIN serve` on $W/s.sock under
# valgrind's callgrind, in the background, once its socket is there (60 s
# at most: valgrind starts slowly).  callgrind_total then stops it and
# prints the instructions it ran.  CALLGRIND_ARGS adds options: say
# --toggle-collect=bd_submit to count only what runs under bd_submit().
callgrind_serve() {
  local bin=$1 _
  shift
  rm -f "$W/s.sock" "$W/pid" "$W/cg.out"
  # shellcheck disable=SC2086 # options, split on purpose
  valgrind --tool=callgrind --callgrind-out-file="$W/cg.out" \
    ${CALLGRIND_ARGS:-} "$bin" serve -u "$W/s.sock" --pid-file "$W/pid" "$@" 2>"$W/vg.log" &
  CALLGRIND_PID=$!
  for _ in $(seq 600); do [ -S "$W/s.sock" ] && return 0; sleep 0.1; done
  echo "no socket at $W/s.sock after 60 s" >&2
  return 1
}

callgrind_total() {
  kill -TERM "$(cat "$W/pid")"
  wait "$CALLGRIND_PID" || true
  sed -n 's/^summary: *//p' "$W/cg.out"
}

# instr_ab BIN-A BIN-B WHAT N FN ARGS...: instructions per request for
# each binary, and B/A.  FN BIN ARGS... COUNT prints what the server ran
# for COUNT requests; a run of none is taken away, leaving the requests.
instr_ab() {
  local bin_a=$1 bin_b=$2 what=$3 n=$4 fn=$5 side bin base full per a=
  shift 5
  for side in A B; do
    bin=$bin_a
    [ $side = B ] && bin=$bin_b
    base=$("$fn" "$bin" "$@" 0)
    full=$("$fn" "$bin" "$@" "$n")
    per=$(((full - base) / n))
    echo "$what $side: $per instructions per request ($n requests)"
    a=${a:-$per}
  done
  awk -v a="$a" -v b="$per" -v w="$what" 'BEGIN { printf "%s B/A: %.4f\n", w, b / a }'
}
