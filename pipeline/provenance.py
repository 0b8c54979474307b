"""The operator's files, written by the manifest stage beside the manifest and
listed in it (so the manifest's signature covers them):

- `activekv-<version>-<target>-requirements.txt`: the target's published
  wheels (engine wheels and the patched vLLM wheel), one `name==version` line
  per distribution with the sha256 of each of its wheels, for
  `pip install --require-hashes --no-deps -r FILE`. One file per target: an
  operator installs one target, and two targets' vLLM distributions must
  never be installed together.
- `activekv-<version>-<target>-constraints.txt`: the dependency set the
  release was built and tested with (packaging/<target>/constraints.txt), for
  the pip command that installs our wheels' dependencies (torch, vLLM's own):
  the cpu target's by version only (a second command, constraining pip's
  resolution), the cuda target's every file by sha256 (pipeline/runtime_pins.py:
  installed with ours in one `--require-hashes` command). Written only for a
  target that has the file.
- `activekv-<version>.intoto.jsonl`: the provenance, an in-toto Statement v1
  with a SLSA provenance v1 predicate, in a DSSE envelope signed with the
  release key (one line of JSON). Its subjects are every other artifact of
  the manifest: files by sha256, images by their id (config digest), which
  `docker image inspect --format '{{.Id}}'` prints for a pulled image.

Publishing adds `activekv-<version>-images.txt` (pipeline/stages/publish.py): each
image as REGISTRY/NAME@sha256:<registry manifest digest>, known only once
the registry holds it.
"""

from __future__ import annotations

import base64
import datetime
import json
from pathlib import Path

from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from pipeline import signing
from pipeline.digest import sha256_of
from pipeline.paths import ROOT
from pipeline.release_format import (
    OPERATOR_KINDS,
    PROJECT,
    WHEEL_KINDS,
    check_schema,
    constraints_name,
    provenance_name,
    requirements_name,
    wheel_name,
)

STATEMENT_TYPE = "https://in-toto.io/Statement/v1"
PREDICATE_TYPE = "https://slsa.dev/provenance/v1"
PAYLOAD_TYPE = "application/vnd.in-toto+json"
BUILD_TYPE = "https://activekv.invalid/release-pipeline/v1"
BUILDER_ID = "https://activekv.invalid/release-pipeline/builder/local"


def distribution(wheel: str) -> tuple[str, str]:
    """(project name as pip spells it, version) of a wheel file name."""
    parts = wheel_name(wheel)
    return parts.project, parts.version


def requirements_text(version: str, target: str, wheels: list[dict], *, hashed_constraints: bool = False) -> str:
    """A requirements file for pip's hash-checking mode: one line per
    distribution, every wheel of it as a --hash (pip takes the one it
    installs). Its comment says how to install: with constraints pinned by
    hash (hashed_constraints, the cuda target's), both files in one pip
    command; else ours, then the dependencies at the constraints' versions."""
    hashes: dict[tuple[str, str], list[str]] = {}
    for a in wheels:
        hashes.setdefault(distribution(a["file"]), []).append(a["sha256"])
    if hashed_constraints:
        lines = [
            f"# ActiveKV {version}, target {target}: the release's own wheels, pinned by sha256;",
            f"# {constraints_name(version, target)} pins every dependency by sha256 too. Both at once:",
            f"#   pip install --require-hashes --no-deps -r {requirements_name(version, target)} "
            f"-r {constraints_name(version, target)}",
        ]
    else:
        lines = [
            f"# ActiveKV {version}, target {target}: the release's own wheels, pinned by sha256.",
            f"#   pip install --require-hashes --no-deps -r {requirements_name(version, target)}",
            "# then their dependencies, ours being installed already (see the release's README):",
            f"#   pip install -c {constraints_name(version, target)} " + " ".join(f"'{n}=={v}'" for n, v in hashes),
        ]
    lines += [f"{n}=={v} " + " ".join(f"--hash=sha256:{h}" for h in sorted(hs)) for (n, v), hs in hashes.items()]
    return "\n".join(lines) + "\n"


def constraints_text(version: str, target: str, source: Path) -> str:
    pins = [line for line in source.read_text().splitlines() if line.strip() and not line.startswith("#")]
    how = (
        "versions and the sha256 of each file, resolved by pip against PyPI"
        if any("--hash=sha256:" in p for p in pins)
        else "versions"
    )
    return (
        f"# ActiveKV {version}, target {target}: the dependency set the release was built and "
        f"tested with ({how}; these are not our files).\n" + "\n".join(pins) + "\n"
    )


def pae(payload_type: str, body: bytes) -> bytes:
    """DSSE's pre-authentication encoding: what the signature covers."""
    t = payload_type.encode()
    return b"DSSEv1 %d %s %d %s" % (len(t), t, len(body), body)


def envelope(statement: dict, key: Ed25519PrivateKey) -> dict:
    body = json.dumps(statement, sort_keys=True, separators=(",", ":")).encode()
    return {
        "payloadType": PAYLOAD_TYPE,
        "payload": base64.b64encode(body).decode(),
        "signatures": [
            {"keyid": signing.fingerprint(key), "sig": base64.b64encode(key.sign(pae(PAYLOAD_TYPE, body))).decode()}
        ],
    }


def subjects(artifacts: list[dict]) -> list[dict]:
    """Every artifact but the provenance: files by sha256, images by id."""
    out = []
    for a in artifacts:
        if a["kind"] == "provenance":
            continue
        if a["kind"] == "image":
            out.append({"name": a["ref"], "digest": {"sha256": a["digest"].removeprefix("sha256:")}})
        else:
            out.append({"name": a["file"], "digest": {"sha256": a["sha256"]}})
    return out


def statement(manifest: dict, *, started: str | None = None) -> dict:
    """The in-toto Statement (SLSA provenance v1) of a manifest's artifacts."""
    v = manifest["versions"]
    deps = [
        {
            "uri": f"git+{PROJECT}@{manifest['commit']}",
            "digest": {"gitCommit": manifest["commit"]},
            "annotations": {"tree_dirty": manifest["tree_dirty"]},
        }
    ]
    deps += [
        {"uri": b["ref"], "digest": {"sha256": b["id"].removeprefix("sha256:")}}
        for b in v["base_images"]
        if str(b.get("id", "")).startswith("sha256:")
    ]
    deps += [{"uri": f"pkg:pypi/torch@{pin}", "annotations": {"target": t}} for t, pin in sorted(v["torch"].items())]
    deps += [
        {"uri": "pkg:pypi/{}@{}".format(*pin.split("==", 1)), "annotations": {"target": t}}
        for t, pin in sorted(v["vllm"].items())
    ]
    deps.append({"uri": f"{PROJECT}:patches/vllm", "digest": {"sha256": v["patch_series_sha256"]}})
    return {
        "_type": STATEMENT_TYPE,
        "subject": subjects(manifest["artifacts"]),
        "predicateType": PREDICATE_TYPE,
        "predicate": {
            "buildDefinition": {
                "buildType": BUILD_TYPE,
                "externalParameters": {
                    "profile": manifest["profile"],
                    "commit": manifest["commit"],
                    "version": manifest["version"],
                },
                "internalParameters": {"compilers": v["compilers"], "audit": manifest["audit"]},
                "resolvedDependencies": deps,
            },
            "runDetails": {
                "builder": {"id": BUILDER_ID},
                "metadata": {
                    "invocationId": f"{PROJECT}-{manifest['version']}-{manifest['commit'][:12]}",
                    "startedOn": started or manifest["build_time"],
                    "finishedOn": manifest["build_time"],
                },
            },
        },
    }


def started_on(release_dir: Path, targets: list[str]) -> str | None:
    """When the earliest build stage began: its record's time less its duration."""
    times = []
    for t in targets:
        record = release_dir / t / "build.json"
        if record.is_file():
            seconds = json.loads(record.read_text()).get("seconds", 0)
            times.append(record.stat().st_mtime - float(seconds))
    if not times:
        return None
    return datetime.datetime.fromtimestamp(min(times), datetime.UTC).replace(microsecond=0).isoformat()


def _artifact(kind: str, target: str, path: Path) -> dict:
    return {"kind": kind, "target": target, "file": path.name, "sha256": sha256_of(path), "size": path.stat().st_size}


def add_operator_files(
    manifest: dict,
    out: Path,
    key: Ed25519PrivateKey,
    *,
    release_dir: Path | None = None,
    packaging: Path = ROOT / "packaging",
) -> list[Path]:
    """Write the requirements, constraints and provenance files into `out`
    and list them in `manifest` (before it is signed); returns their paths.
    A second call for the same manifest replaces what the first added."""
    manifest["artifacts"] = [a for a in manifest["artifacts"] if a["kind"] not in OPERATOR_KINDS]
    version = manifest["version"]
    out.mkdir(parents=True, exist_ok=True)
    written = []
    targets = sorted({a["target"] for a in manifest["artifacts"] if a["kind"] in WHEEL_KINDS})
    for target in targets:
        wheels = [a for a in manifest["artifacts"] if a["kind"] in WHEEL_KINDS and a["target"] == target]
        source = packaging / target / "constraints.txt"
        path = out / requirements_name(version, target)
        hashed = source.is_file() and "--hash=sha256:" in source.read_text()
        path.write_text(requirements_text(version, target, wheels, hashed_constraints=hashed))
        written.append(path)
        manifest["artifacts"].append(_artifact("requirements", target, path))
        if source.is_file():
            path = out / constraints_name(version, target)
            path.write_text(constraints_text(version, target, source))
            written.append(path)
            manifest["artifacts"].append(_artifact("constraints", target, path))
    started = started_on(release_dir, targets) if release_dir is not None else None
    path = out / provenance_name(version)
    path.write_text(json.dumps(envelope(statement(manifest, started=started), key), sort_keys=True) + "\n")
    written.append(path)
    manifest["artifacts"].append(_artifact("provenance", "all", path))
    check_schema(manifest)
    return written
