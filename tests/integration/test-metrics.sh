#!/bin/bash
# SPDX-License-Identifier: BSD-3-Clause
# serve --metrics: the Prometheus endpoint counts exactly what fio did
# (requests by command, bytes, latency histogram counts), during and after
# a run; other paths get 404; malformed, oversized and stalled HTTP requests
# leave the server serving; a bad --metrics address is a usage error.  A
# second server, of one unnamed qcow2 image, labels it export="(default)",
# counts the qcow2 L2 cache, and counts connections refused for each
# reason (max connections, handshake timeout, allow list, TLS).  A reload
# that removes an export drops its blockport_export_info series and keeps
# its counters.
# test-metrics-load.sh scrapes under load with 50 idle HTTP clients.
source "$(dirname "$0")/lib.sh"
TREE=$(cd "$(dirname "$0")/../.." && pwd)
require fio curl
fio --enghelp=nbd >/dev/null 2>&1 || skip "fio has no nbd engine"

check "--metrics with a bad address is a usage error"
for bad in 127.0.0.1 127.0.0.1:0 ::1:9100 '[::1]' 127.0.0.1:99999 :9100; do
    rc=0
    "$BLOCKPORT" serve --metrics "$bad" null:1M >/dev/null 2>&1 || rc=$?
    [[ $rc -eq 1 ]] || fail "--metrics $bad: exit status $rc, expected 1"
done
ok "exit status 1"

# Serve with metrics on a free port (retried: another process may take it).
for attempt in 1 2 3 4 5; do
    MPORT=$(_free_port)
    _launch --unix "$T/sock" -- --metrics "127.0.0.1:$MPORT" "mem=memory:64M" "other=null:1M"
    if _wait_started; then
        break
    fi
    ((attempt < 5)) || fail "could not start the server with --metrics"
done
SOCK=$T/sock
URI="nbd+unix:///mem?socket=$SOCK"
MURL="http://127.0.0.1:$MPORT/metrics"

scrape() { curl -sf --max-time 10 "$MURL"; }
# value TEXT SAMPLE: the value of the sample line starting with SAMPLE.
value() {
    awk -v s="$2" 'index($0, s " ") == 1 { print $NF; found = 1 }
                   END { if (!found) print "missing" }' <<<"$1"
}
expect() {
    local text=$1 s=$2 want=$3 got
    got=$(value "$text" "$s")
    [[ $got == "$want" ]] || fail "$s is $got, expected $want"
}
cmd_sample() { echo "blockport_$1{export=\"mem\",cmd=\"$2\"}"; }

check "scrape before any client"
m=$(scrape) || fail "cannot scrape $MURL"
grep -q '^# TYPE blockport_request_duration_seconds histogram$' <<<"$m" ||
    fail "no histogram TYPE line"
expect "$m" blockport_exports 2
expect "$m" 'blockport_export_info{export="mem"}' 1
expect "$m" 'blockport_export_size_bytes{export="other"}' 1048576
expect "$m" "$(cmd_sample requests_total write)" 0
expect "$m" "blockport_build_info{version=\"$("$BLOCKPORT" --version | sed -n 1p | cut -d' ' -f2)\"}" 1
start=$(value "$m" process_start_time_seconds)
now=$(date +%s)
((${start%.*} > now - 600 && ${start%.*} <= now)) ||
    fail "process_start_time_seconds is $start, now is $now"
for reason in allow_list max_connections tls handshake_timeout; do
    expect "$m" "blockport_connections_refused_total{reason=\"$reason\"}" 0
done
for name in pool_queue_depth pool_workers pool_busy_workers; do
    [[ $(value "$m" "blockport_$name") =~ ^[0-9]+$ ]] || fail "no blockport_$name"
done
# Source counters: a series per export, from 0, whatever its source is.
for name in qcow2_l2_cache_hits_total qcow2_l2_cache_misses_total \
    qcow2_l2_cache_evictions_total nbd_reconnects_total \
    nbd_request_timeouts_total nbd_hung_connections_total; do
    for e in mem other; do
        expect "$m" "blockport_$name{export=\"$e\"}" 0
    done
    expect "$m" "blockport_$name" missing
done
ok "empty counters; build info, start time, refusals, pool and source counters"

# settled CMD N: a scrape (in $m) counts N requests of CMD on mem, and none
# in flight.  A request counts when its reply has left the socket, which
# may be a moment after the client has it: wait for that, with a deadline.
settled() {
    m=$(scrape) &&
        [[ $(value "$m" "$(cmd_sample requests_total "$1")") == "$2" &&
            $(value "$m" 'blockport_requests_in_flight{export="mem"}') == 0 ]]
}

run_fio() {
    (cd "$T" && timeout --kill-after=5 120 fio --output-format=terse "$1") \
        >"$T/fio.out" 2>&1 || { cat "$T/fio.out" >&2; fail "fio $1 failed"; }
}

check "fio writes 8 MiB in 4k blocks, flushing every 256 writes"
cat >"$T/write.fio" <<EOF
[w]
ioengine=nbd
uri=$URI
rw=write
bs=4k
size=8M
iodepth=16
fsync=256
EOF
run_fio write.fio
wait_until 5 settled write 2048 || true
expect "$m" "$(cmd_sample requests_total write)" 2048
expect "$m" 'blockport_written_bytes_total{export="mem"}' 8388608
expect "$m" "$(cmd_sample request_duration_seconds_count write)" 2048
expect "$m" "$(cmd_sample request_errors_total write)" 0
expect "$m" 'blockport_request_duration_seconds_bucket{export="mem",cmd="write",le="+Inf"}' 2048
flushes=$(value "$m" "$(cmd_sample requests_total flush)")
((flushes >= 8)) || fail "$flushes flushes, expected at least 8"
expect "$m" "$(cmd_sample request_duration_seconds_count flush)" "$flushes"
expect "$m" 'blockport_requests_in_flight{export="mem"}' 0
expect "$m" 'blockport_requests_in_flight_bytes{export="mem"}' 0
expect "$m" 'blockport_export_connections{export="mem"}' 0
conns=$(value "$m" 'blockport_export_connections_opened_total{export="mem"}')
((conns >= 1)) || fail "$conns connections to mem"
ok "2048 writes, 8 MiB, $flushes flushes"

check "fio reads 8 MiB in 4k blocks, scraped while it runs"
cat >"$T/read.fio" <<EOF
[r]
ioengine=nbd
uri=$URI
rw=read
bs=4k
size=8M
iodepth=4
rate_iops=1000
EOF
run_fio read.fio &
fio_pid=$!
track_pid "$fio_pid"
# mid_run: a scrape (in $m) while fio runs: some reads counted, not all.
mid_run() {
    m=$(scrape)
    n=$(value "$m" "$(cmd_sample requests_total read)")
    [[ $n != missing ]] && ((n > 0 && n < 2048))
}
wait_until 10 mid_run || fail "never saw the read counter between 0 and 2048"
during=$n
expect "$m" 'blockport_export_connections{export="mem"}' 1
wait "$fio_pid" || fail "fio read failed"
wait_until 5 settled read 2048 || true
expect "$m" "$(cmd_sample requests_total read)" 2048
expect "$m" 'blockport_read_bytes_total{export="mem"}' 8388608
expect "$m" "$(cmd_sample request_duration_seconds_count read)" 2048
expect "$m" "$(cmd_sample requests_total write)" 2048
# fio connects once to learn the size, then for the job.
expect "$m" blockport_connections_accepted_total \
    "$(value "$m" 'blockport_export_connections_opened_total{export="mem"}')"
expect "$m" blockport_connections 0
# The histogram's buckets are cumulative.
awk '/^blockport_request_duration_seconds_bucket\{export="mem",cmd="read"/ {
        if ($NF < last) exit 1; last = $NF }' <<<"$m" ||
    fail "read buckets decrease"
ok "$during reads seen during the run; 2048 reads, 8 MiB after"

check "other paths and methods"
code=$(curl -s -o /dev/null -w '%{http_code}' "http://127.0.0.1:$MPORT/")
[[ $code == 404 ]] || fail "/ answered $code"
code=$(curl -s -o /dev/null -w '%{http_code}' "http://127.0.0.1:$MPORT/metricsx")
[[ $code == 404 ]] || fail "/metricsx answered $code"
code=$(curl -s -o /dev/null -w '%{http_code}' -X POST "$MURL")
[[ $code == 405 ]] || fail "POST answered $code"
ok "404 and 405"

check "malformed, oversized and stalled requests; 70 idle clients; a slow reader"
"$PY" - "$MPORT" <<'EOF' || fail "bad HTTP clients"
import socket, sys, time
port = int(sys.argv[1])
def ask(data, close_write=True):
    s = socket.create_connection(("127.0.0.1", port), timeout=10)
    try:
        s.sendall(data)
        if close_write:
            s.shutdown(socket.SHUT_WR)
    except OSError:
        pass  # the server may close on us while we still send
    out = b""
    try:
        while chunk := s.recv(65536):
            out += chunk
    except OSError:
        pass
    s.close()
    return out.split(b"\r\n", 1)[0]
assert ask(b"garbage\r\n\r\n").startswith(b"HTTP/1.0 400"), "garbage"
assert ask(b"GET\r\n\r\n").startswith(b"HTTP/1.0 400"), "no path"
assert ask(b"\0\xff\r\n\r\n").startswith(b"HTTP/1.0 400"), "binary"
r = ask(b"GET /metrics HTTP/1.0\r\nX: " + b"a" * 100000 + b"\r\n\r\n")
assert r.startswith(b"HTTP/1.0 431"), r
assert ask(b"GET /metr").startswith(b"") # half a request, then EOF
# A client that sends nothing delays nobody: the listener serves all at once.
idle = socket.create_connection(("127.0.0.1", port))
t = time.time()
r = ask(b"GET /metrics HTTP/1.0\r\n\r\n")
assert r.startswith(b"HTTP/1.0 200"), r
assert time.time() - t < 5, "a stalled client blocked the listener"
idle.close()
# 70 idle clients, past the bound of 64: the oldest are closed to make
# room, and a scrape still gets through.
idle = [socket.create_connection(("127.0.0.1", port)) for _ in range(70)]
r = ask(b"GET /metrics HTTP/1.0\r\n\r\n")
assert r.startswith(b"HTTP/1.0 200"), r
idle[0].settimeout(10)
assert idle[0].recv(1) == b"", "the oldest idle client was not closed"
for s in idle:
    s.close()
# A reader slower than the page: the reply comes whole, in many sends.
s = socket.socket()
s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
s.settimeout(10)
s.connect(("127.0.0.1", port))
s.sendall(b"GET /metrics HTTP/1.0\r\n\r\n")
time.sleep(0.5)  # let the server meet a full socket
out = b""
while chunk := s.recv(1000):
    out += chunk
head, body = out.split(b"\r\n\r\n", 1)
length = int(head.split(b"Content-Length: ")[1].split(b"\r\n")[0])
assert len(body) == length > 50000, (len(body), length)
assert body.endswith(b"\n")
EOF
m=$(scrape) || fail "no scrape after bad clients"
expect "$m" "$(cmd_sample requests_total read)" 2048
"$PY" - "$SOCK" <<'EOF' || fail "NBD no longer works after bad HTTP clients"
import nbd, sys
h = nbd.NBD(); h.set_export_name("mem"); h.connect_unix(sys.argv[1])
assert h.pread(4096, 0) is not None
h.shutdown()
EOF
ok "server still answers HTTP and NBD"

stop_server

# ---- one unnamed qcow2 image; refusals ----
require qemu-img
random_file "$T/data.raw" 4
qemu-img convert -f raw -O qcow2 "$T/data.raw" "$T/disk.qcow2"
qemu-img convert -f raw -O qcow2 "$T/data.raw" "$T/spare.qcow2"
tls=()
have_psk=
if has_feature tls && command -v psktool >/dev/null && command -v nbdinfo >/dev/null; then
    mkdir "$T/psk" "$T/badpsk"
    psktool -u alice -p "$T/psk/keys.psk" >/dev/null
    psktool -u alice -p "$T/badpsk/keys.psk" >/dev/null # another key
    tls=(--tls on --tls-psk "$T/psk/keys.psk")
    have_psk=1
fi
for attempt in 1 2 3 4 5; do
    MPORT=$(_free_port)
    PORT=$(_free_port)
    _launch --unix "$T/sock" --bind 127.0.0.1 --port "$PORT" -- \
        --metrics "127.0.0.1:$MPORT" --allow 127.0.0.2/32 --max-connections 2 \
        --handshake-timeout 1 "${tls[@]}" -f qcow2 "$T/disk.qcow2" \
        "spare=$T/spare.qcow2"
    if _wait_started; then
        break
    fi
    ((attempt < 5)) || fail "could not start the second server"
done
MURL="http://127.0.0.1:$MPORT/metrics"

check "the unnamed export is labelled export=\"(default)\""
"$PY" - "$SOCK" "$T/data.raw" <<'EOF' || fail "reading the qcow2 export"
import nbd, sys
h = nbd.NBD(); h.connect_unix(sys.argv[1])
data = open(sys.argv[2], "rb").read()
for off in range(0, len(data), 65536):
    assert h.pread(65536, off) == data[off:off + 65536], off
h.shutdown()
EOF
m=
reads_counted() {
    m=$(scrape) &&
        [[ $(value "$m" 'blockport_requests_total{export="(default)",cmd="read"}') == 64 ]]
}
wait_until 5 reads_counted || fail "64 reads not counted on export=\"(default)\""
expect "$m" 'blockport_export_info{export="(default)"}' 1
expect "$m" 'blockport_read_bytes_total{export="(default)"}' 4194304
if grep -q 'export=""' <<<"$m"; then fail "an empty export label"; fi
hits=$(value "$m" 'blockport_qcow2_l2_cache_hits_total{export="(default)"}')
misses=$(value "$m" 'blockport_qcow2_l2_cache_misses_total{export="(default)"}')
((misses >= 1 && hits + misses >= 64)) ||
    fail "L2 cache: $hits hits and $misses misses for 64 reads"
# The other qcow2 export's cache saw none of them.
expect "$m" 'blockport_qcow2_l2_cache_hits_total{export="spare"}' 0
expect "$m" 'blockport_qcow2_l2_cache_misses_total{export="spare"}' 0
ok "64 reads of (default); its L2 cache $hits hits, $misses misses; spare's none"

refused() { value "$m" "blockport_connections_refused_total{reason=\"$1\"}"; }
until_refused() { m=$(scrape) && [[ $(refused "$1") == "$2" ]]; }
open_conns() { m=$(scrape) && [[ $(value "$m" blockport_connections) == "$1" ]]; }

check "refused: max connections, then handshake timeouts"
# Two clients that never negotiate fill --max-connections 2; a third is
# refused; the two time out after --handshake-timeout 1.
"$PY" - "$SOCK" "$T/held" <<'EOF' &
import socket, sys, time
held = [socket.socket(socket.AF_UNIX) for _ in range(2)]
for s in held:
    s.connect(sys.argv[1])
open(sys.argv[2], "w").write("2\n")
time.sleep(30)
EOF
track_pid $!
wait_file 10 "$T/held" || fail "could not connect the idle NBD clients"
wait_until 5 open_conns 2 || fail "2 connections not seen"
"$PY" -c 'import socket, sys; s = socket.socket(socket.AF_UNIX); s.connect(sys.argv[1]); s.recv(1)' \
    "$SOCK" 2>/dev/null || true
wait_until 5 until_refused max_connections 1 ||
    fail "max_connections is $(refused max_connections)"
wait_until 10 until_refused handshake_timeout 2 ||
    fail "handshake_timeout is $(refused handshake_timeout)"
ok "max_connections 1, handshake_timeout 2"

check "refused: not in --allow"
wait_until 5 open_conns 0 || fail "connections still open"
"$PY" -c 'import socket, sys; s = socket.create_connection(("127.0.0.1", int(sys.argv[1]))); s.recv(1)' \
    "$PORT" 2>/dev/null || true
wait_until 5 until_refused allow_list 1 || fail "allow_list is $(refused allow_list)"
ok "allow_list 1"

if [[ -n $have_psk ]]; then
    check "refused: a failed TLS handshake"
    if nbdinfo "nbds+unix://alice@/?socket=$SOCK&tls-psk-file=$T/badpsk/keys.psk" \
        >/dev/null 2>&1; then
        fail "nbdinfo with the wrong key succeeded"
    fi
    wait_until 5 until_refused tls 1 || fail "tls is $(refused tls)"
    ok "tls 1"
else
    skip_case "no TLS in blockport, no psktool or no nbdinfo: the TLS refusal is not tested"
fi
expect "$m" 'blockport_connections_refused_total{reason="max_connections"}' 1
expect "$m" 'blockport_connections_refused_total{reason="handshake_timeout"}' 2

stop_server

# ---- a reload removes an export ----
check "a reload drops a removed export's info series, keeps its counters"
printf '[export keep]\npath = memory:1M\n[export gone]\npath = memory:1M\n' >"$T/exports.conf"
for attempt in 1 2 3 4 5; do
    MPORT=$(_free_port)
    _launch --unix "$T/sock" -- --metrics "127.0.0.1:$MPORT" --config "$T/exports.conf"
    if _wait_started; then
        break
    fi
    ((attempt < 5)) || fail "could not start the server with --config"
done
MURL="http://127.0.0.1:$MPORT/metrics"
"$PY" - "$SOCK" <<'EOF' || fail "reading export 'gone'"
import nbd, sys
h = nbd.NBD(); h.set_export_name("gone"); h.connect_unix(sys.argv[1])
h.pread(4096, 0)
h.shutdown()
EOF
gone_read() {
    m=$(scrape) &&
        [[ $(value "$m" 'blockport_requests_total{export="gone",cmd="read"}') == 1 ]]
}
wait_until 5 gone_read || fail "the read of 'gone' not counted"
expect "$m" 'blockport_export_info{export="gone"}' 1
printf '[export keep]\npath = memory:1M\n' >"$T/exports.conf"
kill -HUP "$SERVER_PID"
reloaded() { m=$(scrape) && [[ $(value "$m" blockport_exports) == 1 ]]; }
wait_until 10 reloaded || fail "the reload did not take"
expect "$m" 'blockport_export_info{export="keep"}' 1
expect "$m" 'blockport_export_info{export="gone"}' missing
expect "$m" 'blockport_export_size_bytes{export="gone"}' missing
expect "$m" 'blockport_requests_total{export="gone",cmd="read"}' 1
expect "$m" 'blockport_read_bytes_total{export="gone"}' 4096
ok "export_info and size of 'gone' dropped; its counters kept"

stop_server

# ---- mount --metrics: the same endpoint, the mount's own families ----
check "mount --metrics: requests, bytes and the qcow2 cache, by mount point"
if ! can_mount || [[ $(id -u) -ne 0 ]]; then
    skip_case "cannot mount FUSE here"
else
    MNT=$T/mnt
    mkdir -p "$MNT"
    is_mounted() { awk -v m="$1" '$2 == m {f = 1} END {exit !f}' /proc/self/mounts; }
    trap 'rc=$?; set +e; is_mounted "$MNT" && fusermount3 -u -z "$MNT"; (exit $rc); _cleanup' EXIT
    qemu-img create -q -f qcow2 "$T/m.qcow2" 8M
    rc=0
    "$BLOCKPORT" mount --foreground --metrics 999.1.1.1:1 "$T/m.qcow2" "$MNT" \
        >"$T/mbad.log" 2>&1 || rc=$?
    [[ $rc -eq 1 ]] && grep -q -- "--metrics 999.1.1.1:1: " "$T/mbad.log" ||
        fail "a bad --metrics address: exit $rc, $(cat "$T/mbad.log")"
    for attempt in 1 2 3 4 5; do
        MPORT=$(_free_port)
        rm -f "$T/mount.pid"
        "${_env_reset[@]}" "$BLOCKPORT" mount --foreground -P "$T/mount.pid" \
            --metrics "127.0.0.1:$MPORT" "$T/m.qcow2" "$MNT" </dev/null \
            >"$T/mount.log" 2>&1 &
        MOUNT_PID=$!
        track_pid "$MOUNT_PID"
        wait_file 15 "$T/mount.pid" "$MOUNT_PID" && break
        ((attempt < 5)) || fail "mount not live: $(tail -3 "$T/mount.log")"
    done
    MURL="http://127.0.0.1:$MPORT/metrics"
    dd if=/dev/urandom of="$MNT/m" bs=64k count=4 oflag=direct conv=notrunc \
        status=none || fail "writing through the mount"
    dd if="$MNT/m" of=/dev/null bs=64k count=2 iflag=direct status=none ||
        fail "reading through the mount"
    L="mountpoint=\"$MNT\""
    mount_counted() {
        m=$(scrape) &&
            [[ $(value "$m" "blockport_mount_requests_total{$L,cmd=\"read\"}") == 2 ]]
    }
    wait_until 5 mount_counted || fail "2 reads not counted: $(grep mount_requests <<<"$m")"
    expect "$m" "blockport_mount_requests_total{$L,cmd=\"write\"}" 4
    expect "$m" "blockport_mount_written_bytes_total{$L}" 262144
    expect "$m" "blockport_mount_read_bytes_total{$L}" 131072
    expect "$m" "blockport_mount_info{$L}" 1
    expect "$m" "blockport_mount_size_bytes{$L}" 8388608
    expect "$m" "blockport_mount_request_duration_seconds_count{$L,cmd=\"write\"}" 4
    misses=$(value "$m" "blockport_qcow2_l2_cache_misses_total{$L}")
    [[ $misses =~ ^[0-9]+$ ]] && ((misses >= 1)) || fail "L2 cache misses: $misses"
    # Not the NBD server's families; the dashboard's mount row is served.
    expect "$m" blockport_connections missing
    printf '%s\n' "$m" >"$T/mount-scrape.txt"
    "$PY" "$TREE/contrib/grafana/check-dashboard.py" --only blockport_mount_ \
        "$TREE/contrib/grafana/blockport-dashboard.json" "$T/mount-scrape.txt" ||
        fail "the dashboard's mount row uses metrics the mount does not expose"
    fusermount3 -u "$MNT"
    wait_until 20 _pid_gone "$MOUNT_PID" || fail "the mount did not exit"
    ok "reads, writes, bytes, size and the L2 cache under $L"
fi
