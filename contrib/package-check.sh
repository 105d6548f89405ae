#!/bin/bash
# SPDX-License-Identifier: BSD-3-Clause
# Build the Debian package from build/ (cpack -G DEB), check its
# maintainer scripts and conffiles, install it with apt-get (which pulls
# its dependencies), check what it installed (the user, /etc/blockport,
# man pages, units), serve an image with the installed /usr/bin/blockport,
# read it back with nbdinfo, and remove and purge the package.
# CI runs this on its fresh machine; it needs root and changes the system.
set -euo pipefail
cd "$(dirname "$0")/.."
[ "$(id -u)" -eq 0 ] || { echo "package-check: needs root" >&2; exit 1; }
rm -rf build/pkg
(cd build && cpack -G DEB -B "$PWD/pkg" >/dev/null)
deb=$(ls build/pkg/blockport_*.deb)
w=$(mktemp -d)
# Debian's own judge: no error and no warning (install-deps.sh --tests
# installs lintian; it says it runs as root, which CI does).
echo "== lintian $deb"
rc=0
lintian --fail-on error,warning "$deb" >"$w/lintian" 2>&1 || rc=$?
grep -v '^running with root privileges' "$w/lintian" || true
[ $rc -eq 0 ] || { echo "package-check: lintian: errors or warnings (above)" >&2; exit 1; }
# The maintainer scripts: there, executable (0755), and sh can parse them;
# the /etc/blockport examples are conffiles.
dpkg-deb -e "$deb" "$w/control"
for s in postinst prerm postrm; do
  [ "$(stat -c %a "$w/control/$s" 2>/dev/null)" = 755 ] ||
    { echo "package-check: $s missing from the package or not mode 0755" >&2; exit 1; }
  sh -n "$w/control/$s" || { echo "package-check: $s: sh -n" >&2; exit 1; }
done
for f in blockport.conf exports.conf instance.conf.example; do
  grep -qx "/etc/blockport/$f" "$w/control/conffiles" ||
    { echo "package-check: /etc/blockport/$f is not a conffile" >&2; exit 1; }
done
user_before=$(getent passwd blockport || true)
echo "== installing $deb"
DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "./$deb" >/dev/null
pid=
cleanup() {
  [ -z "$pid" ] || kill "$pid" 2>/dev/null || true
  DEBIAN_FRONTEND=noninteractive apt-get purge -y -qq blockport >/dev/null 2>&1 || true
}
trap cleanup EXIT
/usr/bin/blockport create -f qcow2 "$w/demo.qcow2" 64M >/dev/null
/usr/bin/blockport serve --unix "$w/s.sock" --pid-file "$w/pid" --format qcow2 "$w/demo.qcow2" 2>"$w/log" &
pid=$!
for _ in $(seq 100); do [ -s "$w/pid" ] && break; sleep 0.05; done
size=$(nbdinfo --size "nbd+unix:///?socket=$w/s.sock")
[ "$size" = 67108864 ] || { cat "$w/log"; echo "package-check: size $size" >&2; exit 1; }
# The pages, compressed (docs/man/), and map's with its options.
for p in blockport blockport-serve blockport-map; do
  [ -f /usr/share/man/man1/$p.1.gz ] ||
    { echo "package-check: no man page $p.1.gz installed" >&2; exit 1; }
done
zcat /usr/share/man/man1/blockport-map.1.gz | grep -q 'force\\-share' ||
  { echo "package-check: blockport-map.1.gz lacks its options" >&2; exit 1; }
getent passwd blockport >/dev/null ||
  { echo "package-check: the blockport system user was not created" >&2; exit 1; }
[ -n "$user_before" ] || echo "== postinst created the user: $(getent passwd blockport)"
getent group blockport >/dev/null ||
  { echo "package-check: no blockport group" >&2; exit 1; }
[ "$(stat -c %U:%G /var/lib/blockport 2>/dev/null)" = blockport:blockport ] ||
  { echo "package-check: /var/lib/blockport is not the service user's" >&2; exit 1; }
for d in changelog.gz copyright README.md CONFIG.md METRICS.md CEPH.md; do
  [ -f "/usr/share/doc/blockport/$d" ] ||
    { echo "package-check: /usr/share/doc/blockport/$d not installed" >&2; exit 1; }
done
for f in blockport.conf exports.conf instance.conf.example; do
  [ -f "/etc/blockport/$f" ] ||
    { echo "package-check: /etc/blockport/$f not installed" >&2; exit 1; }
done
# The units: clean for systemd-analyze, and a missing configuration is an
# error that says so (tests/integration/test-unit-config.sh runs the check).
units=$(dpkg -L blockport | grep -E '/blockport(@?\.service|\.socket)$')
mkdir "$w/units"
cp $units "$w/units/"
cp "$w/units/blockport@.service" "$w/units/blockport@demo.service"
if command -v systemd-analyze >/dev/null 2>&1; then
  out=$(cd "$w/units" && systemd-analyze verify ./blockport@demo.service ./blockport.service ./blockport.socket 2>&1) &&
    [ -z "$out" ] || { echo "package-check: systemd-analyze verify: $out" >&2; exit 1; }
fi
for u in blockport@.service blockport.service; do
  grep -q '^ExecStartPre=/bin/sh -c' "$w/units/$u" && grep -q 'is missing' "$w/units/$u" ||
    { echo "package-check: $u does not check for its configuration" >&2; exit 1; }
done
grep -qx 'License: BSD-3-Clause' /usr/share/doc/blockport/copyright ||
  { echo "package-check: no copyright file installed" >&2; exit 1; }
[ -f /usr/share/bash-completion/completions/blockport ] ||
  { echo "package-check: no bash completion installed" >&2; exit 1; }
nbdkit_dir=$(pkg-config --variable=plugindir nbdkit 2>/dev/null || true)
[ -z "$nbdkit_dir" ] || [ -f "$nbdkit_dir/nbdkit-blockport-plugin.so" ] ||
  { echo "package-check: no nbdkit plugin installed" >&2; exit 1; }
kill "$pid"; wait "$pid"
pid=
# The same image from a config file, and a reload adding an export.
[ -f /usr/share/doc/blockport/CONFIG.md ] ||
  { echo "package-check: no CONFIG.md installed" >&2; exit 1; }
printf '[export demo]\npath = %s\nread-only = yes\n' "$w/demo.qcow2" >"$w/exports.conf"
rm -f "$w/pid"
/usr/bin/blockport serve --unix "$w/s.sock" --pid-file "$w/pid" --config "$w/exports.conf" 2>"$w/log" &
pid=$!
for _ in $(seq 100); do [ -s "$w/pid" ] && break; sleep 0.05; done
printf '[export more]\npath = null:1M\n' >>"$w/exports.conf"
# As the units' ExecReload does: check the file, then signal.
unit=$(dpkg -L blockport | grep '/blockport@\.service$')
grep -q '^ExecReload=/usr/bin/blockport serve --check-config' "$unit" ||
  { echo "package-check: the unit does not check before reloading" >&2; exit 1; }
/usr/bin/blockport serve --check-config --config "$w/exports.conf" | grep -q "export 'more'" ||
  { echo "package-check: --check-config" >&2; exit 1; }
kill -HUP "$pid"
for _ in $(seq 100); do grep -q reloaded "$w/log" && break; sleep 0.05; done
size=$(nbdinfo --size "nbd+unix:///more?socket=$w/s.sock")
[ "$size" = 1048576 ] || { cat "$w/log"; echo "package-check: --config reload" >&2; exit 1; }
kill "$pid"; wait "$pid"
pid=
# Removal (prerm, postrm) keeps the edited configuration, purge removes it;
# neither may fail.
echo "# edited" >>/etc/blockport/exports.conf
DEBIAN_FRONTEND=noninteractive apt-get remove -y -qq blockport >/dev/null ||
  { echo "package-check: apt-get remove failed" >&2; exit 1; }
[ ! -e /usr/bin/blockport ] && [ -f /etc/blockport/exports.conf ] ||
  { echo "package-check: remove: binary left or configuration lost" >&2; exit 1; }
dpkg --purge blockport >/dev/null ||
  { echo "package-check: dpkg --purge failed" >&2; exit 1; }
[ ! -e /etc/blockport/exports.conf ] ||
  { echo "package-check: purge left /etc/blockport/exports.conf" >&2; exit 1; }
rm -rf "$w"
echo "== package installed, served an image, removed and purged: ok"
