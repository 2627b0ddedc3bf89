"""What NVML supports by a board's architecture: the queries NVML documents for Ampere, Ada or
Hopper and later answer on those boards and are NOT_SUPPORTED before, through pynvml on a mounted
node of each board, against the table below. Level: shims."""
from __future__ import annotations

import pytest

from helpers import run_py_json
from helpers_nvml import consumer_env

pytestmark = pytest.mark.level("shims")

pytest.importorskip("pynvml", reason="nvidia-ml-py is in the test extra")

SUCCESS, NOT_SUPPORTED = 0, 3

# Per query, the first architecture that answers it, as nvml.h documents it (and the captures show):
# SRAM ECC status from Ampere; pending channel/TPC repairs from Ada; the unrepairable-memory flag,
# the EDPp multiplier field and GPU performance monitoring from Hopper; the 1 s power average
# field from Ada here (nvml.h says Ampere except GA100; the A100 and T4 captures show it N/A, and
# the model keeps the A10G with them).
QUERIES = ("sram_ecc", "repair_status", "unrepairable_flag", "power_average", "edpp_multiplier", "gpm")
FROM = {"sram_ecc": "Ampere", "repair_status": "Ada", "unrepairable_flag": "Hopper", "power_average": "Ada",
        "edpp_multiplier": "Hopper", "gpm": "Hopper"}
ORDER = ["Turing", "Ampere", "Ada", "Hopper", "Blackwell"]
BOARDS = {"t4": "Turing", "a100": "Ampere", "a10g": "Ampere", "l4": "Ada", "h100": "Hopper", "b200": "Blackwell"}

PROBE = """
    import ctypes, json, pynvml as p
    p.nvmlInit()
    h = p.nvmlDeviceGetHandleByIndex(0)
    fn = p._nvmlGetFunctionPointer
    sram = p.c_nvmlEccSramErrorStatus_v1_t()
    repair = p.c_nvmlRepairStatus_t()
    repair.version = p.nvmlRepairStatus_v1
    unrepairable = ctypes.c_uint(7)
    fields = p.nvmlDeviceGetFieldValues(h, [(185, 0), (274, 0)])  # POWER_AVERAGE, EDPP_MULTIPLIER; GPU scope
    print(json.dumps(dict(
        sram_ecc=fn("nvmlDeviceGetSramEccErrorStatus")(h, ctypes.byref(sram)),
        repair_status=fn("nvmlDeviceGetRepairStatus")(h, ctypes.byref(repair)),
        unrepairable_flag=fn("nvmlDeviceGetUnrepairableMemoryFlag_v1")(h, ctypes.byref(unrepairable)),
        power_average=fields[0].nvmlReturn, edpp_multiplier=fields[1].nvmlReturn,
        gpm=p.nvmlGpmQueryDeviceSupport(h).isSupportedDevice)))
"""


def expected(architecture: str) -> dict[str, int]:
    has = {q: ORDER.index(architecture) >= ORDER.index(FROM[q]) for q in QUERIES}
    out = {q: SUCCESS if has[q] else NOT_SUPPORTED for q in QUERIES}
    out["gpm"] = int(has["gpm"])  # isSupportedDevice
    return out


@pytest.mark.parametrize("profile", sorted(BOARDS))
def test_queries_answer_from_their_architecture(node_factory, profile):
    node = node_factory(profile=profile, gpus=1)
    out = run_py_json(consumer_env(node.state_dir / "state"), PROBE)
    assert out == expected(BOARDS[profile])
