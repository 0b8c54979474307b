"""The intake screen passes this repository and rejects each rule's fixture,
naming the rule, the file and the line."""

from __future__ import annotations

import importlib.util
import sys
import textwrap
from pathlib import Path

import pytest

from pipeline.paths import ROOT

spec = importlib.util.spec_from_file_location("intake_screen", ROOT / "ci" / "intake_screen.py")
intake = importlib.util.module_from_spec(spec)
sys.modules["intake_screen"] = intake  # dataclasses look their module up there
spec.loader.exec_module(intake)

BINDING = """
py::object helper(const py::handle& h) {
  return h.attr("compute")(1);
}
py::dict connector_namespace() {
  py::dict ns;
  ns["wait_for_save"] = named("wait_for_save", [](py::object self) {
    WorkerSide& w = worker_of(self);
    w.wait_for_save();
  });
  ns["get_finished"] = named("get_finished", [](py::object self, py::object finished) -> py::tuple {
    return helper(finished);
  });
  ns["register_kv_caches"] = named("register_kv_caches", [](py::object self, py::dict kv) {
    self.attr("setup")(kv);
  });
  return ns;
}
"""
# Every other per-step method, native: rule 3 must find a body for each.
BINDING += "".join(
    f'py::dict more_{m}() {{\n  ns["{m}"] = named("{m}", [](py::object self) {{\n    return 0;\n  }});\n}}\n'
    for m in intake.PER_STEP
    if m not in ("wait_for_save", "get_finished")
)


# A binding whose per-step methods are all native: what a clean tree holds.
NATIVE_BINDING = "".join(
    f'py::dict more_{m}() {{\n  ns["{m}"] = named("{m}", [](py::object self) {{\n    return 0;\n  }});\n}}\n'
    for m in intake.PER_STEP
)


def tree(tmp_path: Path, files: dict[str, str]) -> Path:
    """A screened tree: these files over a clean native binding."""
    for rel, text in {"engine/bindings/module.cpp": NATIVE_BINDING, **files}.items():
        path = tmp_path / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(textwrap.dedent(text))
    return tmp_path


def test_this_repository_passes():
    assert intake.screen(ROOT) == []


def test_rule1_rejects_a_python_module_in_the_engine(tmp_path):
    root = tree(
        tmp_path,
        {
            "engine/src/helpers.py": "x = 1\n",
            "reference/activekv_reference/ok.py": "y = 2\n",
            "engine/src/core.cpp": "int f() { return 1; }\n",
        },
    )
    findings = intake.screen(root)
    assert [(f.rule, f.file) for f in findings] == [(1, "engine/src/helpers.py")]


def test_rule2_rejects_a_python_import_from_cpp(tmp_path):
    root = tree(
        tmp_path,
        {
            "engine/src/core.cpp": 'void f() {\n  auto os = py::module_::import("os");\n'
            '  PyImport_ImportModule("json");\n}\n'
        },
    )
    findings = intake.screen(root)
    assert [(f.rule, f.file, f.line) for f in findings] == [
        (2, "engine/src/core.cpp", 2),
        (2, "engine/src/core.cpp", 3),
    ]
    assert "(os)" in findings[0].message and "PyImport_ImportModule" in findings[1].message


def test_rule3_rejects_a_python_call_reached_from_a_per_step_method(tmp_path):
    root = tree(tmp_path, {"engine/bindings/module.cpp": BINDING})
    findings = intake.screen(root)
    # get_finished reaches helper's call; register_kv_caches is not per step.
    assert [(f.rule, f.file, f.line) for f in findings] == [(3, "engine/bindings/module.cpp", 3)]
    assert "get_finished" in findings[0].message and "compute" in findings[0].message


def test_rule3_follows_helpers_into_other_binding_files(tmp_path):
    # The binding split by job: get_finished reaches a member of a class of
    # another file, defined outside its class, which calls into Python.
    connector = BINDING.replace("return helper(finished);", "return adapter_of(self).finish(finished);")
    adapter = (
        "Adapter& adapter_of(py::object self) {\n  return *static_cast<Adapter*>(nullptr);\n}\n"
        'py::object Adapter::finish(const py::handle& h) const {\n  return h.attr("compute")(1);\n}\n'
    )
    root = tree(tmp_path, {"engine/bindings/connector.cpp": connector, "engine/bindings/adapter.cpp": adapter})
    findings = intake.screen(root)
    assert [(f.rule, f.file, f.line) for f in findings] == [(3, "engine/bindings/adapter.cpp", 5)]
    assert "get_finished" in findings[0].message and "compute" in findings[0].message


def test_rule3_fails_when_it_finds_no_body_of_a_per_step_method(tmp_path):
    # As if the binding were split and one method defined another way.
    binding = BINDING.replace(
        'ns["wait_for_save"] = named("wait_for_save", [](py::object self) {',
        'ns["wait_for_save"] = py::cpp_function([](py::object self) {',
    )
    root = tree(tmp_path, {"engine/bindings/module.cpp": binding})
    missing = [f for f in intake.screen(root) if "found no body" in f.message]
    assert [(f.rule, f.file) for f in missing] == [(3, "engine/bindings")]
    assert "wait_for_save" in missing[0].message


def test_rule3_checks_every_per_step_method_of_this_repository():
    found = set()
    for path in (ROOT / intake.BINDINGS).rglob("*"):
        if path.suffix in intake.CPP_SUFFIXES:
            found |= set(intake.per_step_bodies(path.read_text()))
    assert found == set(intake.PER_STEP)


@pytest.mark.parametrize(
    "files, rules",
    [
        ({}, [1, 2, 3]),  # nothing at all: no rule may pass by looking at nothing
        ({"engine/README.md": "no sources\n"}, [2, 3]),
        ({"engine/src/core.cpp": "int f() { return 1; }\n"}, [3]),  # the bindings moved away
    ],
)
def test_a_rule_that_finds_nothing_to_check_fails(tmp_path, files, rules):
    for rel, text in files.items():
        (tmp_path / rel).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / rel).write_text(text)
    findings = intake.screen(tmp_path)
    assert sorted({f.rule for f in findings}) == rules
    assert all("found no" in f.message for f in findings)


def test_an_allowlist_entry_needs_a_reason(tmp_path):
    allow = tmp_path / "allow.toml"
    allow.write_text('[[cpp_imports]]\nfile = "engine/src/core.cpp"\nmodule = "os"\nreason = ""\n')
    with pytest.raises(SystemExit, match="has no reason"):
        intake.screen(tmp_path, allow)


def test_an_allowlisted_import_passes_with_its_reason(tmp_path):
    root = tree(tmp_path, {"engine/src/core.cpp": 'void f() { py::module_::import("os"); }\n'})
    allow = tmp_path / "allow.toml"
    allow.write_text('[[cpp_imports]]\nfile = "engine/src/core.cpp"\nmodule = "os"\nreason = "needed"\n')
    assert intake.screen(root, allow) == []
