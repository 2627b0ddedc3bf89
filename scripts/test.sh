#!/usr/bin/env bash
# Run the whole test suite (installing what it needs first). Extra arguments go to pytest.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh --no-mount
exec .venv/bin/python -m pytest -q "$@"
