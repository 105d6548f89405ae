#!/bin/bash
# SPDX-License-Identifier: BSD-3-Clause
# nbdinfo against blockport: export properties (--json), export listing of a
# multi-export server (--list --json), --readonly, a missing export name.
source "$(dirname "$0")/lib.sh"
require nbdinfo truncate
require_py_nbd

A_SIZE=$((48 * 1024 * 1024 + 4096)) # not a power of two on purpose
B_SIZE=$((32 * 1024 * 1024))
C_SIZE=$((1024 * 1024 * 1024))
truncate -s $A_SIZE "$T/a.img"

# check_info JSONFILE NAME SIZE READONLY [CANONICAL]
# Asserts the properties of one export in nbdinfo --json output.  nbdinfo
# prints the server's canonical name (NBD_INFO_NAME) when there is one, so
# the default export "" may show up as CANONICAL.
check_info() {
    "$PY" - "$@" <<'EOF'
import json, sys
path, name, size, readonly = sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[4] == "1"
names = {name} | ({sys.argv[5]} if len(sys.argv) > 5 else set())
d = json.load(open(path))
errors = []
warnings = []
def err(m): errors.append(m)

if d.get("protocol") != "newstyle-fixed":
    err("protocol %r, expected newstyle-fixed" % d.get("protocol"))
if d.get("structured") is not True:
    err("structured replies not negotiated")
exps = [e for e in d["exports"] if e.get("export-name") in names]
if len(exps) != 1 or len(d["exports"]) != 1:
    err("expected one export named %r, got %r" % (sorted(names), [e.get("export-name") for e in d["exports"]]))
    print("\n".join(errors)); sys.exit(1)
e = exps[0]
print("export %r (requested %r):" % (e.get("export-name"), name), json.dumps({k: v for k, v in e.items() if k != "uri"}, sort_keys=True))

if e.get("export-size") != size:
    err("export-size %r, expected %d" % (e.get("export-size"), size))
if e.get("is_read_only") is not readonly:
    err("is_read_only %r, expected %r" % (e.get("is_read_only"), readonly))
for k in ("can_flush", "can_fua", "can_trim", "can_zero", "can_multi_conn",
          "can_cache", "can_fast_zero", "can_df", "is_rotational"):
    if not isinstance(e.get(k), bool):
        err("%s missing or not a boolean: %r" % (k, e.get(k)))
if e.get("can_multi_conn") is not True:
    err("can_multi_conn %r, expected true" % e.get("can_multi_conn"))
if e.get("can_df") is not True:
    err("can_df %r, expected true (structured replies)" % e.get("can_df"))
if e.get("can_flush") is not True:
    err("can_flush %r, expected true" % e.get("can_flush"))
if not readonly:
    for k in ("can_fua", "can_trim", "can_zero", "can_cache", "can_fast_zero"):
        if e.get(k) is not True:
            err("%s %r, expected true on a writable export" % (k, e.get(k)))
else:
    for k in ("can_trim", "can_zero"):
        if e.get(k):
            warnings.append("%s advertised on a read-only export" % k)
ctx = e.get("contexts") or []
for c in ("base:allocation", "qemu:allocation-depth"):
    if c not in ctx:
        err("meta context %s not listed (contexts: %r)" % (c, ctx))
if e.get("block_size_maximum") != 33554432:
    err("block_size_maximum %r, expected 33554432" % e.get("block_size_maximum"))
mn, pref = e.get("block_size_minimum"), e.get("block_size_preferred")
if not isinstance(mn, int) or not isinstance(pref, int):
    err("block_size_minimum/preferred missing: %r %r" % (mn, pref))
else:
    if mn < 1 or mn & (mn - 1) or mn > 65536:
        err("block_size_minimum %d is not a power of two in [1,64K]" % mn)
    if pref < 512 or pref & (pref - 1) or pref < mn or pref > 33554432:
        err("block_size_preferred %d invalid (min %d)" % (pref, mn))
for w in warnings:
    print("  warning: " + w)
if errors:
    print("\n".join("  error: " + m for m in errors))
    sys.exit(1)
EOF
}

########################################################################
start_server "alpha=$T/a.img" "beta=memory:$B_SIZE" "gamma=null:$C_SIZE"

check "nbdinfo --json on the default export \"\" (raw file, writable)"
run nbdinfo --json "$URI" >"$T/def.json" || fail "nbdinfo --json failed"
check_info "$T/def.json" "" $A_SIZE 0 alpha || fail "default export properties wrong"
ok "default export properties"

check "nbdinfo --json on named exports alpha (raw), beta (memory:), gamma (null:)"
run nbdinfo --json "$(export_uri alpha)" >"$T/alpha.json" || fail "nbdinfo alpha failed"
check_info "$T/alpha.json" alpha $A_SIZE 0 || fail "alpha properties wrong"
run nbdinfo --json "$(export_uri beta)" >"$T/beta.json" || fail "nbdinfo beta failed"
check_info "$T/beta.json" beta $B_SIZE 0 || fail "beta properties wrong"
run nbdinfo --json "$(export_uri gamma)" >"$T/gamma.json" || fail "nbdinfo gamma failed"
"$PY" -c '
import json, sys
e = json.load(open(sys.argv[1]))["exports"][0]
print("gamma:", e["export-size"], "read-only:", e["is_read_only"])
assert e["export-size"] == int(sys.argv[2]), "gamma size %r" % e["export-size"]
assert e["block_size_maximum"] == 33554432
' "$T/gamma.json" $C_SIZE || fail "gamma (null:) properties wrong"
ok "named exports"

check "nbdinfo --size"
sz=$(run nbdinfo --size "$(export_uri beta)")
[[ $sz == "$B_SIZE" ]] || fail "nbdinfo --size beta: $sz, expected $B_SIZE"
ok "size $sz"

check "nbdinfo --can / --is exit codes"
run nbdinfo --can multi-conn "$URI" || fail "--can multi-conn false"
run nbdinfo --can flush "$URI" || fail "--can flush false"
rc=0
run nbdinfo --is read-only "$URI" || rc=$?
[[ $rc -eq 2 ]] || fail "--is read-only on a writable export exited $rc, expected 2 (false)"
ok "--can/--is"

# The default export "" is an alias of the first export: LIST names each
# export once, under its own name.
check "nbdinfo --list --json lists alpha, beta, gamma with their sizes"
run nbdinfo --list --json "$URI" >"$T/list.json" || fail "nbdinfo --list failed"
"$PY" - "$T/list.json" $A_SIZE $B_SIZE $C_SIZE <<'EOF' || fail_soft "nbdinfo --list: export list wrong (see above)"
import json, sys
d = json.load(open(sys.argv[1]))
a, b, c = (int(x) for x in sys.argv[2:5])
names = [e.get("export-name") for e in d["exports"]]
print("listed exports:", names)
expect = {"alpha": a, "beta": b, "gamma": c}
if sorted(names) != sorted(expect):
    print("listed names %r, expected %r" % (sorted(names), sorted(expect)))
    bad = True
else:
    bad = False
for e in d["exports"]:
    n = e["export-name"]
    if n not in expect:
        sys.exit("unexpected export %r listed" % n)
    if e.get("export-size") != expect[n]:
        sys.exit("export %r listed size %r, expected %d" % (n, e.get("export-size"), expect[n]))
    for c in ("base:allocation", "qemu:allocation-depth"):
        if c not in (e.get("contexts") or []):
            sys.exit("export %r lacks context %s" % (n, c))
if bad:
    sys.exit(1)
EOF
ok "export list checked"

check "connecting to a non-existent export fails"
rc=0
run nbdinfo "$(export_uri no-such-export)" >"$T/nosuch.out" 2>&1 || rc=$?
cat "$T/nosuch.out"
[[ $rc -ne 0 ]] || fail "nbdinfo on a non-existent export succeeded"
ok "refused (exit $rc)"

check "server still serves after the list/info probing"
run nbdinfo --size "$URI" >/dev/null || fail "nbdinfo failed after probing"
stop_server

########################################################################
check "--readonly: is_read_only true on every export"
start_server --readonly "alpha=$T/a.img" "beta=memory:$B_SIZE"
run nbdinfo --json "$URI" >"$T/ro.json" || fail "nbdinfo --json (readonly) failed"
check_info "$T/ro.json" "" $A_SIZE 1 alpha || fail "readonly default export properties wrong"
run nbdinfo --json "$(export_uri beta)" >"$T/ro-beta.json" || fail "nbdinfo beta (readonly) failed"
check_info "$T/ro-beta.json" beta $B_SIZE 1 || fail "readonly beta properties wrong"
run nbdinfo --is read-only "$URI" || fail "nbdinfo --is read-only false on --readonly server"
ok "read-only"
stop_server

########################################################################
check "TCP: nbdinfo --json and --list over nbd://127.0.0.1"
start_server_tcp "alpha=$T/a.img" "beta=memory:$B_SIZE"
run nbdinfo --json "$URI" >"$T/tcp.json" || fail "nbdinfo over TCP failed"
check_info "$T/tcp.json" "" $A_SIZE 0 alpha || fail "TCP export properties wrong"
run nbdinfo --list --json "$URI" >"$T/tcplist.json" || fail "nbdinfo --list over TCP failed"
"$PY" -c '
import json, sys
names = sorted(e["export-name"] for e in json.load(open(sys.argv[1]))["exports"])
print("listed:", names)
assert names == ["alpha", "beta"], names
' "$T/tcplist.json" || fail_soft "TCP: nbdinfo --list export list wrong"
ok "TCP"
stop_server

check "the server's file paths stay private unless a description is given"
start_server "alpha=$T/a.img" "beta=memory:$B_SIZE"
run nbdinfo --list "$URI" >"$T/private.txt" || fail "nbdinfo --list failed"
run nbdinfo "nbd+unix:///alpha?socket=$SOCK" >>"$T/private.txt" || fail "nbdinfo failed"
grep -q "alpha" "$T/private.txt" || fail "no export listed: $(cat "$T/private.txt")"
# (nbdinfo prints the URI it used, which names the socket: not sent.)
if grep -v "uri: " "$T/private.txt" | grep -E "$T|a\.img|memory:|description"; then
    fail "a path or description was sent without --description"
fi
stop_server
start_server --description "Build VM root disk" "alpha=$T/a.img"
run nbdinfo "nbd+unix:///alpha?socket=$SOCK" >"$T/desc.txt" || fail "nbdinfo failed"
grep -q "description: Build VM root disk" "$T/desc.txt" ||
    fail "--description not sent: $(cat "$T/desc.txt")"
stop_server
ok "no path by default; --description sent"

echo "PASS"
