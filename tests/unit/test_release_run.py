"""A release as the release engineer reads it, without a stage's machinery:
the plan it prints first names the profile, each target's vLLM and torch,
each destination and the signing key; each stage's time is printed as it
ends, a failure names its stage, and the last lines name the outputs."""

from __future__ import annotations

import dataclasses

import pytest
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from pipeline import config, plan, signing
from pipeline.errors import BuildError, SigningKeyError
from pipeline.run import Options, Run
from pipeline.stages import registry
from pipeline.publishing.registry import LOCAL_REGISTRY_ADDR

STAGE_NAMES = [s.name for s in registry.RELEASE]


def a_run(profile: str | None = None, **options) -> Run:
    return Run.create(
        profile=profile, targets=None, python=None, options=Options(**options), cfg=config.load(environ={})
    )


@pytest.fixture
def key(tmp_path, monkeypatch):
    """An Ed25519 key the release is given (mode 0600), and its fingerprint."""
    monkeypatch.delenv("ACTIVEKV_SIGNING_KEY", raising=False)
    monkeypatch.delenv(signing.PASSPHRASE_ENV, raising=False)
    private = Ed25519PrivateKey.generate()
    path = tmp_path / "release-key.pem"
    path.write_bytes(
        private.private_bytes(
            serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
        )
    )
    path.chmod(0o600)
    return path, signing.fingerprint(private)


# --- the plan ------------------------------------------------------------------------


@pytest.mark.parametrize("profile", list(config.load(environ={}).profiles))
def test_the_plan_names_every_target_and_destination_of_the_profile(profile, key):
    run = a_run(profile, key=str(key[0]))
    text = "\n".join(plan.describe(run, STAGE_NAMES, version="9.8.7"))
    p = run.cfg.profiles[profile]
    assert f"activekv 9.8.7, profile {profile}" in text
    for t in run.targets:
        assert f"target {t.name}: {t.vllm_distribution} {t.vllm_version} on torch {t.torch}" in text
        assert f"activekv 9.8.7+{t.local_version}" in text
    assert f"index:      {p.index} " in text
    assert f"manifests:  {p.manifests}" in text
    if p.registry == "local":
        assert f"registry:   {LOCAL_REGISTRY_ADDR} (local" in text
    assert f"signing:    {key[0]} (--key); {key[1]}" in text
    assert " → ".join(STAGE_NAMES) in text


def test_the_plan_names_remote_destinations_as_release_toml_gives_them(key):
    run = a_run(key=str(key[0]))
    run.profile = dataclasses.replace(
        run.profile, index="https://pypi.example.org", registry="registry.example.org:5000", manifests="out/manifests"
    )
    text = "\n".join(plan.describe(run, STAGE_NAMES, version="1.0.0"))
    assert "index:      https://pypi.example.org (a package index" in text
    assert "--index-url https://pypi.example.org/simple/" in text
    assert "registry:   registry.example.org:5000\n" in text
    assert "image:    registry.example.org:5000/activekv-runtime-cpu:1.0.0" in text
    assert "manifests:  out/manifests" in text
    assert LOCAL_REGISTRY_ADDR not in text


def test_the_plan_says_how_each_targets_parity_gate_is_met(key, tmp_path):
    evidence = tmp_path / "parity.json"
    evidence.write_text("{}")
    cuda = "\n".join(plan.describe(a_run("cuda", key=str(key[0])), STAGE_NAMES, version="1.0.0"))
    assert "needs --parity-evidence cuda=FILE" in cuda
    given = "\n".join(
        plan.describe(a_run("cuda", key=str(key[0]), parity_evidence={"cuda": evidence}), STAGE_NAMES, version="1.0.0")
    )
    assert f"evidence {evidence} (--parity-evidence)" in given and "needs --parity-evidence" not in given
    cpu = "\n".join(plan.describe(a_run(key=str(key[0])), STAGE_NAMES, version="1.0.0"))
    assert "parity:   run here on the shipped wheels" in cpu


def test_the_plan_names_a_key_from_the_environment_and_an_encrypted_one_without_asking(key, monkeypatch):
    path, fingerprint = key
    monkeypatch.setenv("ACTIVEKV_SIGNING_KEY", str(path))
    assert signing.key_in_use(None) == (f"{path} (ACTIVEKV_SIGNING_KEY)", fingerprint)
    locked = path.with_name("locked.pem")
    locked.write_bytes(
        Ed25519PrivateKey.generate().private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.BestAvailableEncryption(b"secret"),
        )
    )
    locked.chmod(0o600)
    where, identity = signing.key_in_use(str(locked))
    assert where == f"{locked} (--key)" and "encrypted" in identity  # and nothing was asked
    monkeypatch.setenv(signing.PASSPHRASE_ENV, "secret")
    assert signing.key_in_use(str(locked))[1].startswith("SHA256:")


def test_a_key_that_cannot_sign_stops_the_release_before_any_stage(key):
    path, _ = key
    path.chmod(0o644)
    ran = []
    stages = [registry.Stage("build", "x", lambda run: ran.append("build"))]
    with pytest.raises(SigningKeyError, match="too open"):
        registry.run_release(a_run(key=str(path)), stages=stages)
    assert ran == []


# --- stage times, the failing stage, the outputs ------------------------------------


def test_elapsed_times_read_as_seconds_minutes_and_hours():
    assert registry.elapsed(4.24) == "4.2 s"
    assert registry.elapsed(187) == "3 min 07 s"
    assert registry.elapsed(3725) == "1 h 02 min"


class Clock:
    """A clock that moves on by the seconds each stage says it took."""

    def __init__(self):
        self.now = 1000.0

    def __call__(self):
        return self.now


def test_a_release_prints_each_stages_time_and_the_outputs_last(key, capsys):
    clock = Clock()

    def stage(seconds, *outputs):
        def execute(run):
            clock.now += seconds
            for what, where in outputs:
                run.output(what, where)

        return execute

    stages = [
        registry.Stage("check-tree", "tree", stage(1.0)),
        registry.Stage("build", "wheels", stage(125)),
        registry.Stage(
            "publish",
            "publish",
            stage(
                3,
                ("wheel", "build/publish/simple/a.whl"),
                ("image", "127.0.0.1:5000/x@sha256:ab"),
                ("manifest", "build/publish/manifests/m.json"),
            ),
        ),
    ]
    registry.run_release(a_run(key=str(key[0])), stages=stages, clock=clock)
    out = capsys.readouterr().out
    assert out.index("release plan:") < out.index("=== stage 1/3: check-tree")
    assert "=== stage 1/3: check-tree done in 1.0 s" in out
    assert "=== stage 2/3: build done in 2 min 05 s" in out
    assert "=== stage 3/3: publish done in 3.0 s" in out
    assert "release done in 2 min 09 s: profile default, targets cpu" in out
    assert out.strip().splitlines()[-4:] == [
        "outputs:",
        "  wheel:    build/publish/simple/a.whl",
        "  image:    127.0.0.1:5000/x@sha256:ab",
        "  manifest: build/publish/manifests/m.json",
    ]


def test_a_failing_stage_is_named_with_its_time_and_stops_the_release(key, capsys):
    clock = Clock()
    ran = []

    def fail(run):
        clock.now += 42
        raise BuildError("the compiler said no")

    def later(run):
        ran.append("publish")

    stages = [
        registry.Stage("check-tree", "tree", lambda run: None),
        registry.Stage("build", "wheels", fail),
        registry.Stage("publish", "publish", later),
    ]
    with pytest.raises(BuildError):
        registry.run_release(a_run(key=str(key[0])), stages=stages, clock=clock)
    out = capsys.readouterr().out
    assert "=== stage 2/3: build FAILED after 42.0 s (the release ran 42.0 s; no later stage ran)" in out
    assert ran == [] and "release done" not in out and "outputs:" not in out
