#!/usr/bin/env bash
# Run the whole test suite (installing what it needs first). Extra arguments go to pytest.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh --no-mount
# NVIDIA's own nvidia-smi of each Debian-shipped branch, for tests/test_real_nvidia_smi.py
# (cached in .cache/nvidia-smi; a failed download fails here rather than skipping those tests).
scripts/fetch_nvidia_smi.sh
# PyTorch with a CUDA build for tests/test_torch.py (about 5 GB, kept in the cache between runs),
# downloaded while the Go programs build: on a fresh machine one waits on the network, the other
# on the CPU.
scripts/fetch_torch.sh &
torch=$!
# NVIDIA's Go programs (device plugin, GFD, mig-parted, container toolkit, DRA plugins, go-nvml's
# examples, NFD's worker) and Kubernetes' at the versions scripts/go-tools.txt pins, built once
# into the cache.
scripts/install_go_tools.sh
wait "$torch"
# Generated code must match what its generator makes now (every generator, from one driver).
.venv/bin/python scripts/generate.py --check
exec .venv/bin/python -m pytest -q "$@"
