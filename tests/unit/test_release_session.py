"""The release session's cheap checks come before its expensive install
(torch, vLLM): --help, the flags, the signing key and a dirty tree are
answered in the pipeline's own environment; a bare ci/run-nox runs nothing
and says what to run."""

from __future__ import annotations

import importlib.machinery
import importlib.util
import subprocess
import sys
import types

import pytest

from pipeline import sessions
from pipeline.errors import DirtyTreeError
from pipeline.paths import ROOT
from pipeline.stages import registry

from tests.unit.test_release_run import a_run, key  # noqa: F401  (the key fixture)

# --- the cheap checks, before the expensive install -----------------------------------


def test_preflight_prints_the_plan_and_refuses_a_dirty_tree_unless_allowed(key, tmp_path, capsys):  # noqa: F811  (the key fixture)
    repo = tmp_path / "repo"
    repo.mkdir()

    def git(*args):
        subprocess.run(["git", *args], cwd=repo, check=True, capture_output=True)

    git("init", "-q")
    (repo / "a.txt").write_text("a\n")
    git("add", "a.txt")
    git("-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qm", "a")
    registry.preflight(a_run(key=str(key[0])), root=repo)
    assert "preflight passed" in capsys.readouterr().out
    (repo / "a.txt").write_text("changed\n")
    with pytest.raises(DirtyTreeError, match="a.txt"):
        registry.preflight(a_run(key=str(key[0])), root=repo)
    assert "release plan:" in capsys.readouterr().out
    registry.preflight(a_run(key=str(key[0]), allow_dirty=True), root=repo)
    assert "uncommitted changes allowed (--allow-dirty" in capsys.readouterr().out


@pytest.mark.parametrize(
    ("posargs", "wanted"),
    [
        (["--help"], True),
        (["-h"], True),
        (["--profile", "cuda", "--help"], True),
        (["--he"], True),
        ([], False),
        (["--allow-dirty"], False),
        (["--profile", "cuda", "--key", "k.pem"], False),
    ],
)
def test_help_is_told_from_the_release_s_own_flags(posargs, wanted):
    assert sessions.asks_for_help(posargs) is wanted


class FakeSession:
    """What the release session asks of nox, recorded; a command naming
    `fails` fails as nox's session.run does (it raises)."""

    def __init__(self, posargs, fails=None):
        self.posargs = posargs
        self.fails = fails
        self.calls = []

    def run(self, *args, **kwargs):
        self.calls.append(" ".join(args))
        if self.fails and self.fails in args:
            raise RuntimeError(f"{' '.join(args)} failed")

    def install(self, *args, **kwargs):
        self.calls.append("install " + " ".join(args))


@pytest.fixture
def release_session(monkeypatch):
    """noxfile.py's release session (nox itself stubbed: only its decorator
    is used), with the tests' environment install recorded, not made."""
    fake = types.ModuleType("nox")
    fake.session = lambda *args, **kwargs: (lambda f: f)
    fake.options = types.SimpleNamespace()
    fake.Session = object
    monkeypatch.setitem(sys.modules, "nox", fake)
    spec = importlib.util.spec_from_file_location("noxfile_under_test", ROOT / "noxfile.py")
    noxfile = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(noxfile)
    monkeypatch.setattr(sessions, "install_cpu_test_env", lambda s: s.calls.append("install_cpu_test_env"))
    return noxfile.release


def test_release_help_returns_without_the_test_environment_install(release_session):
    session = FakeSession(["--help"])
    release_session(session)
    assert session.calls == ["install -r packaging/release-requirements.txt", "python -m pipeline release --help"]


def test_a_refused_preflight_stops_the_release_session_before_the_install(release_session):
    session = FakeSession(["--key", "k.pem"], fails="plan")  # e.g. a dirty tree: the plan command exits 11
    with pytest.raises(RuntimeError):
        release_session(session)
    assert "install_cpu_test_env" not in session.calls
    assert session.calls[-1] == "python -m pipeline plan --key k.pem"


def test_the_release_session_checks_then_installs_then_releases_with_the_same_flags(release_session):
    session = FakeSession(["--allow-dirty"])
    release_session(session)
    assert session.calls == [
        "install -r packaging/release-requirements.txt",
        "python -m pipeline plan --allow-dirty",
        "install_cpu_test_env",
        "python -m pipeline release --allow-dirty",
    ]


def test_the_pipeline_prints_the_release_help_and_knows_the_plan_command():
    result = subprocess.run(
        [sys.executable, "-m", "pipeline", "release", "--help"], cwd=ROOT, capture_output=True, text=True, timeout=60
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.startswith("usage: python -m pipeline") and "python -m pipeline plan" in result.stdout
    assert "--allow-dirty" in result.stdout and "--parity-evidence" in result.stdout


# --- a bare ci/run-nox -----------------------------------------------------------------


def run_nox_module():
    loader = importlib.machinery.SourceFileLoader("run_nox_under_test", str(ROOT / "ci" / "run-nox"))
    module = importlib.util.module_from_spec(importlib.util.spec_from_loader(loader.name, loader))
    loader.exec_module(module)
    return module


def test_a_bare_run_nox_lists_the_sessions_and_the_readmes_two_commands(capsys):
    run_nox = run_nox_module()
    assert run_nox.nox_arguments([]) == ["--list"]  # never nox's default session
    printed = capsys.readouterr().out
    readme = (ROOT / "README.md").read_text()
    commands = readme[readme.index("## Commands") :].split("\n## ", 1)[0]
    for command in ("python3 ci/run-nox -s tests", "python3 ci/run-nox -s release"):
        assert command in printed and f"    {command}\n" in commands


def test_run_nox_hands_any_arguments_to_nox_as_they_are(capsys):
    run_nox = run_nox_module()
    assert run_nox.nox_arguments(["-s", "tests"]) == ["-s", "tests"]
    assert run_nox.nox_arguments(["-s", "release", "--", "--help"]) == ["-s", "release", "--", "--help"]
    assert capsys.readouterr().out == ""
    assert "python3 ci/run-nox -s tests" in (ROOT / ".ci" / "run").read_text()  # CI's command is not bare
