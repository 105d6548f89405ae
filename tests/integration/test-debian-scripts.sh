#!/bin/bash
# SPDX-License-Identifier: BSD-3-Clause
# The Debian package's maintainer scripts (contrib/debian/), run here with
# stand-ins for the commands they call and with their system paths
# (/run/systemd/system, /var/lib/blockport) moved into a directory of
# ours, so that each branch runs without root and without touching the
# machine: postinst makes the user with systemd-sysusers, or with adduser
# when there is none, makes the state directory for it, and reloads
# systemd only when it runs; prerm stops
# every blockport unit on removal and never fails; postrm reloads systemd,
# and on purge removes the state directory only when it is empty.
# (contrib/package-check.sh installs and purges the real package.)
source "$(dirname "$0")/lib.sh"
require sh
DEB=$(readlink -f "$(dirname "$0")/../../contrib/debian")

mkdir -p "$T/bin" "$T/scripts"
# Stand-ins: each logs its name and arguments; STUB_FAIL makes it fail.
for c in systemd-sysusers adduser systemctl getent deb-systemd-invoke; do
    cat >"$T/bin/$c" <<EOF
#!/bin/sh
echo "$c \$*" >>"$T/calls"
case " \${STUB_FAIL:-} " in *" $c "*) exit 1 ;; esac
[ "$c" != getent ] || [ -n "\${USER_EXISTS:-}" ] || exit 2
exit 0
EOF
    chmod +x "$T/bin/$c"
done
ln -s "$(command -v rmdir)" "$T/bin/rmdir"
ln -s "$(command -v mkdir)" "$T/bin/mkdir"
# install -d ... DIR: logged, and DIR made (no chown without root).
cat >"$T/bin/install" <<EOF
#!/bin/sh
echo "install \$*" >>"$T/calls"
for a; do last=\$a; done
mkdir -p "\$last"
EOF
chmod +x "$T/bin/install"

for s in postinst prerm postrm; do
    [[ -x $DEB/$s ]] || fail "$s is not executable"
    sh -n "$DEB/$s" || fail "$s: sh -n"
    sed -e "s|/run/systemd/system|$T/run/systemd/system|g" \
        -e "s|/var/lib/blockport|$T/var/lib/blockport|g" "$DEB/$s" >"$T/scripts/$s"
done

# run SCRIPT ARG [VAR=VALUE...]: the script under /bin/sh (dash on
# Debian, as dpkg runs it) with only the stand-ins on PATH.  Sets RC;
# CALLS holds what it called.
run_script() {
    local s=$1 arg=$2
    shift 2
    : >"$T/calls"
    RC=0
    env -i PATH="$T/bin" "$@" /bin/sh "$T/scripts/$s" "$arg" >"$T/out" 2>&1 || RC=$?
    CALLS=$(cat "$T/calls")
}

expect() { # DESCRIPTION WANT-RC WANT-CALLS
    [[ $RC -eq $2 ]] || fail_soft "$1: exit status $RC, expected $2 ($(cat "$T/out"))"
    [[ $CALLS == "$3" ]] || fail_soft "$1: called [$CALLS], expected [$3]"
}

check "postinst configure: the user, then systemd told (when it runs)"
run_script postinst configure
expect "with systemd-sysusers, no systemd" 0 "systemd-sysusers blockport.conf
install -d -m 0750 -o blockport -g blockport $T/var/lib/blockport"
[[ -d $T/var/lib/blockport ]] || fail_soft "postinst: no state directory"
mkdir -p "$T/run/systemd/system"
run_script postinst configure
expect "with systemd-sysusers and systemd" 0 "systemd-sysusers blockport.conf
systemctl daemon-reload"
rm "$T/bin/systemd-sysusers"
run_script postinst configure
expect "without systemd-sysusers" 0 "getent passwd blockport
adduser --quiet --system --group --no-create-home --home $T/var/lib/blockport --comment blockport NBD server blockport
systemctl daemon-reload"
run_script postinst configure USER_EXISTS=1
expect "without systemd-sysusers, the user there" 0 "getent passwd blockport
systemctl daemon-reload"
run_script postinst configure STUB_FAIL=systemctl
expect "a failed daemon-reload" 0 "getent passwd blockport
adduser --quiet --system --group --no-create-home --home $T/var/lib/blockport --comment blockport NBD server blockport
systemctl daemon-reload"
run_script postinst configure STUB_FAIL=adduser
[[ $RC -ne 0 ]] || fail_soft "postinst: a failed adduser went unnoticed"
run_script postinst abort-upgrade
expect "abort-upgrade" 0 ""
ok "systemd-sysusers, else adduser --system; the state directory; daemon-reload only under systemd"

check "prerm: the units stopped on removal, and a failure ignored"
stop="deb-systemd-invoke stop blockport.socket blockport.service blockport@*.service"
for arg in remove deconfigure; do
    run_script prerm "$arg"
    expect "prerm $arg" 0 "$stop"
done
run_script prerm remove STUB_FAIL=deb-systemd-invoke
expect "prerm remove, the stop failing" 0 "$stop"
run_script prerm upgrade
expect "prerm upgrade" 0 ""
rmdir "$T/run/systemd/system"
run_script prerm remove
expect "prerm remove without systemd" 0 ""
ok "stopped under systemd, status 0 always"

check "postrm: systemd reloaded; purge keeps a state directory with images"
mkdir -p "$T/run/systemd/system" "$T/var/lib/blockport"
run_script postrm remove
expect "postrm remove" 0 "systemctl daemon-reload"
[[ -d $T/var/lib/blockport ]] || fail_soft "postrm remove removed the state directory"
echo data >"$T/var/lib/blockport/disk.raw"
run_script postrm purge STUB_FAIL=systemctl
expect "postrm purge, an image left" 0 "systemctl daemon-reload"
[[ -f $T/var/lib/blockport/disk.raw ]] || fail_soft "purge removed an image"
grep -q "not empty" "$T/out" || fail_soft "purge: no word of the directory kept"
rm "$T/var/lib/blockport/disk.raw"
run_script postrm purge
expect "postrm purge, empty" 0 "systemctl daemon-reload"
[[ ! -d $T/var/lib/blockport ]] || fail_soft "purge kept an empty state directory"
run_script postrm purge
expect "postrm purge again" 0 "systemctl daemon-reload"
ok "images kept, an empty directory removed, status 0"
