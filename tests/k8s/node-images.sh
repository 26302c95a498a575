#!/usr/bin/env bash
# Builds the images a real test node needs besides gpuops's own (scripts/image), without a
# registry or a daemon:
#   registry.k8s.io/pause:3.10.1   the sandbox image: node-images/pause.c, gcc -static
#   gpuops.test/busybox:<version>   a small test image: Debian's busybox-static and its applet links
# as docker-archives under ${GPUOPS_CACHE:-~/.cache/gpuops}/node-images/<key>/, keyed by this
# script, pause.c and the busybox-static version; built once.
# stdout: exactly `GPUOPS_PAUSE_IMAGE=<tar>`, `GPUOPS_PAUSE_REF=<ref>`, `GPUOPS_BUSYBOX_IMAGE=<tar>`,
# `GPUOPS_BUSYBOX_REF=<ref>` (eval-able); progress on stderr. Exit 1 naming what failed.
set -euo pipefail
exec 3>&1 1>&2
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
repo=$(cd "$here/../.." && pwd)
say() { printf '[node-images] %s\n' "$*" >&2; }
die() { printf '[node-images] ERROR: %s\n' "$*" >&2; exit 1; }
PAUSE_REF=registry.k8s.io/pause:3.10.1
for tool in gcc apt-get apt-cache dpkg-deb sha256sum tar; do
  command -v "$tool" >/dev/null || die "'$tool' is needed (Debian: apt-get install gcc libc6-dev apt dpkg tar)"
done
arch=$(dpkg --print-architecture)
bb_version=$(apt-cache policy busybox-static 2>/dev/null | sed -n 's/^ *Candidate: //p')
[ -n "$bb_version" ] && [ "$bb_version" != "(none)" ] ||
  die "Debian's package index has no busybox-static (run apt-get update)"
bb_tag=${bb_version#*:}
BUSYBOX_REF=gpuops.test/busybox:${bb_tag//[^A-Za-z0-9_.-]/_}
key=$(cat "${BASH_SOURCE[0]}" "$here/node-images/pause.c" "$repo/scripts/lib/docker-archive.sh" |
  { sha256sum; echo "busybox-static=$bb_version $arch"; } | sha256sum | cut -c1-16)
dir="${GPUOPS_CACHE:-$HOME/.cache/gpuops}/node-images/$key"
result() {
  printf 'GPUOPS_PAUSE_IMAGE=%s\nGPUOPS_PAUSE_REF=%s\nGPUOPS_BUSYBOX_IMAGE=%s\nGPUOPS_BUSYBOX_REF=%s\n' \
    "$dir/pause.tar" "$PAUSE_REF" "$dir/busybox.tar" "$BUSYBOX_REF" >&3
}
if [ -f "$dir/pause.tar" ] && [ -f "$dir/busybox.tar" ]; then
  touch "$dir"; say "cached: $dir"; result; exit 0
fi
mkdir -p "$dir"
tmp=$(mktemp -d "$dir/.tmp.XXXXXX")
trap 'rm -rf "$tmp"' EXIT
# shellcheck source=../../scripts/lib/docker-archive.sh
source "$repo/scripts/lib/docker-archive.sh"
config() { # entrypoint-json
  printf '{"architecture":"%s","os":"linux","created":"1970-01-01T00:00:00Z","config":{"Env":["PATH=/bin"],"Entrypoint":%s,"WorkingDir":"/"}}' "$arch" "$1"
}

mkdir -p "$tmp/pause"
gcc -static -Os -s -o "$tmp/pause/pause" "$here/node-images/pause.c" 2>"$tmp/gcc.log" ||
  die "gcc -static pause.c failed (needs libc6-dev): $(cat "$tmp/gcc.log")"
docker_archive "$tmp/pause" "$PAUSE_REF" "$tmp/pause.tar" 0 "$(config '["/pause"]')" || die "packing pause"

opts=()
[ "$(id -u)" = 0 ] && opts=(-o APT::Sandbox::User=root)
(cd "$tmp" && apt-get download -q "${opts[@]}" "busybox-static:$arch=$bb_version" >&2) ||
  die "apt-get download busybox-static=$bb_version failed"
dpkg-deb -x "$tmp"/busybox-static_*.deb "$tmp/bb-deb"
mkdir -p "$tmp/busybox/bin" "$tmp/busybox/tmp" "$tmp/busybox/etc"
chmod 1777 "$tmp/busybox/tmp"
cp "$tmp/bb-deb/bin/busybox" "$tmp/busybox/bin/busybox"
for applet in $("$tmp/busybox/bin/busybox" --list); do
  # `busybox` itself is in the list; a link to itself would replace the binary.
  [ "$applet" = busybox ] || ln -sf busybox "$tmp/busybox/bin/$applet"
done
printf 'root:x:0:0:root:/:/bin/sh\nnobody:x:65534:65534:nobody:/:/bin/false\n' > "$tmp/busybox/etc/passwd"
printf 'root:x:0:\nnobody:x:65534:\n' > "$tmp/busybox/etc/group"
docker_archive "$tmp/busybox" "$BUSYBOX_REF" "$tmp/busybox.tar" 0 "$(config '["/bin/sh"]')" || die "packing busybox"
mv "$tmp/pause.tar" "$tmp/busybox.tar" "$dir/"
say "built $PAUSE_REF ($(stat -c %s "$dir/pause.tar") bytes) and $BUSYBOX_REF ($(stat -c %s "$dir/busybox.tar") bytes) in $dir"
result
