#!/bin/bash
# SPDX-License-Identifier: BSD-3-Clause
# Log levels: --log-level filters what the long-running commands print
# (one line per event, "blockport: LEVEL: ..."); a bad level is a usage
# error.
source "$(dirname "$0")/lib.sh"
cd "$T"

# vhost_log LEVEL: start and stop blockport vhost, its stderr in vh.log.
vhost_log() {
  "$BLOCKPORT" vhost --socket "$T/v.sock" --pid-file "$T/v.pid" \
    ${1:+--log-level "$1"} memory:1M 2>vh.log &
  local pid=$!
  track_pid $pid
  wait_file 5 v.pid $pid || fail "vhost did not start"
  kill -TERM $pid
  wait $pid || fail "vhost exit status $?"
  rm -f v.pid
}

if has_feature vhost; then
  check "info by default, nothing below error with --log-level error"
  vhost_log ""
  grep -q "^blockport: info: vhost: serving" vh.log || { cat vh.log; fail "no info line"; }
  vhost_log error
  [ ! -s vh.log ] || { cat vh.log; fail "--log-level error still printed"; }
  vhost_log debug
  grep -q "^blockport: info:" vh.log || fail "debug hides info"
  ok "levels filter"

  check "a bad level: exit 1 and a message"
  rc=0; "$BLOCKPORT" vhost --socket "$T/v.sock" --log-level loud memory:1M 2>err.txt || rc=$?
  [ $rc -eq 1 ] && grep -q "loud" err.txt || { cat err.txt; fail "exit $rc"; }
  ok "refused"
else
  skip_case "blockport was built without vhost: its log levels not tried"
fi

check "serve: --log-level error keeps it quiet; a bad level is a usage error"
rc=0; "$BLOCKPORT" serve --log-level bogus memory:1M 2>err.txt || rc=$?
[ $rc -eq 1 ] || fail "serve with a bad level: exit $rc"
start_server --log-level error memory:1M
nbdinfo --size "$URI" >/dev/null 2>&1 || true
stop_server
grep -q "info:" "$T/server.log" && { cat "$T/server.log"; fail "info lines at level error"; }
ok "quiet"
