"""`mokka status` shows a GPU's MIG mode and layout where it is not the default (off)."""
from __future__ import annotations

import pytest

from mokkafs.cli.main import _mig_summary


pytestmark = pytest.mark.level("mount")


def test_status_lists_the_mig_layout_of_the_gpus_that_have_one(node_factory):
    node = node_factory(gpus=3)
    before = node.cli("status", "--root", str(node.mnt)).stdout
    assert "MIG" not in before
    for gpu, args in ((1, ("mig", "enable")), (1, ("mig", "create", "3g.40gb,1g.10gb")), (2, ("mig", "enable"))):
        assert node.cli("inject", "--root", str(node.mnt), str(gpu), *args).returncode == 0
    lines = [line for line in node.cli("status", "--root", str(node.mnt)).stdout.splitlines() if "MIG" in line]
    assert lines == ["gpu1 MIG: enabled, 2 GPU instances: gi2 3g.40gb (1 ci), gi7 1g.10gb (1 ci)",
                     "gpu2 MIG: enabled, 0 GPU instances"]


def test_a_pending_change_and_a_board_without_mig():
    assert _mig_summary("mode: disabled\npending: enabled\n") == \
        "disabled (pending enabled: takes effect at the next GPU reset)"
    assert _mig_summary("mode: disabled\npending: disabled\n") is None
    assert _mig_summary("mode: not supported\n") is None
