"""activekv.check_device: the engine's device scenarios through the module.

Here on CPU; on an accelerator ci/gpu-wheel-check.sh runs them from the
shipped wheel (and the C++ tests run them from the core).
"""

from __future__ import annotations

import activekv
import pytest
import torch

EXPECTED_ON_CPU = {
    "save-load-exact": "passed",
    "save-load-compressed": "passed",
    "save-load-full-graph": "passed",
    "save-load-small-ring": "passed",
    "save-load-small-ring-compressed": "passed",
    "save-load-async": "passed",
    "save-load-async-compressed": "passed",
    "save-fences-complete": "passed",
    # CPU copies are synchronous: no fence can pass its deadline.
    "fence-timeout-quarantines": "skipped",
    "streaming-ring": "passed",
    "streaming-ring-compressed": "passed",
    "streaming-fence-timeout-poisons": "skipped",  # the same
    "streaming-back-to-back": "passed",
    "streaming-back-to-back-compressed": "passed",
    "compressed-decode": "passed",
}


def test_every_scenario_passes_on_cpu_but_the_fence_timeouts_which_cannot_happen(capsys):
    results = activekv.check_device("cpu")
    assert {r["name"]: r["outcome"] for r in results} == EXPECTED_ON_CPU
    assert all(r["detail"] and r["seconds"] >= 0 for r in results)
    # One line per scenario, in order, as each finishes: "<outcome> <name> (<ms> ms): <detail>".
    lines = capsys.readouterr().out.splitlines()
    assert [line.split()[:2] for line in lines] == [[o, n] for n, o in EXPECTED_ON_CPU.items()]


def test_the_default_device_is_the_cpu_where_torch_has_no_accelerator(capsys):
    if torch.accelerator.is_available():
        pytest.skip("this torch has an accelerator: the default device is that")
    results = activekv.check_device(quiet=True)
    assert [r["outcome"] for r in results] == list(EXPECTED_ON_CPU.values())
    assert capsys.readouterr().out == ""


def test_a_device_this_torch_lacks_or_no_device_at_all_is_a_value_error():
    other = "xpu" if torch.accelerator.current_accelerator() == torch.device("cuda") else "cuda"
    with pytest.raises(ValueError, match=f"device {other}: this torch build's accelerator is"):
        activekv.check_device(other, quiet=True)
    with pytest.raises(ValueError, match="'bogus' is not a device|bogus is not a device"):
        activekv.check_device("bogus", quiet=True)
