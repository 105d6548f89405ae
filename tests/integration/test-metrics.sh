#!/bin/bash
# SPDX-License-Identifier: BSD-3-Clause
# serve --metrics: the Prometheus endpoint counts exactly what fio did
# (requests by command, bytes, latency histogram counts), during and after
# a run; other paths get 404; malformed, oversized and stalled HTTP requests
# leave the server serving; a bad --metrics address is a usage error.
source "$(dirname "$0")/lib.sh"
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
ok "empty counters"

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
m=$(scrape)
expect "$m" "$(cmd_sample requests_total write)" 2048
expect "$m" 'blockport_written_bytes_total{export="mem"}' 8388608
expect "$m" "$(cmd_sample request_duration_seconds_count write)" 2048
expect "$m" "$(cmd_sample request_errors_total write)" 0
expect "$m" 'blockport_request_duration_seconds_bucket{export="mem",cmd="write",le="+Inf"}' 2048
flushes=$(value "$m" "$(cmd_sample requests_total flush)")
((flushes >= 8)) || fail "$flushes flushes, expected at least 8"
expect "$m" "$(cmd_sample request_duration_seconds_count flush)" "$flushes"
expect "$m" 'blockport_requests_in_flight{export="mem"}' 0
expect "$m" 'blockport_export_connections{export="mem"}' 0
conns=$(value "$m" 'blockport_export_connections_total{export="mem"}')
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
m=$(scrape)
expect "$m" "$(cmd_sample requests_total read)" 2048
expect "$m" 'blockport_read_bytes_total{export="mem"}' 8388608
expect "$m" "$(cmd_sample request_duration_seconds_count read)" 2048
expect "$m" "$(cmd_sample requests_total write)" 2048
# fio connects once to learn the size, then for the job.
expect "$m" blockport_connections_accepted_total \
    "$(value "$m" 'blockport_export_connections_total{export="mem"}')"
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

check "malformed, oversized and stalled requests"
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
# A client that sends nothing holds the listener at most a few seconds.
idle = socket.create_connection(("127.0.0.1", port))
t = time.time()
r = ask(b"GET /metrics HTTP/1.0\r\n\r\n")
assert r.startswith(b"HTTP/1.0 200"), r
assert time.time() - t < 5, "a stalled client blocked the listener"
idle.close()
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
