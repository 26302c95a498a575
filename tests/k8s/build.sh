#!/usr/bin/env bash
# Builds the Kubernetes test bed from Go modules at the versions pinned in versions.env:
#   kube-apiserver kube-scheduler kube-controller-manager kubectl   (wrapper module kube/)
#   etcd                                                            (wrapper module etcd/)
#   kwok                                                            (wrapper module kwok/)
#   helm                                                            (wrapper module helm/)
#   kubelet                                                         (wrapper module kubelet/)
#   containerd containerd-shim-runc-v2 ctr                          (wrapper module containerd/)
#   every main package under harness/cmd/ (if harness/go.mod exists)
# into ${GPUOPS_CACHE:-$HOME/.cache/gpuops}/k8s/<key>/bin, where <key> hashes versions.env,
# the wrappers' go.mod/go.sum and the harness sources. Anything already built is reused,
# so only the first run pays (about 13 min cold on 2 shared cores; well under a second warm).
#
# `build.sh capi` and `build.sh karpenter` build the autoscaling parts instead, each under a cache
# key of its own (so adding or bumping them never rebuilds the control plane):
#   capi:      the Cluster API core controller manager (wrapper capi/, autoscale-versions.env)
#              and its CRDs   -> ${GPUOPS_CACHE:-$HOME/.cache/gpuops}/capi/<key>/bin{,/crds}
#   karpenter: Karpenter with its KWOK provider (wrapper karpenter/, GOTOOLCHAIN from
#              autoscale-versions.env) and its CRDs -> .../karpenter/<key>/bin{,/crds}
#
# stdout: exactly one line, `GPUOPS_K8S_BIN=<dir>` (so callers can eval it); all else on stderr.
# (`GPUOPS_CAPI_BIN=<dir>` / `GPUOPS_KARPENTER_BIN=<dir>` for the autoscaling parts.)
# Exit codes: 0 ok, 1 a build failed (the binary and its log are named), 2 no usable Go.
#
# Uses the default GOMODCACHE/GOCACHE (under $HOME, so they survive fresh clones). Needs the
# Go module proxy only when the module cache is cold.
set -euo pipefail

exec 3>&1 1>&2          # everything goes to stderr; fd 3 is the real stdout for the result line

# Bump when the build recipe (flags, layout) changes, to invalidate cached binaries.
RECIPE=1

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
start_all=$SECONDS
say() { printf '[k8s-build] %s\n' "$*" >&2; }
die() { local code=$1; shift; printf '[k8s-build] ERROR: %s\n' "$*" >&2; exit "$code"; }

# shellcheck source=versions.env
source "$here/versions.env"
: "${K8S_VERSION:?versions.env: K8S_VERSION unset}" "${ETCD_VERSION:?}" "${KWOK_VERSION:?}" "${HELM_VERSION:?}" "${CONTAINERD_VERSION:?}"

# The wrappers must match versions.env (update-modules.sh regenerates them).
check_pin() { # dir module version
  grep -Eq "^[[:space:]]*(require[[:space:]]+)?$2 $3( |\$)" "$here/$1/go.mod" ||
    die 1 "versions.env pins $2 $3 but $1/go.mod does not; run tests/k8s/update-modules.sh"
}
check_pin kube k8s.io/kubernetes "$K8S_VERSION"
check_pin etcd go.etcd.io/etcd/server/v3 "$ETCD_VERSION"
check_pin kwok sigs.k8s.io/kwok "$KWOK_VERSION"
check_pin helm helm.sh/helm/v3 "$HELM_VERSION"
check_pin kubelet k8s.io/kubernetes "$K8S_VERSION"
check_pin containerd github.com/containerd/containerd/v2 "$CONTAINERD_VERSION"

target=${1:-control-plane}
case "$target" in
  control-plane) result_var=GPUOPS_K8S_BIN; cache_dir=k8s ;;
  capi|karpenter)
    # shellcheck source=autoscale-versions.env
    source "$here/autoscale-versions.env"
    : "${CAPI_VERSION:?autoscale-versions.env: CAPI_VERSION unset}" "${KARPENTER_VERSION:?}" "${KARPENTER_GOTOOLCHAIN:?}"
    check_pin capi sigs.k8s.io/cluster-api "$CAPI_VERSION"
    check_pin capi sigs.k8s.io/cluster-api/api "$CAPI_VERSION"
    check_pin karpenter sigs.k8s.io/karpenter "$KARPENTER_VERSION"
    cache_dir=$target
    if [ "$target" = capi ]; then result_var=GPUOPS_CAPI_BIN; else result_var=GPUOPS_KARPENTER_BIN; fi
    ;;
  *) die 2 "unknown part '$target' (none for the control plane, or: capi, karpenter)" ;;
esac
# Karpenter v1.15.0 needs Go >= 1.26.9; the toolchain comes from the Go module proxy (then cached).
[ "$target" = karpenter ] && export GOTOOLCHAIN="$KARPENTER_GOTOOLCHAIN"

have_harness=0
[ -f "$here/harness/go.mod" ] && have_harness=1

# --- keys -------------------------------------------------------------------------------
sha() { sha256sum | cut -c1-16; }
files_hash() { # files... (missing ones hash as absent)
  local f
  for f in "$@"; do
    if [ -f "$f" ]; then printf '%s\n' "${f#"$here"/}"; sha256sum < "$f"; else printf 'absent %s\n' "$f"; fi
  done | sha
}
harness_files() { # regular files of the harness module, minus build output and editor junk
  (cd "$here/harness" && find . -type f \
      ! -path '*/.*' ! -path './bin/*' ! -name '*.log' ! -name '*~' ! -name '*.swp' -print |
      LC_ALL=C sort | sed "s|^\./|$here/harness/|")
}
platform="$(uname -s)/$(uname -m)"
key_kube=$(echo "recipe=$RECIPE $platform k8s=$K8S_VERSION $(files_hash "$here/kube/go.mod" "$here/kube/go.sum")" | sha)
key_etcd=$(echo "recipe=$RECIPE $platform etcd=$ETCD_VERSION $(files_hash "$here/etcd/go.mod" "$here/etcd/go.sum")" | sha)
key_kwok=$(echo "recipe=$RECIPE $platform kwok=$KWOK_VERSION $(files_hash "$here/kwok/go.mod" "$here/kwok/go.sum")" | sha)
key_helm=$(echo "recipe=$RECIPE $platform helm=$HELM_VERSION $(files_hash "$here/helm/go.mod" "$here/helm/go.sum")" | sha)
key_kubelet=$(echo "recipe=$RECIPE $platform k8s=$K8S_VERSION $(files_hash "$here/kubelet/go.mod" "$here/kubelet/go.sum")" | sha)
key_containerd=$(echo "recipe=$RECIPE $platform containerd=$CONTAINERD_VERSION $(files_hash "$here/containerd/go.mod" "$here/containerd/go.sum")" | sha)
key_harness=none
if [ $have_harness = 1 ]; then
  mapfile -t hfiles < <(harness_files)
  key_harness=$(echo "recipe=$RECIPE $platform k8s=$K8S_VERSION $(files_hash "${hfiles[@]}")" | sha)
fi
key="$K8S_VERSION-$(printf '%s\n' "$(sha256sum < "$here/versions.env")" \
  "$key_kube" "$key_etcd" "$key_kwok" "$key_helm" "$key_harness" "$key_kubelet" "$key_containerd" | sha)"
case "$target" in
  capi)
    # layout=2: webhooks.yaml next to the CRDs.
    key_capi=$(echo "recipe=$RECIPE layout=2 $platform capi=$CAPI_VERSION $(files_hash "$here/capi/go.mod" "$here/capi/go.sum")" | sha)
    key="$CAPI_VERSION-$key_capi" ;;
  karpenter)
    key_karpenter=$(echo "recipe=$RECIPE $platform karpenter=$KARPENTER_VERSION go=$KARPENTER_GOTOOLCHAIN $(files_hash "$here/karpenter/go.mod" "$here/karpenter/go.sum")" | sha)
    key="$KARPENTER_VERSION-$key_karpenter" ;;
esac

root="${GPUOPS_CACHE:-$HOME/.cache/gpuops}/$cache_dir"
out="$root/$key/bin"
logs="$root/$key/logs"

# --- fast path: everything already there --------------------------------------------------
complete_ok() { # all binaries listed in $out/.complete exist and are executable (.yaml: exist)
  local b
  [ -f "$out/.complete" ] || return 1
  while read -r b; do
    [ -n "$b" ] && { [ -x "$out/$b" ] || { [[ $b == *.yaml ]] && [ -f "$out/$b" ]; } || return 1; }
  done < "$out/.complete"
  return 0
}
if complete_ok; then
  touch "$root/$key" 2>/dev/null || true      # marks it in use (see pruning below)
  say "up to date: $out ($((SECONDS - start_all))s)"
  echo "$result_var=$out" >&3
  exit 0
fi

# --- slow path ------------------------------------------------------------------------------
if ! command -v go >/dev/null 2>&1; then
  cat >&2 <<EOF
[k8s-build] ERROR: 'go' is not on PATH. The Kubernetes test bed (tests/k8s) is built from Go
modules and needs Go >= 1.26.0 (tested with go1.26.8). To install it:
  * Debian's golang-go is too old (bookworm ships 1.19; check: apt-cache policy golang-go).
  * Have any Go >= 1.21: run  GOTOOLCHAIN=go1.26.8 go version  (fetches the toolchain from the
    Go module proxy) and use GOTOOLCHAIN=go1.26.8 for this script.
  * Otherwise fetch the toolchain module from the Go module proxy with any go (even Debian's 1.19):
      d=\$(go mod download -json golang.org/toolchain@v0.0.1-go1.26.8.linux-amd64 | sed -n 's/.*"Dir": "\\(.*\\)".*/\\1/p')
      cp -r "\$d" /usr/local/go && chmod -R u+w /usr/local/go && chmod +x /usr/local/go/bin/* /usr/local/go/pkg/tool/*/*
      export PATH=/usr/local/go/bin:\$PATH
    or install Go from the official tarball.
EOF
  exit 2
fi

export GOWORK=off CGO_ENABLED=0 GOFLAGS="-mod=readonly -buildvcs=false"

# Refuse a Go older than what the wrappers ask for, with a plain message (rather than go's own).
if [ "$target" = control-plane ]; then
  need_go=$(sed -n 's/^go \([0-9.]*\)$/\1/p' "$here"/{kube,etcd,kwok,helm,kubelet,containerd}/go.mod \
    $( [ $have_harness = 1 ] && echo "$here/harness/go.mod") | sort -V | tail -1)
else
  need_go=$(sed -n 's/^go \([0-9.]*\)$/\1/p' "$here/$target/go.mod")
fi
have_go=$(go env GOVERSION 2>/dev/null | sed -n 's/^go\([0-9.]*\).*/\1/p')
if [ -z "$have_go" ] || [ "$(printf '%s\n%s\n' "$need_go" "$have_go" | sort -V | head -1)" != "$need_go" ]; then
  # GOTOOLCHAIN=goX.Y.Z (set by the caller) is allowed to fetch a newer toolchain
  case "$(go env GOTOOLCHAIN)" in
    go1.*) say "go $have_go < $need_go, using GOTOOLCHAIN=$(go env GOTOOLCHAIN)" ;;
    *) die 2 "installed Go is ${have_go:-unknown} but the test bed needs Go >= $need_go; install it (see the message when go is missing, or run with GOTOOLCHAIN=go1.26.8)";;
  esac
fi

mkdir -p "$root" "$logs"
# One build at a time per cache (parallel test binaries may all call this script).
if command -v flock >/dev/null 2>&1; then
  exec 9>"$root/.lock"
  if ! flock -n 9; then
    say "another build holds $root/.lock; waiting"
    flock 9
  fi
  have_lock=1
  if complete_ok; then
    say "up to date (built by another run): $out"
    echo "$result_var=$out" >&3
    exit 0
  fi
fi

# Under the lock, any other temp dir is left over from a killed build.
[ -n "${have_lock:-}" ] && find "$root" -mindepth 1 -maxdepth 1 -name '.tmp.*' -exec rm -rf {} +
tmp=$(mktemp -d "$root/.tmp.XXXXXX")
child=
setsid=$(command -v setsid || true)
trap 'rm -rf "$tmp"' EXIT
on_signal() {
  [ -n "$child" ] && kill -TERM -- "-$child" 2>/dev/null
  say "interrupted; nothing half-built was left under $root"
  exit 130
}
trap on_signal INT TERM HUP
mkdir -p "$tmp/bin"

say "go $(go env GOVERSION), GOMODCACHE=$(go env GOMODCACHE), GOCACHE=$(go env GOCACHE)"
say "key $key -> $out"

# The version the kube binaries report (kube::version::ldflags in k8s hack/lib/version.sh).
minor=${K8S_VERSION#v1.}; minor=${minor%%.*}
kube_ldflags="-s -w"
for p in k8s.io/component-base/version k8s.io/client-go/pkg/version; do
  kube_ldflags+=" -X $p.gitVersion=$K8S_VERSION -X $p.gitMajor=1 -X $p.gitMinor=$minor -X $p.gitTreeState=clean"
done

# Binaries are built once per (group key) into parts/<group>-<key>/ and hard-linked into
# <key>/bin, so changing only the harness does not rebuild kube-apiserver.
built_names=()
build_one() { # group group-key module-dir name package ldflags
  local group=$1 gkey=$2 mdir=$3 name=$4 pkg=$5 ldflags=$6
  local part="$root/parts/$group-$gkey" log="$logs/$name.log" t0=$SECONDS
  mkdir -p "$part"; touch "$part"
  if [ -x "$part/$name" ]; then
    say "$name: cached ($part)"
  else
    say "$name: building $pkg ..."
    # In its own process group, so that an interrupted build.sh stops the compilers too.
    (cd "$mdir" && exec ${setsid:-} go build -trimpath -ldflags "$ldflags" -o "$tmp/bin/$name" "$pkg") >"$log" 2>&1 &
    child=$!
    if ! wait "$child"; then
      child=
      tail -n 30 "$log" | sed 's/^/    /' >&2
      die 1 "building $name ($pkg in $mdir) failed; full log: $log"
    fi
    child=
    mv -f "$tmp/bin/$name" "$part/$name"     # atomic: same filesystem
    say "$name: built in $((SECONDS - t0))s"
  fi
  mkdir -p "$out"
  if ! [ "$out/$name" -ef "$part/$name" ]; then
    ln -f "$part/$name" "$tmp/bin/$name.link" 2>/dev/null || cp -f "$part/$name" "$tmp/bin/$name.link"
    mv -f "$tmp/bin/$name.link" "$out/$name"
  fi
  built_names+=("$name")
}

build_control_plane() {
for c in kube-apiserver kube-scheduler kube-controller-manager kubectl; do
  build_one kube "$key_kube" "$here/kube" "$c" "k8s.io/kubernetes/cmd/$c" "$kube_ldflags"
done
build_one etcd "$key_etcd" "$here/etcd" etcd go.etcd.io/etcd/server/v3 "-s -w"
build_one kwok "$key_kwok" "$here/kwok" kwok sigs.k8s.io/kwok/cmd/kwok "-s -w"
# Helm's Makefile sets its version and the Kubernetes version its client libraries speak (the
# default .Capabilities.KubeVersion of `helm template`/`helm lint`); the same here.
helm_k8s_minor=$(sed -n 's/^[[:space:]]*k8s.io\/client-go v0\.\([0-9]*\)\..*/\1/p' "$here/helm/go.mod")
helm_ldflags="-s -w -X helm.sh/helm/v3/internal/version.version=$HELM_VERSION -X helm.sh/helm/v3/internal/version.gitTreeState=clean"
if [ -n "$helm_k8s_minor" ]; then
  for p in helm.sh/helm/v3/pkg/lint/rules helm.sh/helm/v3/pkg/chartutil; do
    helm_ldflags+=" -X $p.k8sVersionMajor=1 -X $p.k8sVersionMinor=$helm_k8s_minor"
  done
fi
build_one helm "$key_helm" "$here/helm" helm helm.sh/helm/v3/cmd/helm "$helm_ldflags"

# The real-node tier: the kubelet (its own wrapper, so kube/'s key did not change) and containerd
# 2.x with its runc shim and ctr (the version its Makefile stamps; CGO off: no btrfs snapshotter).
build_one kubelet "$key_kubelet" "$here/kubelet" kubelet k8s.io/kubernetes/cmd/kubelet "$kube_ldflags"
containerd_ldflags="-s -w -X github.com/containerd/containerd/v2/version.Version=$CONTAINERD_VERSION -X github.com/containerd/containerd/v2/version.Package=github.com/containerd/containerd/v2"
for c in containerd containerd-shim-runc-v2 ctr; do
  build_one containerd "$key_containerd" "$here/containerd" "$c" "github.com/containerd/containerd/v2/cmd/$c" "$containerd_ldflags"
done

if [ $have_harness = 1 ]; then
  if [ -d "$here/harness/cmd" ]; then
    list_log="$logs/harness-list.log"
    if ! mains=$(cd "$here/harness" && go list -f '{{if eq .Name "main"}}{{.ImportPath}}{{end}}' ./cmd/... 2>"$list_log"); then
      tail -n 30 "$list_log" | sed 's/^/    /' >&2
      die 1 "listing harness commands (go list ./cmd/... in $here/harness) failed; log: $list_log"
    fi
    for pkg in $mains; do
      build_one harness "$key_harness" "$here/harness" "${pkg##*/}" "$pkg" "$kube_ldflags"
    done
    [ -n "$mains" ] || say "harness: no main packages under harness/cmd"
  else
    say "harness: harness/go.mod but no harness/cmd/; nothing to build"
  fi
fi
}

# Quick sanity: each binary starts and reports a version (first line of its output).
check_version() { # name args...
  local name=$1 v; shift
  v=$("$out/$name" "$@" 2>&1) || { printf '%s\n' "$v" | sed 's/^/    /' >&2; die 1 "$out/$name $* failed"; }
  say "$name $*: ${v%%$'\n'*}"
}

# The CRDs as the module ships them (config/crd/bases: no conversion webhook, which only the
# kustomize patches add), copied next to the binary so tests need no module cache. Copied into the
# temp dir and renamed into place like the binaries.
copy_crds() { # module@version dirs-inside-the-module...
  local mod=$1 dir src; shift
  src=$(cd "$here/$target" && go mod download -json "$mod" | sed -n 's/.*"Dir": "\(.*\)".*/\1/p')
  [ -d "$src" ] || die 1 "cannot find $mod in the module cache (go mod download $mod)"
  mkdir -p "$tmp/crds"
  for dir in "$@"; do
    cp "$src/$dir"/*.yaml "$tmp/crds/" || die 1 "no CRDs in $src/$dir"
  done
  rm -rf "$out/crds.old"; [ -d "$out/crds" ] && mv "$out/crds" "$out/crds.old"
  mv "$tmp/crds" "$out/crds"; rm -rf "$out/crds.old"
  say "crds: $(ls "$out/crds" | wc -l) files from $mod"
  built_names+=(crds)
}

case "$target" in
  control-plane)
    build_control_plane
    for b in kube-apiserver kube-scheduler kube-controller-manager etcd kwok kubelet containerd ctr; do check_version "$b" --version; done
    check_version containerd-shim-runc-v2 -v
    check_version kubectl version --client
    check_version helm version --short
    {
      echo "key=$key"; echo "go=$(go env GOVERSION)"; echo "k8s=$K8S_VERSION etcd=$ETCD_VERSION kwok=$KWOK_VERSION helm=$HELM_VERSION containerd=$CONTAINERD_VERSION"
      echo "kube=$key_kube etcd=$key_etcd kwok=$key_kwok helm=$key_helm harness=$key_harness kubelet=$key_kubelet containerd=$key_containerd"
    } > "$root/$key/BUILD-INFO"
    ;;
  capi)
    capi_ldflags="-s -w"
    for p in sigs.k8s.io/cluster-api/version; do
      capi_ldflags+=" -X $p.gitVersion=$CAPI_VERSION -X $p.gitTreeState=clean"
    done
    build_one capi "$key_capi" "$here/capi" capi-manager sigs.k8s.io/cluster-api/core "$capi_ldflags"
    check_version capi-manager --help   # it has no --version; --help proves it starts
    copy_crds "sigs.k8s.io/cluster-api@$CAPI_VERSION" core/config/crd/bases
    # The webhook configurations (defaulting, validation), pointed at the manager by the test bed.
    cp "$(cd "$here/capi" && go mod download -json "sigs.k8s.io/cluster-api@$CAPI_VERSION" |
      sed -n 's/.*"Dir": "\(.*\)".*/\1/p')/core/config/webhook/manifests.yaml" "$tmp/webhooks.yaml"
    mv -f "$tmp/webhooks.yaml" "$out/webhooks.yaml"
    built_names+=(webhooks.yaml)
    { echo "key=$key"; echo "go=$(go env GOVERSION)"; echo "capi=$CAPI_VERSION"; } > "$root/$key/BUILD-INFO"
    ;;
  karpenter)
    build_one karpenter "$key_karpenter" "$here/karpenter" karpenter-kwok sigs.k8s.io/karpenter/kwok "-s -w"
    copy_crds "sigs.k8s.io/karpenter@$KARPENTER_VERSION" pkg/apis/crds kwok/apis/crds
    { echo "key=$key"; echo "go=$(go env GOVERSION)"; echo "karpenter=$KARPENTER_VERSION"; } > "$root/$key/BUILD-INFO"
    ;;
esac
printf '%s\n' "${built_names[@]}" > "$tmp/complete"
mv -f "$tmp/complete" "$out/.complete"
touch "$root/$key"

# Prune keys and parts unused for GPUOPS_K8S_CACHE_KEEP_DAYS (default 14) days. <key>/bin holds
# hard links, so removing a part never breaks a kept key.
keep_days=${GPUOPS_K8S_CACHE_KEEP_DAYS:-14}
find "$root" -mindepth 1 -maxdepth 1 -type d -name 'v*-*' ! -name "$key" -mtime "+$keep_days" -exec rm -rf {} + || true
find "$root/parts" -mindepth 1 -maxdepth 1 -type d -mtime "+$keep_days" -exec rm -rf {} + || true

say "done in $((SECONDS - start_all))s: $out"
echo "$result_var=$out" >&3
