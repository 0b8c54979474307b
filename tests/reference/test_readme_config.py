"""The README's table of `kv_connector_extra_config` keys is the engine's:
every key the config accepts has its row, no row names a key it refuses, and
each row's default is the one the config takes when the key is left out (the
native engine's keys and messages equal the reference's word for word:
tests/unit/test_native_module.py, engine/tests/test_config.cpp)."""

from __future__ import annotations

import dataclasses
import re
from pathlib import Path

from activekv_reference.config import _STREAMING_RANGES, GIB, ActiveKVConfig

README = Path(__file__).resolve().parents[2] / "README.md"


def config_rows() -> dict[str, str]:
    """The section's table: key -> its default column as written."""
    section = README.read_text().split("## Configuring the connector", 1)[1].split("\n## ", 1)[0]
    rows = {}
    for line in section.splitlines():
        if m := re.match(r"\| `(\w+)` \| ([^|]+) \|", line):
            rows[m.group(1)] = m.group(2).strip()
    return rows


def default_as_written(text: str) -> object:
    """`"exact"` -> 'exact', `1 GiB` -> 2**30, `30000` -> 30000, `none (off)` -> None."""
    first = text.split(" (")[0].strip()
    if first == "none":
        return None
    if m := re.fullmatch(r'`"(\w+)"`', first):
        return m.group(1)
    if m := re.fullmatch(r"(\d+) GiB", first):
        return int(m.group(1)) * GIB
    assert re.fullmatch(r"\d+", first), f"README default {text!r}: not a form this test reads"
    return int(first)


def test_every_accepted_key_has_its_row_and_no_other():
    fields = {f.name for f in dataclasses.fields(ActiveKVConfig)}
    assert set(config_rows()) == fields


def test_each_rows_default_is_the_configs():
    defaults = ActiveKVConfig()
    for key, written in config_rows().items():
        assert default_as_written(written) == getattr(defaults, key), f"README's default for {key}: {written!r}"


def test_the_streaming_row_names_every_streaming_key():
    row = next(line for line in README.read_text().splitlines() if line.startswith("| `streaming` |"))
    for key in [*_STREAMING_RANGES, "homes"]:
        assert f'"{key}"' in row, f"README's streaming row does not name {key!r}"
