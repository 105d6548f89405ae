#!/bin/bash
# SPDX-License-Identifier: BSD-3-Clause
# Build a tiny test guest from Debian packages: Debian's cloud kernel and an
# initramfs holding busybox, the virtio modules and a payload.  Nothing
# prebuilt is committed; the kernel package is downloaded once and cached.
#
# usage: contrib/guest/make-guest.sh OUTDIR [PAYLOAD-FILE...]
#   OUTDIR/vmlinuz      the kernel
#   OUTDIR/initrd.gz    the initramfs; its /init loads virtio-blk, mounts
#                       /proc, /sys and /dev, runs /payload/run.sh (if any
#                       PAYLOAD-FILE is named run.sh) and powers off
# PAYLOAD-FILEs land in /payload; an executable that is dynamically linked
# takes its shared libraries along (so fio can run in the guest).
# Boot: qemu-system-x86_64 -accel tcg -m 512 -nographic -no-reboot \
#         -kernel OUTDIR/vmlinuz -initrd OUTDIR/initrd.gz \
#         -append "console=ttyS0 quiet panic=-1"
# Needs: apt-get (download only), dpkg-deb, busybox-static, cpio, gzip.
#
# usage: contrib/guest/make-guest.sh --fetch-kernel
#   only download the kernel into $GUEST_CACHE (default
#   /tmp/blockport-guest-cache), as contrib/install-deps.sh does so that
#   the tests never run apt-get.  GUEST_OFFLINE=1: exit 3 instead of
#   downloading a kernel that is not in the cache.
set -euo pipefail
OUT=${1:?usage: make-guest.sh OUTDIR [PAYLOAD-FILE...] | --fetch-kernel}
shift
FETCH_ONLY=
if [ "$OUT" = --fetch-kernel ]; then
  FETCH_ONLY=1
  OUT=${GUEST_CACHE:=/tmp/blockport-guest-cache}
fi
mkdir -p "$OUT"
OUT=$(readlink -f "$OUT")
CACHE=${GUEST_CACHE:-$OUT/cache}
mkdir -p "$CACHE"

MODULES="virtio_ring virtio virtio_pci_modern_dev virtio_pci_legacy_dev virtio_pci virtio_blk"

# ---- the kernel, once ----
if [ ! -s "$CACHE/vmlinuz" ] || [ ! -d "$CACHE/modules" ]; then
  if [ -n "${GUEST_OFFLINE:-}" ]; then
    echo "make-guest: no kernel in $CACHE (make-guest.sh --fetch-kernel downloads it)" >&2
    exit 3
  fi
  pkg=$(apt-cache depends linux-image-cloud-amd64 |
    awk '/Depends: linux-image-/ {print $2; exit}')
  [ -n "$pkg" ] || { echo "make-guest: no linux-image-cloud-amd64 in apt" >&2; exit 1; }
  tmp=$(mktemp -d "$CACHE/dl.XXXX")
  # apt's sandbox user cannot write into root-owned temporary directories.
  chmod 0777 "$tmp"
  (cd "$tmp" && apt-get download -q "$pkg" >/dev/null 2>&1) ||
    { echo "make-guest: apt-get download $pkg failed" >&2; rm -rf "$tmp"; exit 1; }
  dpkg-deb -x "$tmp"/*.deb "$tmp/root"
  cp "$tmp"/root/boot/vmlinuz-* "$CACHE/vmlinuz"
  rm -rf "$CACHE/modules"
  mkdir -p "$CACHE/modules"
  for m in $MODULES; do
    f=$(find "$tmp/root/lib/modules" -name "$m.ko*" | head -n 1)
    [ -n "$f" ] || { echo "make-guest: module $m not found in $pkg" >&2; exit 1; }
    case $f in
      *.xz) xz -dc "$f" >"$CACHE/modules/$m.ko" ;;
      *.zst) zstd -qdc "$f" >"$CACHE/modules/$m.ko" ;;
      *) cp "$f" "$CACHE/modules/$m.ko" ;;
    esac
  done
  rm -rf "$tmp"
fi
[ -z "$FETCH_ONLY" ] || exit 0
cp "$CACHE/vmlinuz" "$OUT/vmlinuz"

# ---- the initramfs, every time (payloads differ) ----
root=$(mktemp -d "$OUT/root.XXXX")
trap 'rm -rf "$root"' EXIT
mkdir -p "$root"/{bin,dev,proc,sys,tmp,payload,modules,lib64,lib/x86_64-linux-gnu}
cp "$(command -v busybox)" "$root/bin/busybox"
file "$root/bin/busybox" 2>/dev/null | grep -q "dynamically" &&
  { echo "make-guest: busybox must be static (busybox-static)" >&2; exit 1; }
ln -s busybox "$root/bin/sh"
cp "$CACHE"/modules/*.ko "$root/modules/"

# A payload file, and the shared libraries of a dynamic executable.
add_libs() {
  ldd "$1" 2>/dev/null | awk '/=> \// {print $3} /^\t\/lib64\// {print $1}' |
    while read -r lib; do
      dest="$root$(dirname "$lib")"
      mkdir -p "$dest"
      cp -L "$lib" "$dest/"
    done
}
for f in "$@"; do
  cp -L "$f" "$root/payload/"
  [ -x "$f" ] && ldd "$f" >/dev/null 2>&1 && add_libs "$f"
done

cat >"$root/init" <<'INIT'
#!/bin/sh
/bin/busybox --install -s /bin
export PATH=/bin
mount -t proc proc /proc
mount -t sysfs sys /sys
mount -t devtmpfs dev /dev
for m in MODULES; do insmod /modules/$m.ko || echo "GUEST: insmod $m failed"; done
# Give the PCI probe a moment to create the disks.
for i in 1 2 3 4 5 6 7 8 9 10; do [ -b /dev/vda ] && break; sleep 0.2; done
if [ -f /payload/run.sh ]; then
  sh /payload/run.sh
else
  echo "GUEST: no payload"
fi
echo "GUEST: done"
poweroff -f
INIT
sed -i "s/MODULES/$MODULES/" "$root/init"
chmod +x "$root/init"
(cd "$root" && find . | cpio -o -H newc --quiet | gzip -1 >"$OUT/initrd.gz")
