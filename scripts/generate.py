#!/usr/bin/env python3
"""Every generator of the repository, run from one place: with `--check`, each fails if what it
would write differs from what is committed (scripts/test.sh and tests/test_generated.py run it).

    python scripts/generate.py [--check] [NAME...]
"""
from __future__ import annotations

import argparse
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
# name -> (the generator, what it writes)
GENERATORS = {
    "consts": ("scripts/gen_consts.py", "mokkafs/model/nvml_consts.py from nvml.h, state_limits.py from mokka_state.h"),
    "nvml-stubs": ("shims/gen_nvml.py", "libnvidia-ml's export list and NOT_SUPPORTED stubs from nvml.h"),
    "cuda": ("shims/gen_cuda.py", "libcuda's exports, stubs, cuGetProcAddress table and error names from cuda.h"),
    "nvidia-smi": ("shims/nvidia-smi/gen_smi.py", "smi_gen.[ch], smi_values_gen.c and mokkafs/model/smi_fields.py "
                   "from fields.yaml, the real captures and NVIDIA's binaries' records"),
    "faults-doc": ("scripts/gen_faults_doc.py", "docs/faults.md's Xid tables from the catalogue"),
    "render-digests": ("scripts/gen_render_digests.py", "tests/fixtures/render/<profile>.txt, the readable golden renders"),
}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--check", action="store_true", help="fail if any committed output is stale")
    ap.add_argument("names", nargs="*", choices=[[], *GENERATORS], help="only these (default: all)")
    args = ap.parse_args()
    failed = []
    for name in args.names or GENERATORS:
        script, what = GENERATORS[name]
        res = subprocess.run([sys.executable, str(ROOT / script), *(["--check"] if args.check else [])],
                             capture_output=True, text=True)
        status = "ok" if res.returncode == 0 else "STALE" if args.check else "FAILED"
        print(f"{name:<15} {status:<6} {what}")
        if res.returncode != 0:
            failed.append(name)
            sys.stderr.write(res.stdout + res.stderr)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
