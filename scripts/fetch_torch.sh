#!/usr/bin/env bash
# PyTorch with a CUDA build (torch 2.14.1 from PyPI: CUDA 13, its runtime libraries as nvidia-*
# and cuda-toolkit wheels, about 5 GB installed) for tests/test_torch.py. Installed once, outside
# the venv (pip --target: its CUDA wheels would otherwise sit beside the runtime wheels the other
# tests pin), into ${MOKKA_CACHE:-$HOME/.cache/mokkafs}/torch-2.14.1, and reused from then on:
# CI keeps that directory in its cache.
set -euo pipefail
cd "$(dirname "$0")/.."
dest="${MOKKA_CACHE:-$HOME/.cache/mokkafs}/torch-2.14.1"
[ -f "$dest/.complete" ] && exit 0
rm -rf "$dest.tmp"
mkdir -p "$(dirname "$dest")"
.venv/bin/pip install -q --target "$dest.tmp" torch==2.14.1
touch "$dest.tmp/.complete"
rm -rf "$dest"
mv "$dest.tmp" "$dest"
