"""The project's TOML lists checked against a JSON schema each
(pipeline/schemas/): a typo in a key, a label out of its set or a missing
reason is refused naming the file, the entry and the key, not read as absent.

release.toml and packaging/payload-policy.toml are not here: their loaders
(pipeline/config.py, pipeline/audit/policy.py) check every key themselves,
with rules across keys a schema cannot say.

    python -m pipeline.toml_schema      every file below; exit 2 naming each problem
"""

from __future__ import annotations

import json
import sys
import tomllib
from pathlib import Path
from typing import Any

import jsonschema

from pipeline.errors import ConfigError
from pipeline.paths import ROOT

SCHEMAS = ROOT / "pipeline" / "schemas"

# Each file (relative to the repository) and its schema.
CHECKED = {
    "ci/retention.toml": "retention.schema.json",
    "ci/intake-allowlist.toml": "intake-allowlist.schema.json",
    "packaging/vllm-distributions.toml": "vllm-distributions.schema.json",
    "pipeline/parity/expected.toml": "parity-expected.schema.json",
}


def where(path: Any) -> str:
    """A key's place as the TOML reads: hunk[3].label (entries counted from 1)."""
    out = ""
    for part in path:
        out += f"[{part + 1}]" if isinstance(part, int) else f".{part}" if out else str(part)
    return out or "the top level"


def problems(data: dict, schema: str) -> list[str]:
    """What in `data` the schema refuses, one line each, in the file's order."""
    validator = jsonschema.Draft202012Validator(json.loads((SCHEMAS / schema).read_text()))
    # Entries by their number (the 10th after the 9th), keys by name.
    errors = sorted(
        validator.iter_errors(data),
        key=lambda e: [(0, p, "") if isinstance(p, int) else (1, 0, str(p)) for p in e.absolute_path],
    )
    return [f"{where(e.absolute_path)}: {e.message}" for e in errors]


def load_checked(path: Path, schema: str) -> dict:
    """The TOML file's tables, once the schema accepts them; ConfigError otherwise."""
    name = path.relative_to(ROOT) if path.is_relative_to(ROOT) else path
    try:
        data = tomllib.loads(path.read_text())
    except (OSError, UnicodeDecodeError, tomllib.TOMLDecodeError) as e:
        raise ConfigError(f"{name}: unreadable ({e})") from None
    found = problems(data, schema)
    if found:
        raise ConfigError(
            f"{name}: {len(found)} problem(s) against pipeline/schemas/{schema}:\n  "
            + "\n  ".join(found)
            + "\nMend the entry (a key's spelling, its type, a value out of its set) and run again."
        )
    return data


def main() -> int:
    failed = 0
    for file, schema in CHECKED.items():
        try:
            load_checked(ROOT / file, schema)
            print(f"{file}: matches pipeline/schemas/{schema}")
        except ConfigError as e:
            print(f"error: {e}", file=sys.stderr)
            failed = ConfigError.exit_code
    return failed


if __name__ == "__main__":
    sys.exit(main())
