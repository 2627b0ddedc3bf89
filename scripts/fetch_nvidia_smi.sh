#!/usr/bin/env bash
# Fetch NVIDIA's own nvidia-smi of every branch Debian ships (non-free), for the tests that run
# it unmodified on our libnvidia-ml (tests/test_real_nvidia_smi.py). Nothing is installed: a
# private apt configuration under the cache (its own sources, lists, status and archives) is
# used only for `apt-get download`, and each package is unpacked with `dpkg-deb -x`.
#
#   scripts/fetch_nvidia_smi.sh [CACHE]     (default: .cache/nvidia-smi, or $MOKKA_NVIDIA_SMI_CACHE)
#
# Result: CACHE/<branch>/nvidia-smi (a link into the unpacked package) and CACHE/<branch>/version
# for each branch below. A second run with everything present does no network access.
set -euo pipefail
cd "$(dirname "$0")/.."

cache="${1:-${MOKKA_NVIDIA_SMI_CACHE:-.cache/nvidia-smi}}"
mkdir -p "$cache"
cache="$(cd "$cache" && pwd)"

# branch  package  suite  path of the binary inside the package
branches=(
  "470 nvidia-tesla-470-smi bookworm usr/lib/nvidia/tesla-470/nvidia-smi"
  "525 nvidia-tesla-smi bookworm usr/lib/nvidia/tesla/nvidia-smi"
  "535 nvidia-smi bookworm usr/lib/nvidia/current/nvidia-smi"
  "550 nvidia-smi trixie usr/lib/nvidia/current/nvidia-smi"
)

missing=()
for line in "${branches[@]}"; do
  read -r branch _ _ _ <<<"$line"
  [ -x "$cache/$branch/nvidia-smi" ] && [ -s "$cache/$branch/version" ] || missing+=("$line")
done
if [ "${#missing[@]}" -eq 0 ]; then
  echo "fetch_nvidia_smi: cached in $cache"
  exit 0
fi

apt="$cache/apt"
mkdir -p "$apt/etc/sources.list.d" "$apt/etc/preferences.d" "$apt/etc/apt.conf.d" \
  "$apt/state/lists/partial" "$apt/cache/archives/partial" "$cache/debs"
: >"$apt/state/status"
keyring=/usr/share/keyrings/debian-archive-keyring.gpg
[ -r "$keyring" ] || { echo "fetch_nvidia_smi: $keyring missing (package debian-archive-keyring)" >&2; exit 1; }
{
  for suite in bookworm trixie; do
    echo "deb [signed-by=$keyring] http://deb.debian.org/debian $suite main contrib non-free"
  done
} >"$apt/etc/sources.list"

# Only this configuration: no system sources, preferences, state or hooks.
apt_opts=(
  -o "Dir::Etc=$apt/etc"
  -o "Dir::Etc::sourcelist=$apt/etc/sources.list"
  -o "Dir::Etc::sourceparts=$apt/etc/sources.list.d"
  -o "Dir::Etc::preferences=$apt/etc/preferences"
  -o "Dir::Etc::preferencesparts=$apt/etc/preferences.d"
  -o "Dir::Etc::parts=$apt/etc/apt.conf.d"
  -o "Dir::State=$apt/state"
  -o "Dir::State::status=$apt/state/status"
  -o "Dir::Cache=$apt/cache"
  -o "APT::Architecture=amd64"
  -o "APT::Sandbox::User=$(id -un)"
  -o "Debug::NoLocking=1"
  -q
)

echo "fetch_nvidia_smi: apt-get update (private configuration in $apt)"
apt-get "${apt_opts[@]}" update >/dev/null

for line in "${missing[@]}"; do
  read -r branch package suite binary <<<"$line"
  version="$(apt-cache "${apt_opts[@]}" show "$package/$suite" 2>/dev/null | sed -n 's/^Version: //p' | head -1)"
  [ -n "$version" ] || { echo "fetch_nvidia_smi: $package not found in $suite" >&2; exit 1; }
  deb="$cache/debs/${package}_${version//:/%3a}_amd64.deb"
  if [ ! -s "$deb" ]; then
    (cd "$cache/debs" && apt-get "${apt_opts[@]}" download "$package=$version" >/dev/null)
  fi
  [ -s "$deb" ] || { echo "fetch_nvidia_smi: download of $package=$version gave no $deb" >&2; exit 1; }
  rm -rf "${cache:?}/${branch:?}"
  mkdir -p "$cache/$branch/root"
  dpkg-deb -x "$deb" "$cache/$branch/root"
  [ -x "$cache/$branch/root/$binary" ] || { echo "fetch_nvidia_smi: $deb has no $binary" >&2; exit 1; }
  case "$version" in
    "$branch".*) ;;
    *) echo "fetch_nvidia_smi: $package/$suite is $version, not branch $branch" >&2; exit 1 ;;
  esac
  ln -s "root/$binary" "$cache/$branch/nvidia-smi"
  echo "$package $version" >"$cache/$branch/version"
  echo "fetch_nvidia_smi: $branch: $package $version"
done
