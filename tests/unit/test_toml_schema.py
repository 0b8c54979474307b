"""The TOML lists against their JSON schemas (pipeline/toml_schema.py): the
files as committed pass, and a misspelt key, a value out of its set, a
missing reason or a wrong type is refused naming the file, the entry and the
key; the retention audit stops on such a file rather than reading the label
as absent."""

from __future__ import annotations

import tomllib

import pytest

from pipeline import boundary, toml_schema
from pipeline.errors import ConfigError
from pipeline.paths import ROOT


@pytest.mark.parametrize("file", sorted(toml_schema.CHECKED))
def test_each_committed_file_matches_its_schema(file):
    schema = toml_schema.CHECKED[file]
    assert toml_schema.problems(tomllib.loads((ROOT / file).read_text()), schema) == []


def test_every_schema_is_used_and_every_file_exists():
    assert all((ROOT / f).is_file() for f in toml_schema.CHECKED)
    assert sorted(p.name for p in toml_schema.SCHEMAS.glob("*.schema.json")) == sorted(toml_schema.CHECKED.values())


def retention_text(**changes: object) -> str:
    entry = {
        "version": "0.34.0",
        "patch": "0001-connector-has-layer-work.patch",
        "file": "vllm/distributed/kv_transfer/kv_connector/v1/base.py",
        "hunk": 1,
        "label": "contract",
        "cite": "base.py:1-2",
        "why": "vLLM's own class",
    }
    entry.update(changes)
    fields = "\n".join(f"{k} = {v!r}" if isinstance(v, int) else f'{k} = "{v}"' for k, v in entry.items())
    return f"[[hunk]]\n{fields}\n"


@pytest.mark.parametrize(
    ("changes", "says"),
    [
        ({"label": "contractt"}, "hunk[2].label: 'contractt' is not one of ['contract', 'convenience', 'delegate']"),
        ({"hunk": "1"}, "hunk[2].hunk: '1' is not of type 'integer'"),
        ({"lable": "contract"}, "hunk[2]: Additional properties are not allowed ('lable' was unexpected)"),
        ({"why": ""}, "hunk[2].why: '' should be non-empty"),
    ],
)
def test_a_bad_retention_entry_is_named(tmp_path, changes, says):
    path = tmp_path / "retention.toml"
    path.write_text(retention_text() + "\n" + retention_text(**changes))
    with pytest.raises(ConfigError) as e:
        toml_schema.load_checked(path, "retention.schema.json")
    assert str(e.value).startswith(f"{path}: 1 problem(s) against pipeline/schemas/retention.schema.json")
    assert says in str(e.value)


def test_an_allowlist_entry_without_its_reason_is_refused():
    data = {"cpp_imports": [{"file": "engine/bindings/module.cpp", "module": "vllm.x", "reson": "typo"}]}
    found = toml_schema.problems(data, "intake-allowlist.schema.json")
    assert "cpp_imports[1]: 'reason' is a required property" in found
    assert "cpp_imports[1]: Additional properties are not allowed ('reson' was unexpected)" in found


def test_problems_come_in_the_files_order():
    cells = [{"mode": "exact", "scenario": f"s{i}"} for i in range(12)]
    cells[2]["mode"] = cells[10]["mode"] = "neither"
    found = toml_schema.problems({"gating": cells}, "parity-expected.schema.json")
    assert [line.split(":")[0] for line in found] == ["gating[3].mode", "gating[11].mode"]


def test_a_pin_with_a_short_hash_is_refused():
    pin = {"name": "vllm", "version": "0.34.0", "file": "vllm-0.34.0-cp38-abi3-manylinux_2_28_x86_64.whl"}
    found = toml_schema.problems({"distribution": [{**pin, "sha256": "abc"}]}, "vllm-distributions.schema.json")
    assert found == ["distribution[1].sha256: 'abc' does not match '^[0-9a-f]{64}$'"]


def test_a_cell_of_an_unknown_mode_is_refused():
    data = {"gating": [{"mode": "exact", "scenario": "miss"}, {"mode": "exactt", "scenario": "miss"}]}
    assert toml_schema.problems(data, "parity-expected.schema.json") == [
        "gating[2].mode: 'exactt' is not one of ['exact', 'compressed']"
    ]


def test_the_retention_audit_stops_on_a_misspelt_label(tmp_path):
    labels = tmp_path / "retention.toml"
    labels.write_text(retention_text(label="delegat"))
    with pytest.raises(ConfigError, match=r"hunk\[1\]\.label: 'delegat' is not one of"):
        boundary.retention("0.34.0", labels_file=labels)
