"""A target's runtime environment pinned with hashes (packaging/<target>/constraints.txt):
everything its vLLM and torch need on its Python, resolved by pip against the
package index, one `name==version --hash=sha256:...` line per distribution
(the file pip chose for the target's platform). The runtime image installs it
with `pip install --require-hashes --no-deps -r`, and the release publishes it
for operators (pipeline/provenance.py), who install with hashes too.

    python -m pipeline.runtime_pins cuda --vllm-wheel vllm-0.34.0-...whl [--python-exe python3.12] [--out FILE]

The requirements are the vLLM wheel's own (Requires-Dist) and the target's
torch pin, less the pins of packaging/<target>/overrides.toml: a vLLM pin that
the index cannot give (the file says why, and what is taken instead). The
machine's own pip configuration (its wheel folders, constraints) is left
out: what is pinned is what the index gives. Standard library only, but for
pip itself.
"""

from __future__ import annotations

import argparse
import email.parser
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import tomllib
import zipfile
from pathlib import Path

from pipeline import config
from pipeline.errors import ConfigError, PipelineError
from pipeline.paths import ROOT, relative

# What the runtime images run on: Debian bookworm's glibc (2.36), x86_64.
GLIBC_MINOR = 36
PLATFORMS = [f"manylinux_2_{m}_x86_64" for m in range(GLIBC_MINOR, 4, -1)] + [
    "manylinux2014_x86_64",
    "manylinux2010_x86_64",
    "manylinux1_x86_64",
    "any",
]
# Environment variables that would bring the machine's own sources into the resolution.
PIP_SOURCES = ("PIP_FIND_LINKS", "PIP_EXTRA_INDEX_URL", "PIP_INDEX_URL", "PIP_CONSTRAINT", "PIP_NO_INDEX")
_LINE = re.compile(r"^([A-Za-z0-9][A-Za-z0-9._-]*)==(\S+)((?: --hash=sha256:[0-9a-f]{64})+)$")


def overrides_file(target: str) -> Path:
    return ROOT / "packaging" / target / "overrides.toml"


def load_overrides(path: Path) -> dict[str, dict]:
    """{name: {"pinned", "instead", "why"}}: vLLM pins the index cannot give."""
    if not path.is_file():
        return {}
    out = {}
    for i, o in enumerate(tomllib.loads(path.read_text()).get("override", [])):
        if (
            not isinstance(o, dict)
            or set(o) != {"name", "pinned", "instead", "why"}
            or not all(isinstance(v, str) and v for v in o.values())
        ):
            raise ConfigError(
                f"{relative(path)}: [[override]] {i + 1} needs exactly name, pinned, instead and why (strings)"
            )
        out[canonical(o["name"])] = o
    return out


def canonical(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def vllm_requirements(wheel: Path) -> list[str]:
    """The wheel's Requires-Dist lines (PEP 508, markers kept)."""
    with zipfile.ZipFile(wheel) as zf:
        (metadata,) = [n for n in zf.namelist() if n.count("/") == 1 and n.endswith(".dist-info/METADATA")]
        message = email.parser.Parser().parsestr(zf.read(metadata).decode())
    return message.get_all("Requires-Dist") or []


def requirements(vllm_wheel: Path, torch: str, overrides: dict[str, dict]) -> list[str]:
    """What to resolve: vLLM's requirements with each override's pin put in
    place of vLLM's, and the target's torch."""
    out, replaced = [], set()
    for line in vllm_requirements(vllm_wheel):
        name = canonical(re.split(r"[\s\[<>=!~;(]", line, maxsplit=1)[0])
        if name in overrides:
            o = overrides[name]
            if f"=={o['pinned']}" not in line.replace(" ", ""):
                raise ConfigError(
                    f"override of {name}: {vllm_wheel.name} requires {line!r}, not "
                    f"{name}=={o['pinned']}; the override no longer applies: remove it"
                )
            out.append(f"{o['name']}=={o['instead']}")
            replaced.add(name)
        else:
            out.append(line)
    missing = sorted(set(overrides) - replaced)
    if missing:
        raise ConfigError(f"override of {missing[0]}: {vllm_wheel.name} does not require it")
    return [*out, f"torch=={torch}"]


def interpreter(python: str, given: Path | None) -> Path:
    """A CPython `python` (X.Y) to run pip with: pip evaluates requirements'
    markers (python_version > "3.11") against the interpreter it runs in,
    whatever --python-version says, so it must be one of the target's."""
    exe = str(given) if given is not None else shutil.which(f"python{python}")
    found = (
        subprocess.run([exe, "-c", "import sys; print('%d.%d' % sys.version_info[:2])"], capture_output=True, text=True)
        if exe
        else None
    )
    if found is None or found.returncode != 0 or found.stdout.strip() != python:
        raise ConfigError(
            f"no CPython {python} to resolve with ({exe or f'python{python} not on PATH'}"
            f"{': it is ' + found.stdout.strip() if found and found.returncode == 0 else ''}); "
            f"give one with --python-exe (pip reads requirements' markers from its own Python)"
        )
    return Path(exe)


def resolve(lines: list[str], python: str, index_url: str, exe: Path) -> list[dict]:
    """pip's resolution of `lines` for CPython `python` (run by `exe`, of that
    version) on the runtime's platform: [{name, version, file, sha256}],
    sorted by name."""
    tag = "cp" + python.replace(".", "")
    env = {k: v for k, v in os.environ.items() if k not in PIP_SOURCES}
    env["PIP_CONFIG_FILE"] = os.devnull  # no machine or user configuration: the index alone
    with tempfile.TemporaryDirectory(prefix="activekv-pins-") as tmp:
        reqs, report = Path(tmp) / "requirements.txt", Path(tmp) / "report.json"
        reqs.write_text("\n".join(lines) + "\n")
        cmd = [
            str(exe),
            "-m",
            "pip",
            "install",
            "--dry-run",
            "--ignore-installed",
            "--quiet",
            "--report",
            str(report),
            "--index-url",
            index_url,
            "--only-binary=:all:",
            "--python-version",
            python,
            "--implementation",
            "cp",
            "--abi",
            tag,
            "--abi",
            "abi3",
            "--abi",
            "none",
            *(a for p in PLATFORMS for a in ("--platform", p)),
            "--target",
            str(Path(tmp) / "never"),
            "-r",
            str(reqs),
        ]
        print("+", " ".join(cmd), flush=True)
        if subprocess.run(cmd, env=env).returncode != 0:
            raise PipelineError("pip could not resolve the runtime environment (its output is above)")
        installs = json.loads(report.read_text())["install"]
    out = []
    for item in installs:
        info = item["download_info"]
        sha = info.get("archive_info", {}).get("hashes", {}).get("sha256")
        if not sha:
            raise PipelineError(f"{info['url']}: the index gave no sha256 for it")
        out.append(
            {
                "name": canonical(item["metadata"]["name"]),
                "version": item["metadata"]["version"],
                "file": info["url"].rsplit("/", 1)[-1],
                "sha256": sha,
            }
        )
    return sorted(out, key=lambda p: p["name"])


def render(target: config.Target, vllm_wheel: str, pins: list[dict], overrides: dict[str, dict]) -> str:
    lines = [
        f"# The {target.name} target's runtime environment (release.toml [targets.{target.name}]): what",
        f"# {target.vllm_distribution} {target.vllm_version} ({vllm_wheel}) and torch {target.torch} need on "
        f"CPython {target.python[0]},",
        f"# x86_64 Linux (glibc 2.36), resolved by pip (run by CPython {target.python[0]}: requirements'",
        "# markers are its own) against the index and pinned by the sha256",
        "# of the file pip chose. Made by (do not edit by hand):",
        f"#   python -m pipeline.runtime_pins {target.name} --vllm-wheel {vllm_wheel}",
        "# Installed by the runtime image (pip install --require-hashes --no-deps -r) and published",
        "# for operators: pip refuses any other byte.",
    ]
    for o in overrides.values():
        lines.append(
            f"# Not {target.vllm_distribution}'s pin: {o['name']}=={o['instead']} (it pins {o['pinned']}): {o['why']}"
        )
    lines += [
        f"{p['name']}=={p['version']} --hash=sha256:{p['sha256']}"
        for p in pins
        if p["name"] != canonical(target.vllm_distribution)
    ]
    return "\n".join(lines) + "\n"


def parse(text: str) -> dict[str, tuple[str, tuple[str, ...]]]:
    """{name: (version, sha256s)} of a pinned file; ValueError on a line that
    is not `name==version --hash=sha256:...`."""
    out = {}
    for number, line in enumerate(text.splitlines(), 1):
        if not line.strip() or line.startswith("#"):
            continue
        m = _LINE.match(line)
        if m is None:
            raise ValueError(f"line {number}: not name==version --hash=sha256:<64 hex>: {line!r}")
        hashes = tuple(
            h.removeprefix(" --hash=sha256:") for h in re.findall(r" --hash=sha256:[0-9a-f]{64}", m.group(3))
        )
        out[canonical(m.group(1))] = (m.group(2), hashes)
    return out


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m pipeline.runtime_pins",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("target")
    parser.add_argument(
        "--vllm-wheel",
        type=Path,
        required=True,
        help="the target's pinned vLLM wheel (packaging/vllm-distributions.toml)",
    )
    parser.add_argument("--out", type=Path, help="default packaging/<target>/constraints.txt")
    parser.add_argument(
        "--python-exe", type=Path, help="a CPython of the target's first Python version (default pythonX.Y on PATH)"
    )
    args = parser.parse_args(argv)
    try:
        target = config.load().target(args.target)
        overrides = load_overrides(overrides_file(target.name))
        lines = requirements(args.vllm_wheel, target.torch, overrides)
        pins = resolve(lines, target.python[0], target.index_url, interpreter(target.python[0], args.python_exe))
        out = args.out or ROOT / "packaging" / target.name / "constraints.txt"
        out.write_text(render(target, args.vllm_wheel.name, pins, overrides))
    except PipelineError as e:
        print(f"error: {e}", file=sys.stderr)
        return e.exit_code
    print(f"{relative(out)}: {len(pins)} distributions pinned by sha256")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
