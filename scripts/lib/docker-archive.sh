# shellcheck shell=bash
# docker_archive ROOTFS REF OUT EPOCH CONFIG
#   Packs the directory ROOTFS as a one-layer image named REF (name:tag) into the docker-archive
#   OUT: manifest.json (with RepoTags), <config sha256>.json, <layer diff_id>/layer.tar. This is
#   the format `docker save` wrote before 25.0; `docker load`, `podman load` (containers/image)
#   and `ctr images import` all read it.
#   CONFIG is the image config's JSON object *without* rootfs (architecture, os, config, ...):
#   the layer's diff_id is added here. Files get owner 0:0 and mtime EPOCH (reproducible).
# Sourced by scripts/image and tests/k8s/node-images.sh.
docker_archive() {
  local rootfs=$1 ref=$2 out=$3 epoch=$4 config=$5 work diff_id config_id
  work=$(mktemp -d "$(dirname "$out")/.pack.XXXXXX") || return 1
  (cd "$rootfs" && tar --sort=name --owner=0 --group=0 --numeric-owner --mtime="@$epoch" \
    --format=gnu -cf "$work/layer.tar" .) || { rm -rf "$work"; return 1; }
  diff_id=$(sha256sum < "$work/layer.tar" | cut -c1-64)
  # Append rootfs to the caller's object (drop its closing brace).
  printf '%s,"rootfs":{"type":"layers","diff_ids":["sha256:%s"]}}' "${config%\}}" "$diff_id" > "$work/config.json"
  config_id=$(sha256sum < "$work/config.json" | cut -c1-64)
  mkdir -p "$work/a/$diff_id"
  mv "$work/layer.tar" "$work/a/$diff_id/layer.tar"
  mv "$work/config.json" "$work/a/$config_id.json"
  printf '[{"Config":"%s.json","RepoTags":["%s"],"Layers":["%s/layer.tar"]}]' \
    "$config_id" "$ref" "$diff_id" > "$work/a/manifest.json"
  (cd "$work/a" && tar --sort=name --owner=0 --group=0 --numeric-owner --mtime="@$epoch" \
    --format=gnu -cf "$work/image.tar" manifest.json "$config_id.json" "$diff_id") ||
    { rm -rf "$work"; return 1; }
  mv -f "$work/image.tar" "$out"
  DOCKER_ARCHIVE_CONFIG=sha256:$config_id DOCKER_ARCHIVE_LAYER=sha256:$diff_id
  rm -rf "$work"
}
