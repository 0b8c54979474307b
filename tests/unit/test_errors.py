"""Exit codes: one place (pipeline/errors.py), one code per kind of failure."""

from __future__ import annotations

import importlib
import pkgutil

import pipeline
from pipeline import errors


def every_pipeline_module() -> list[str]:
    return [m.name for m in pkgutil.walk_packages(pipeline.__path__, "pipeline.")]


def test_every_exit_code_is_defined_in_errors_py_and_none_is_shared():
    codes: dict[int, str] = {}
    for name in dir(errors):
        cls = getattr(errors, name)
        if isinstance(cls, type) and issubclass(cls, errors.PipelineError) and "exit_code" in vars(cls):
            assert cls.exit_code not in codes, f"{name} and {codes[cls.exit_code]} share {cls.exit_code}"
            codes[cls.exit_code] = name
    assert sorted(codes) == list(range(1, 16))


def test_no_module_outside_errors_py_sets_an_exit_code():
    for module in every_pipeline_module():
        if module.startswith(("pipeline.parity", "bench", "pipeline.vllm_driver")) or module.endswith("__main__"):
            continue  # they need vLLM or torch, and define no pipeline error
        for value in vars(importlib.import_module(module)).values():
            if isinstance(value, type) and issubclass(value, errors.PipelineError):
                assert value.__module__ == "pipeline.errors", f"{value.__name__} is defined in {module}"
