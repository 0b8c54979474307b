"""runs.forward_binding: the benchmarks' and tests' way to bind the forward's
OpenMP threads as vLLM's CPU worker binds its own under `vllm serve`."""

import os
import subprocess
import sys

import pytest

from bench import runs


def test_unbound_by_default_and_one_place_per_cpu():
    assert runs.forward_binding("") == {}
    assert runs.forward_binding("1") == {"OMP_NUM_THREADS": "1", "OMP_PROC_BIND": "true", "OMP_PLACES": "{1}"}
    assert runs.forward_binding("0, 2")["OMP_PLACES"] == "{0},{2}"
    assert runs.forward_binding("0, 2")["OMP_NUM_THREADS"] == "2"
    with pytest.raises(SystemExit, match=r"--forward-cpus 'a': CPU numbers separated by commas"):
        runs.forward_binding("a")


def test_torch_in_a_process_with_it_runs_its_forward_on_that_cpu_alone():
    cpus = sorted(os.sched_getaffinity(0))
    if len(cpus) < 2:
        pytest.skip("one CPU: binding to it changes nothing")
    probe = (
        "import os, torch; torch.ones(1 << 16).sum(); print(torch.get_num_threads(), sorted(os.sched_getaffinity(0)))"
    )
    env = dict(os.environ, **runs.forward_binding(str(cpus[-1])))
    out = subprocess.run(
        [sys.executable, "-c", probe], env=env, capture_output=True, text=True, check=True, timeout=120
    ).stdout.split(maxsplit=1)
    assert out == ["1", f"[{cpus[-1]}]\n"]
    unbound = subprocess.run(
        [sys.executable, "-c", probe],
        capture_output=True,
        text=True,
        env={k: v for k, v in os.environ.items() if not k.startswith("OMP_")},
        check=True,
        timeout=120,
    ).stdout.split(maxsplit=1)
    assert unbound[1] == f"{cpus}\n"
