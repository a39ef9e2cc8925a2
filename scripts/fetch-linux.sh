#!/usr/bin/env bash
# Fetches Debian's cloud kernel (the package the metapackage
# linux-image-cloud-amd64 depends on), unpacks its bzImage into a cache
# directory and prints the image's path. Idempotent: an image already in the
# cache is not fetched again. The image is never part of the repository.
#
#   bash scripts/fetch-linux.sh            # prints .../linux/vmlinuz-<version>
#   FAULTLINE_CACHE=/some/dir bash scripts/fetch-linux.sh
#
# `faultline run --guest linux` looks for the image in the same directory.
# Next to the image, vmlinuz-<version>.version records what was fetched:
# the package, its Debian version and the image's own version string (as
# the benches print it); the script prints that record on stderr too.
set -euo pipefail

META=linux-image-cloud-amd64
CACHE_DIR="${FAULTLINE_CACHE:-$HOME/.cache/faultline}/linux"

die() {
    echo "fetch-linux.sh: $*" >&2
    exit 1
}

command -v apt-cache >/dev/null 2>&1 || die "apt-cache is missing: this script needs a Debian-like host"
command -v apt-get >/dev/null 2>&1 || die "apt-get is missing"
command -v dpkg-deb >/dev/null 2>&1 || die "dpkg-deb is missing"

# The metapackage depends on exactly one versioned image package.
resolve() {
    apt-cache depends "$META" 2>/dev/null |
        awk '/^ *Depends: linux-image-[0-9]/ { print $2; exit }'
}
PKG="$(resolve || true)"
if [ -z "$PKG" ] && [ "$(id -u)" = 0 ]; then
    # The package lists may simply be missing (a fresh container).
    apt-get update -qq >/dev/null 2>&1 || true
    PKG="$(resolve || true)"
fi
[ -n "$PKG" ] || die "apt cannot resolve $META to an image package (no Debian package lists? run 'apt-get update')"

VERSION="${PKG#linux-image-}"
IMAGE="$CACHE_DIR/vmlinuz-$VERSION"
RECORD="$IMAGE.version"
if [ -s "$IMAGE" ]; then
    ln -sf "vmlinuz-$VERSION" "$CACHE_DIR/vmlinuz"
    [ -s "$RECORD" ] && echo "fetch-linux.sh: cached: $(cat "$RECORD")" >&2
    echo "$IMAGE"
    exit 0
fi

mkdir -p "$CACHE_DIR"
WORK="$(mktemp -d "$CACHE_DIR/.fetch.XXXXXX")"
trap 'rm -rf "$WORK"' EXIT
(cd "$WORK" && apt-get download "$PKG" >/dev/null 2>"$WORK/apt.err") ||
    die "apt-get download $PKG failed: $(tail -n 3 "$WORK/apt.err" 2>/dev/null)"
DEB="$(ls "$WORK"/*.deb 2>/dev/null | head -n 1)"
[ -n "$DEB" ] || die "apt-get download $PKG produced no .deb"
dpkg-deb -x "$DEB" "$WORK/root" || die "dpkg-deb could not unpack $DEB"
FOUND="$(ls "$WORK"/root/boot/vmlinuz-* 2>/dev/null | head -n 1)"
[ -n "$FOUND" ] || die "$DEB holds no /boot/vmlinuz-*"
cp "$FOUND" "$IMAGE.tmp"
mv "$IMAGE.tmp" "$IMAGE"
# The image's version string: the setup header's kernel_version field
# (a 16-bit offset at 0x20e, from 0x200), as `file(1)` reads it.
OFFSET="$(od -An -tu2 -j 526 -N 2 "$IMAGE" | tr -d ' ')"
BANNER=""
if [ -n "$OFFSET" ] && [ "$OFFSET" -gt 0 ]; then
    BANNER="$(dd if="$IMAGE" bs=1 skip=$((512 + OFFSET)) count=200 2>/dev/null | tr '\0' '\n' | head -n 1)"
fi
echo "$PKG $(dpkg-deb -f "$DEB" Version) ${BANNER:-(no version string)}" > "$RECORD"
echo "fetch-linux.sh: fetched: $(cat "$RECORD")" >&2
ln -sf "vmlinuz-$VERSION" "$CACHE_DIR/vmlinuz"
echo "$IMAGE"
