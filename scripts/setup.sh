#!/usr/bin/env bash
# Set up mokkafs on a fresh Debian/Ubuntu machine: system packages, a virtual environment with
# mokkafs and its test dependencies (this builds the native shims), then mount an 8 x H100 node
# at /mokka and show it. `--no-mount` stops after the install (CI and the test script use it).
set -euo pipefail
cd "$(dirname "$0")/.."

mount_node=1
[ "${1:-}" = "--no-mount" ] && mount_node=0

SUDO=""
[ "$(id -u)" -eq 0 ] || SUDO="sudo"

# System packages: FUSE, a C toolchain for the shims, and the real tools the tests run.
packages=(fuse3 libfuse3-dev pkg-config gcc python3-venv python3-dev pciutils infiniband-diags util-linux kmod)
# Linters the deploy tests run over the unit file and scripts.
packages+=(shellcheck systemd)
# A real OCI runtime for the container tests (tests/test_containers.py): podman makes containers
# from CDI specs, runc runs them.
packages+=(podman runc)
# The cluster tier (scripts/cluster.py, tests/test_cluster*.py): etcd, the CNI plugins, iptables
# for kube-proxy, and what its images are made of (scripts/oci_image.py: a static pause built with
# gcc, Debian's busybox-static, a Debian root by debootstrap). Kubernetes and containerd 2 are Go
# programs: scripts/install_go_tools.sh.
packages+=(etcd-server containernetworking-plugins iptables conntrack busybox-static debootstrap libc6-dev)
# kubectl comes with Kubernetes (scripts/go-tools.txt): Debian bookworm's kubernetes-client (1.20)
# is too old to render deploy/'s overlays.
missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ "${#missing[@]}" -gt 0 ]; then
  echo "setup: installing ${missing[*]}"
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq "${missing[@]}" >/dev/null
fi

PYTHON="${PYTHON:-python3}"
[ -x .venv/bin/python ] || "$PYTHON" -m venv .venv
.venv/bin/python -m pip install -q --upgrade pip >/dev/null
.venv/bin/python -m pip install -q -e '.[test]'
# mokkafs's bytecode, written now as a wheel's install writes it. An editable install leaves it
# to the first import, which a machine with PYTHONDONTWRITEBYTECODE set never writes: every
# process would compile the sources it imports again (`mokka mount`: 0.59 s against 0.52 s).
.venv/bin/python -m compileall -q mokkafs >/dev/null

if [ "$mount_node" -eq 1 ]; then
  .venv/bin/mokka umount /mokka >/dev/null 2>&1 || true
  $SUDO .venv/bin/mokka mount /mokka --profile h100 --gpus 8
  .venv/bin/mokka status --root /mokka
  echo
  echo "Try: echo 79 > /mokka/gpu0/inject_xid; cat /mokka/node/events; .venv/bin/mokka status"
fi
