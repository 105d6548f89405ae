#!/bin/bash
# SPDX-License-Identifier: BSD-3-Clause
# serve --metrics under load, with 50 idle HTTP clients: while fio (4 jobs,
# iodepth 16, a known number of reads and writes) runs and 50 connections
# to the metrics port sit idle or half-way through a request, every scrape
# answers (curl --max-time 2 is the condition) and the idle connections are
# still open; afterwards the counters equal what fio did, the latency
# histogram has its 30 cumulative buckets from le="1e-06" to le="10" and
# +Inf, and every metric the Grafana dashboard (contrib/grafana/) uses is
# one the server exposes.
source "$(dirname "$0")/lib.sh"
require fio curl
fio --enghelp=nbd >/dev/null 2>&1 || skip "fio has no nbd engine"
TREE=$(cd "$(dirname "$0")/../.." && pwd)

for attempt in 1 2 3 4 5; do
    MPORT=$(_free_port)
    _launch --unix "$T/sock" -- --metrics "127.0.0.1:$MPORT" "load=memory:128M"
    if _wait_started; then
        break
    fi
    ((attempt < 5)) || fail "could not start the server with --metrics"
done
SOCK=$T/sock
URI="nbd+unix:///load?socket=$SOCK"
MURL="http://127.0.0.1:$MPORT/metrics"

# scrape: the page, answered within 2 s, or failure.
scrape() { curl -sf --max-time 2 "$MURL"; }
value() {
    awk -v s="$2" 'index($0, s " ") == 1 { print $NF; found = 1 }
                   END { if (!found) print "missing" }' <<<"$1"
}
cmd_sample() { echo "blockport_$1{export=\"load\",cmd=\"$2\"}"; }

check "50 idle HTTP connections held open to the metrics port"
cat >"$T/idle.py" <<'PYEOF'
import os, signal, socket, sys, time
port, state = int(sys.argv[1]), sys.argv[2]
signal.alarm(300)
socks = []
for i in range(50):
    s = socket.create_connection(("127.0.0.1", port), timeout=10)
    if i % 2:
        s.sendall(b"GET /metr")  # half a request line, never finished
    socks.append(s)
with open(state + ".ready", "w") as f:
    f.write("50\n")
# Until told to stop; then report how many the server still keeps open.
while not os.path.exists(state + ".stop"):
    time.sleep(0.05)
still = 0
for s in socks:
    s.setblocking(False)
    try:
        still += s.recv(1, socket.MSG_PEEK) != b""
    except BlockingIOError:
        still += 1
    except OSError:
        pass
with open(state + ".result.tmp", "w") as f:
    f.write("%d\n" % still)
os.rename(state + ".result.tmp", state + ".result")
PYEOF
"$PY" "$T/idle.py" "$MPORT" "$T/idle" &
holder=$!
track_pid "$holder"
wait_file 20 "$T/idle.ready" "$holder" || fail "the idle clients could not connect"
ok "50 connections, 25 of them with half a request"

check "fio: 4 jobs at iodepth 16, scraped while it runs"
# Two writers of 2048 4 KiB blocks and two readers of 128 64 KiB blocks,
# in separate 16 MiB regions; rate-limited so that the run lasts seconds.
cat >"$T/load.fio" <<FIOEOF
[global]
ioengine=nbd
uri=$URI
iodepth=16
numjobs=2
size=8M
[w]
rw=write
bs=4k
rate_iops=1500
offset_increment=16M
[r]
rw=read
bs=64k
rate_iops=40
offset=32M
offset_increment=16M
FIOEOF
(cd "$T" && exec timeout --kill-after=5 120 fio --output="$T/fio.out" load.fio) &
fio_pid=$!
track_pid "$fio_pid"
scrapes=0 mid=0
fio_running() { _pid_alive "$fio_pid"; }
fio_gone() { ! fio_running; }
while fio_running; do
    m=$(scrape) || fail "a scrape during the run failed or took over 2 s"
    scrapes=$((scrapes + 1))
    # Half-way: some of the 4096 writes and 256 reads counted, not all.
    n=$(($(value "$m" "$(cmd_sample requests_total write)") +
        $(value "$m" "$(cmd_sample requests_total read)")))
    if ((n > 0 && n < 4352)); then
        mid=$((mid + 1))
    fi
    # The next scrape when fio ends or 0.2 s have passed.
    wait_until 0.2 fio_gone || true
done
wait "$fio_pid" || { cat "$T/fio.out" >&2; fail "fio failed"; }
((mid >= 2)) || fail "only $mid of $scrapes scrapes saw the run half-way"
touch "$T/idle.stop"
wait_file 10 "$T/idle.result" "$holder" || fail "the idle clients did not report"
still=$(<"$T/idle.result")
[[ $still == 50 ]] || fail "$still of 50 idle connections still open after the run"
ok "$scrapes scrapes answered within 2 s each ($mid mid-run); 50 idle connections open throughout"

check "the counters equal what fio did"
# A request counts when its reply has left the socket: the last ones may
# land a moment after fio saw them.
m=
settled() {
    m=$(scrape) &&
        [[ $(value "$m" "$(cmd_sample requests_total write)") == 4096 &&
            $(value "$m" "$(cmd_sample requests_total read)") == 256 &&
            $(value "$m" 'blockport_requests_in_flight{export="load"}') == 0 ]]
}
wait_until 5 settled || true
expect() {
    local got
    got=$(value "$m" "$1")
    [[ $got == "$2" ]] || fail "$1 is $got, expected $2"
}
expect "$(cmd_sample requests_total write)" 4096
expect "$(cmd_sample requests_total read)" 256
expect "$(cmd_sample request_errors_total write)" 0
expect "$(cmd_sample request_errors_total read)" 0
expect 'blockport_written_bytes_total{export="load"}' 16777216
expect 'blockport_read_bytes_total{export="load"}' 16777216
expect 'blockport_requests_in_flight{export="load"}' 0
expect 'blockport_requests_in_flight_bytes{export="load"}' 0
expect 'blockport_export_connections{export="load"}' 0
expect "$(cmd_sample request_duration_seconds_count write)" 4096
expect "$(cmd_sample request_duration_seconds_count read)" 256
# fio's own account agrees: "issued rwts: total=READS,WRITES,..." per job.
awk '/issued rwts: total=/ { split($0, a, "total="); split(a[2], v, ",");
                             r += v[1]; w += v[2] }
     END { if (r != 256 || w != 4096) { print r " reads, " w " writes"; exit 1 } }' \
    "$T/fio.out" || fail "fio did not issue what the job file says"
ok "4096 writes and 256 reads, 16 MiB each way, as fio reports; nothing in flight"

check "the histogram: 29 bounds from 1e-06 to 10, then +Inf, cumulative"
for cmd in read write; do
    want=4096
    [[ $cmd == read ]] && want=256
    awk -v cmd="$cmd" -v want="$want" '
        BEGIN { p = "blockport_request_duration_seconds_bucket{export=\"load\",cmd=\"" cmd "\",le=\"" }
        index($0, p) == 1 {
            le = substr($0, length(p) + 1); sub(/".*/, "", le)
            les[n++] = le
            if (n > 1 && $NF + 0 < last + 0) { print "decreases at le=" le; bad = 1 }
            last = $NF
        }
        END {
            if (n != 30) { print n " buckets"; exit 1 }
            if (les[0] != "1e-06" || les[28] != "10" || les[29] != "+Inf") {
                print "bounds " les[0] " .. " les[28] " " les[29]; exit 1
            }
            if (last != want) { print "+Inf bucket " last ", expected " want; exit 1 }
            exit bad
        }' <<<"$m" || fail "the $cmd histogram is wrong"
done
ok "30 buckets each, le=\"1e-06\" first, \"10\" last, +Inf equal to the count"

check "every metric the Grafana dashboard uses is exposed"
scrape >"$T/scrape.txt" || fail "no scrape"
"$PY" "$TREE/contrib/grafana/check-dashboard.py" --except blockport_mount_ \
    --except blockport_vhost_ \
    "$TREE/contrib/grafana/blockport-dashboard.json" "$T/scrape.txt" ||
    fail "the dashboard uses metrics the server does not expose"
ok "the dashboard's metrics are all in a scrape"

stop_server
