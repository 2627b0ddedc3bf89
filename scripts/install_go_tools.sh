#!/usr/bin/env bash
# Install the Go programs pinned in scripts/go-tools.txt (NVIDIA's device plugin, GPU feature
# discovery, mig-parted, the container toolkit, the DRA kubelet plugins, go-nvml's examples, Node
# Feature Discovery's worker, and this repository's kubelet stand-in) into
# ${MOKKA_CACHE:-$HOME/.cache/mokkafs}/go/bin, with `go install` at the pinned version.
#
# GOPATH, the module cache and the build cache live under that cache too, so a second run (and
# a second worktree) reuses them. Each program gets a stamp file holding its go-tools.txt line
# (and, for this repository's programs, a hash of their sources): a program whose stamp matches
# is skipped, so a version bump rebuilds exactly the line that changed. Builds run under
# `nice -n 10`. Usage: scripts/install_go_tools.sh [NAME...]   (no NAME: every line)
set -euo pipefail
repo=$(cd "$(dirname "$0")/.." && pwd)
list="$repo/scripts/go-tools.txt"
cache="${MOKKA_CACHE:-$HOME/.cache/mokkafs}/go"
bin="$cache/bin"
stamps="$cache/stamps"

command -v go >/dev/null 2>&1 || {
  echo "install_go_tools: no go command (needs Go >= 1.26; Debian's golang-go or go.dev's toolchain)" >&2
  exit 1
}
export GOPATH="$cache" GOMODCACHE="$cache/pkg/mod" GOCACHE="$cache/build"
# The pinned modules need Go 1.26 (their go.mod says so); the machine's own Go is used, never
# a toolchain fetched behind the user's back: an older Go fails here with go's own message.
export GOTOOLCHAIN="${MOKKA_GOTOOLCHAIN:-local}"
# Reproducible and independent of the caller's checkout state.
export GOFLAGS="-buildvcs=false -trimpath"
# go-nvml calls the NVML functions nvml.h marks deprecated: thousands of lines of warnings, none ours.
export CGO_CFLAGS="${CGO_CFLAGS:--O2 -g} -Wno-deprecated-declarations"
mkdir -p "$bin" "$stamps" "$GOPATH"

want=("$@")
wanted() {
  [ "${#want[@]}" -eq 0 ] && return 0
  local w
  for w in "${want[@]}"; do [ "$w" = "$1" ] && return 0; done
  return 1
}

# The directory of the module that holds PACKAGE at VERSION: the longest prefix that the module
# proxy serves as a module (what `go install` itself finds).
module_dir() {
  local pkg=$1 ver=$2 dir
  while [ -n "$pkg" ]; do
    if dir=$(go mod download -json "$pkg@$ver" 2>/dev/null | sed -n 's/^\t"Dir": "\(.*\)",$/\1/p') \
        && [ -n "$dir" ]; then
      echo "$dir ${1#"$pkg"}"
      return 0
    fi
    [ "${pkg%/*}" = "$pkg" ] && break
    pkg=${pkg%/*}
  done
  return 1
}

total_start=$(date +%s)
built=0
seen=()
while read -r -u 3 name spec flags; do
  case "$name" in ''|'#'*) continue ;; esac
  seen+=("$name")
  wanted "$name" || continue
  pkg=${spec%@*}
  ver=${spec##*@}
  [ "$pkg" != "$spec" ] || { echo "install_go_tools: $name: '$spec' has no @VERSION" >&2; exit 1; }
  stamp="$name $spec $flags"
  # in=./DIR: PACKAGE is built inside this repository's module DIR, which requires PACKAGE's
  # module at VERSION (tools/kubernetes: Kubernetes' commands; see scripts/k8s_wrapper.sh).
  inmod=""
  for f in $flags; do case "$f" in in=./*) inmod="$repo/${f#in=./}" ;; esac; done
  if [ -n "$inmod" ]; then
    [ -f "$inmod/go.mod" ] || { echo "install_go_tools: $name: no $inmod/go.mod" >&2; exit 1; }
    stamp="$stamp $(cat "$inmod/go.mod" "$inmod/go.sum" | sha256sum | cut -c1-16) version-stamped"
  elif [ "${pkg#./}" != "$pkg" ]; then
    # This repository's program: rebuilt whenever its sources change.
    src="$repo/${pkg#./}"
    [ -f "$src/go.mod" ] || { echo "install_go_tools: $name: no $src/go.mod" >&2; exit 1; }
    stamp="$stamp $(cd "$src" && find . -type f \( -name '*.go' -o -name go.mod -o -name go.sum \) \
      -print0 | sort -z | xargs -0 sha256sum | sha256sum | cut -c1-16)"
  fi
  if [ -x "$bin/$name" ] && [ -f "$stamps/$name" ] && [ "$(cat "$stamps/$name")" = "$stamp" ]; then
    continue
  fi
  cgo=0
  case " $flags " in *" cgo "*) cgo=1 ;; esac
  echo "install_go_tools: building $name ($spec${flags:+, $flags})"
  start=$(date +%s)
  tmp=$(mktemp -d "$cache/tmp.XXXXXX")
  # shellcheck disable=SC2064
  trap "rm -rf '$tmp'" EXIT
  if [ -n "$inmod" ]; then
    required=$(cd "$inmod" && go list -m -f '{{.Version}}' "${pkg%%/cmd/*}")
    [ "$required" = "$ver" ] || {
      echo "install_go_tools: $name: $inmod requires ${pkg%%/cmd/*} $required, go-tools.txt says $ver" >&2; exit 1; }
    ldflags=""
    if [ "${pkg%%/cmd/*}" = k8s.io/kubernetes ]; then
      # What Kubernetes' own build stamps in (hack/lib/version.sh): without it every component
      # reports v0.0.0-master, and clients that compare versions (the kubelet's to the API
      # server's, NVIDIA's DRA driver's feature checks) see a version no release has.
      minor=${ver#v1.}; minor=${minor%%.*}
      for p in k8s.io/component-base/version k8s.io/client-go/pkg/version; do
        ldflags="$ldflags -X $p.gitVersion=$ver -X $p.gitMajor=1 -X $p.gitMinor=$minor"
        ldflags="$ldflags -X $p.gitTreeState=clean -X $p.buildDate=1970-01-01T00:00:00Z"
      done
    fi
    (cd "$inmod" && GOBIN="$tmp" CGO_ENABLED=$cgo GOFLAGS="$GOFLAGS -mod=readonly" \
      nice -n 10 go install -ldflags="$ldflags" "$pkg")
  elif [ "${pkg#./}" != "$pkg" ]; then
    (cd "$src" && GOBIN="$tmp" CGO_ENABLED=$cgo nice -n 10 go install .)
  else
    # `go install PACKAGE@VERSION`, done by hand: the module at VERSION from the module proxy, then
    # `go install` in its own directory with its own go.mod and go.sum (-mod=readonly: nothing is
    # resolved anew, so the build is the module's own). go install PACKAGE@VERSION itself would
    # also ask the proxy for the module's version list (for deprecations), which the proxy may
    # refuse, and would refuse a module whose go.mod has replace directives (NFD's).
    read -r moddir sub < <(module_dir "$pkg" "$ver") \
      || { echo "install_go_tools: $name: no module of $pkg@$ver on the module proxy" >&2; exit 1; }
    # A replace directive to a directory of the repository (NFD's ./api/nfd, a nested module) has
    # nothing behind it in a module zip, which leaves nested modules out: that module comes from
    # the module proxy at the same version (the same commit), through a workspace file.
    work=""
    while read -r old new; do
      [ -e "$moddir/$new" ] && continue
      dir=$(go mod download -json "$old@$ver" | sed -n 's/^\t"Dir": "\(.*\)",$/\1/p')
      [ -n "$dir" ] || { echo "install_go_tools: $name: $old@$ver (for $new) is not on the module proxy" >&2; exit 1; }
      [ -n "$work" ] || { work="$tmp/go.work"; printf 'go 1.26\n\nuse %s\n\n' "$moddir" >"$work"; }
      printf 'replace %s => %s\n' "$old" "$dir" >>"$work"
    done < <(cd "$moddir" && go mod edit -json | sed -n '/"Replace"/,$p' \
      | tr -d '\n\t ' | grep -o '"Old":{"Path":"[^"]*"},"New":{"Path":"\./[^"]*"}' \
      | sed 's/"Old":{"Path":"\([^"]*\)"},"New":{"Path":"\([^"]*\)"}/\1 \2/')
    # The module cache is read-only; the build writes only under $tmp and the build cache.
    (cd "$moddir" && GOWORK="${work:-off}" GOBIN="$tmp" CGO_ENABLED=$cgo GOFLAGS="$GOFLAGS -mod=readonly" \
      nice -n 10 go install ".$sub")
  fi
  mv "$tmp/${pkg##*/}" "$tmp/$name" 2>/dev/null || true
  [ -x "$tmp/$name" ] || { echo "install_go_tools: $name: the build left no program" >&2; exit 1; }
  mv -f "$tmp/$name" "$bin/$name"
  echo "$stamp" >"$stamps/$name"
  rm -rf "$tmp"
  trap - EXIT
  built=$((built + 1))
  echo "install_go_tools: built $name in $(($(date +%s) - start)) s"
done 3<"$list"

for w in "${want[@]}"; do
  printf '%s\n' "${seen[@]}" | grep -qx -- "$w" || { echo "install_go_tools: $w is not in $list" >&2; exit 1; }
done
if [ "$built" -gt 0 ]; then
  echo "install_go_tools: built $built program(s) in $(($(date +%s) - total_start)) s into $bin"
fi
