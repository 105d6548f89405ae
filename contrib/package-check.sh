#!/bin/bash
# SPDX-License-Identifier: BSD-3-Clause
# Build the Debian package from build/ (cpack -G DEB), install it with
# apt-get (which pulls its dependencies), serve an image with the installed
# /usr/bin/blockport, read it back with nbdinfo, and remove the package.
# CI runs this on its fresh machine; it needs root and changes the system.
set -euo pipefail
cd "$(dirname "$0")/.."
[ "$(id -u)" -eq 0 ] || { echo "package-check: needs root" >&2; exit 1; }
rm -rf build/pkg
(cd build && cpack -G DEB -B "$PWD/pkg" >/dev/null)
deb=$(ls build/pkg/blockport_*.deb)
echo "== installing $deb"
DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "./$deb" >/dev/null
pid=
cleanup() {
  [ -z "$pid" ] || kill "$pid" 2>/dev/null || true
  DEBIAN_FRONTEND=noninteractive apt-get remove -y -qq blockport >/dev/null 2>&1 || true
}
trap cleanup EXIT
w=$(mktemp -d)
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
rm -rf "$w"
echo "== package installed, served an image, removed: ok"
