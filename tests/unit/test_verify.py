"""The operator's verify command on a small published release made of real
files: the trust root it needs, the one path each file is read from, the
images as pulled, and its refusals, each one `error:` line that names the
thing (the real CLI, in a subprocess, where the line matters)."""

from __future__ import annotations

import base64
import json
import os
import shutil
import subprocess
import sys

import pytest

from pipeline import signing, verify
from pipeline.errors import ConfigError, ManifestError, SigningKeyError
from pipeline.paths import ROOT
from pipeline.stages import manifest
from tests.unit.test_manifest import small_manifest

IMAGE = "activekv-runtime-cpu"
PULLED = f"127.0.0.1:5000/{IMAGE}:0.1.0"


@pytest.fixture
def release(tmp_path):
    """The publish layout: wheels in a flat package folder, the manifest, its
    signature and public key in `manifests`, the other files in
    manifests/<version>/. The signing key is kept apart, as the release's is."""
    made = tmp_path / "made"
    made.mkdir()
    data = small_manifest(made)
    key = signing.generate_key(tmp_path / "signing" / "key.pem")
    path, _, pub = manifest.write_signed(data, tmp_path / "manifests", key)
    packages, files = tmp_path / "packages", path.parent / "0.1.0"
    packages.mkdir()
    files.mkdir()
    (made / "activekv-0.1.0.cdx.json").rename(files / "activekv-0.1.0.cdx.json")
    for wheel in made.glob("*.whl"):
        wheel.rename(packages / wheel.name)
    return {
        "manifest": path,
        "pub": pub,
        "packages": packages,
        "key": key,
        "tmp": tmp_path,
        "fingerprint": signing.fingerprint(key),
        "wheel": next(packages.glob("*.whl")),
        "sbom": files / "activekv-0.1.0.cdx.json",
    }


def cli(*args, env: dict | None = None) -> subprocess.CompletedProcess:
    clean = {k: v for k, v in os.environ.items() if k != verify.FINGERPRINT_ENV}
    return subprocess.run(
        [sys.executable, "-m", "pipeline", "verify", *map(str, args)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        env={**clean, **(env or {})},
    )


# What an operator's venv holds to run verify (README, "Verify a release"):
# every other import (pyelftools, cibuildwheel, torch...) is refused.
ONLY_VERIFY_DEPENDENCIES = """
import runpy, sys
ALLOWED = {"cryptography", "jsonschema", "jsonschema_specifications", "referencing", "rpds", "attrs",
           "attr", "cffi", "packaging", "pipeline", "typing_extensions"}
class Refuse:
    def find_spec(self, name, path=None, target=None):
        top = name.split(".")[0]
        if top not in ALLOWED and top not in sys.stdlib_module_names and not top.startswith("_"):
            raise ImportError(f"{name} is not installed beside verify")
sys.meta_path.insert(0, Refuse())
sys.argv = ["pipeline", "verify", "--help"]
runpy.run_module("pipeline", run_name="__main__")
"""


def test_verify_needs_only_cryptography_jsonschema_and_packaging():
    result = subprocess.run([sys.executable, "-c", ONLY_VERIFY_DEPENDENCIES], cwd=ROOT, capture_output=True, text=True)
    assert result.returncode == 0, result.stderr
    assert "--fingerprint" in result.stdout


def refused(result: subprocess.CompletedProcess, code: int, *names) -> str:
    """The one `error:` line, checked to name each of `names`."""
    assert "Traceback" not in result.stderr, result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), result.stderr
    for name in names:
        assert str(name) in lines[0], lines[0]
    assert result.returncode == code, (result.returncode, lines[0])
    return lines[0]


def pinned(r) -> list:
    return [r["manifest"], "--fingerprint", r["fingerprint"], "--wheels", r["packages"]]


# --- the trust root -----------------------------------------------------------


def test_a_release_verifies_against_the_pinned_fingerprint_and_says_the_image_was_not_checked(release):
    result = cli(*pinned(release))
    assert result.returncode == 0, result.stderr
    assert f"verified: ActiveKV 0.1.0 ({'a' * 12}), signature by {release['fingerprint']}, 2 files" in result.stdout
    assert f"image {IMAGE} (target cpu): not checked: no --image given" in result.stdout
    assert "1 image(s) NOT checked" in result.stdout


def test_the_pinned_fingerprint_can_come_from_the_environment(release):
    result = cli(
        release["manifest"], "--wheels", release["packages"], env={verify.FINGERPRINT_ENV: release["fingerprint"]}
    )
    assert result.returncode == 0, result.stderr
    assert "verified: ActiveKV 0.1.0" in result.stdout


def test_a_trusted_key_held_by_the_operator_needs_no_key_beside_the_manifest(release):
    trusted = release["tmp"] / "pinned.pub.pem"
    shutil.move(release["pub"], trusted)
    result = cli(release["manifest"], "--trusted-key", trusted, "--wheels", release["packages"])
    assert result.returncode == 0, result.stderr


@pytest.mark.parametrize(
    "form, names",
    [
        ([], ["--fingerprint", "--trusted-key", verify.FINGERPRINT_ENV]),
        (["--public-key", "{pub}"], ["--public-key", "--fingerprint", "--trusted-key"]),
        (["--artifacts", "{packages}"], ["--artifacts", "--wheels"]),
    ],
)
def test_verify_refuses_without_a_pinned_trust_root_and_says_what_to_give(release, form, names):
    """Nothing pinned, or the earlier form (its key came from the release's
    own folder; its files were searched for by name): refused."""
    args = [a.format(pub=release["pub"], packages=release["packages"]) for a in form]
    refused(cli(release["manifest"], "--wheels", release["packages"], *args), ConfigError.exit_code, *names)


def test_a_release_re_signed_with_another_key_beside_it_is_refused(release, tmp_path):
    """Whoever can write the manifests folder can change the manifest, sign it
    with their own key and put that key beside it: the pinned fingerprint is
    the original's, so it is refused."""
    data = json.loads(release["manifest"].read_text())
    data["commit"] = "f" * 40
    attacker = signing.generate_key(tmp_path / "attacker" / "key.pem")
    manifest.write_signed(data, release["manifest"].parent, attacker)
    refused(cli(*pinned(release)), ManifestError.exit_code, release["pub"], release["fingerprint"], "do not install")
    # The original key, pinned as a file, rejects the new signature too.
    trusted = tmp_path / "original.pub.pem"
    trusted.write_bytes(signing.public_pem(release["key"]))
    refused(
        cli(release["manifest"], "--trusted-key", trusted, "--wheels", release["packages"]),
        ManifestError.exit_code,
        release["manifest"].name,
        "signature does not match",
    )


def test_a_trusted_key_and_a_fingerprint_of_other_keys_are_refused(release, tmp_path):
    other = signing.generate_key(tmp_path / "other" / "key.pem")
    trusted = tmp_path / "other.pub.pem"
    trusted.write_bytes(signing.public_pem(other))
    refused(cli(*pinned(release), "--trusted-key", trusted), ManifestError.exit_code, trusted, release["fingerprint"])


@pytest.mark.parametrize("text", ["abc", "SHA256:short", "MD5:" + "a" * 43])
def test_a_malformed_fingerprint_is_refused(release, text):
    refused(
        cli(release["manifest"], "--fingerprint", text, "--wheels", release["packages"]),
        SigningKeyError.exit_code,
        "--fingerprint",
        repr(text),
    )
    refused(
        cli(release["manifest"], "--wheels", release["packages"], env={verify.FINGERPRINT_ENV: text}),
        SigningKeyError.exit_code,
        verify.FINGERPRINT_ENV,
    )


# --- missing, mistyped and malformed paths --------------------------------------


def _break(release, case):
    """Make `case` happen; returns (extra flags, the manifest to give, what
    the error must name, exit code)."""
    m, tmp = release["manifest"], release["tmp"]
    code = ManifestError.exit_code  # the release's bytes or signature: do not install
    usage = ConfigError.exit_code  # what was typed: give another path
    if case == "manifest mistyped":
        return [], m.with_name("activekv-0.1.O.manifest.json"), m.with_name("activekv-0.1.O.manifest.json"), usage
    if case == "manifest is a folder":
        return [], m.parent, m.parent, usage
    if case == "signature missing":
        m.with_name(m.name + ".sig").unlink()
        return [], m, m.name + ".sig", code
    if case == "signature not base64":
        m.with_name(m.name + ".sig").write_text("not base64 at all!\n")
        return [], m, m.name + ".sig", code
    if case == "manifest not JSON, signed":
        data = b"{not json"
        m.write_bytes(data)
        m.with_name(m.name + ".sig").write_text(base64.b64encode(release["key"].sign(data)).decode())
        return [], m, m, code
    if case == "manifest not JSON, unsigned":
        m.write_text("{not json")
        return [], m, m.name, code
    if case == "key beside the manifest missing":
        release["pub"].unlink()
        return [], m, release["pub"], SigningKeyError.exit_code
    if case == "key beside the manifest not PEM":
        release["pub"].write_text("hello\n")
        return [], m, release["pub"], SigningKeyError.exit_code
    if case == "trusted key mistyped":
        return ["--trusted-key", tmp / "nope.pem"], m, tmp / "nope.pem", usage
    if case == "trusted key is a folder":
        return ["--trusted-key", tmp], m, tmp, usage
    if case == "wheels folder mistyped":
        return ["--wheels", tmp / "pakages"], m, tmp / "pakages", usage
    if case == "wheels folder is a file":
        return ["--wheels", release["wheel"]], m, release["wheel"], usage
    if case == "wheel missing":
        release["wheel"].unlink()
        return [], m, release["wheel"], code
    if case == "files folder mistyped":
        return ["--files", tmp / "fils"], m, tmp / "fils", usage
    if case == "files folder missing from the publish layout":
        shutil.rmtree(release["sbom"].parent)
        return [], m, release["sbom"].parent, usage
    if case == "file missing":
        release["sbom"].unlink()
        return [], m, release["sbom"], code
    if case == "file is a folder":
        release["sbom"].unlink()
        release["sbom"].mkdir()
        return [], m, release["sbom"], code
    raise AssertionError(case)


@pytest.mark.parametrize(
    "case",
    [
        "manifest mistyped",
        "manifest is a folder",
        "signature missing",
        "signature not base64",
        "manifest not JSON, signed",
        "manifest not JSON, unsigned",
        "key beside the manifest missing",
        "key beside the manifest not PEM",
        "trusted key mistyped",
        "trusted key is a folder",
        "wheels folder mistyped",
        "wheels folder is a file",
        "wheel missing",
        "files folder mistyped",
        "files folder missing from the publish layout",
        "file missing",
        "file is a folder",
    ],
)
def test_a_missing_mistyped_or_malformed_path_is_one_error_line_naming_it(release, case):
    flags, given, names, code = _break(release, case)
    wheels = [] if "--wheels" in flags else ["--wheels", release["packages"]]
    pin = [] if "--trusted-key" in flags else ["--fingerprint", release["fingerprint"]]
    line = refused(cli(given, *pin, *wheels, *flags), code, names)
    if code == ConfigError.exit_code:  # a mistake on the command line: it says what to give instead
        assert "; give " in line, line


def test_the_wheels_folder_must_be_given_when_the_manifest_lists_wheels(release):
    refused(
        cli(release["manifest"], "--fingerprint", release["fingerprint"]),
        ConfigError.exit_code,
        "1 wheel(s)",
        "--wheels DIR",
    )


# --- one artifact, one exact path ------------------------------------------------


@pytest.mark.parametrize("flag", ["--wheels", "--files", "--index-dir"])
def test_a_folder_given_twice_is_refused_never_picked_from(release, tmp_path, flag):
    """Two folders holding files of the same name: which one is the release's
    is not for verify to guess (the earlier form took the last one found)."""
    other = tmp_path / "other"
    other.mkdir()
    (other / release["wheel"].name).write_bytes(release["wheel"].read_bytes())
    (other / release["sbom"].name).write_bytes(release["sbom"].read_bytes())
    given = release["sbom"].parent if flag == "--files" else release["packages"]
    base = [release["manifest"], "--fingerprint", release["fingerprint"]]
    if flag == "--files":
        base += ["--wheels", release["packages"]]
    line = refused(cli(*base, flag, given, flag, other), ConfigError.exit_code, flag, given, other)
    assert "once" in line


def test_a_wheel_is_read_from_its_project_folder_in_a_directory_index(release, tmp_path):
    index = tmp_path / "simple"
    (index / "activekv").mkdir(parents=True)
    shutil.move(release["wheel"], index / "activekv" / release["wheel"].name)
    result = cli(release["manifest"], "--fingerprint", release["fingerprint"], "--index-dir", index)
    assert result.returncode == 0, result.stderr
    # Not searched for: a wheel at the index's top is not its place.
    shutil.move(index / "activekv" / release["wheel"].name, index / release["wheel"].name)
    refused(
        cli(release["manifest"], "--fingerprint", release["fingerprint"], "--index-dir", index),
        ManifestError.exit_code,
        index / "activekv" / release["wheel"].name,
    )


@pytest.mark.parametrize("which", ["wheel", "sbom"])
def test_a_file_given_as_a_symlink_is_refused(release, tmp_path, which):
    real = tmp_path / "elsewhere" / release[which].name
    real.parent.mkdir()
    shutil.move(release[which], real)
    release[which].symlink_to(real)
    line = refused(cli(*pinned(release)), ManifestError.exit_code, release[which], "symbolic link", real)
    assert "cp --dereference" in line


# --- images, as the operator pulled them ----------------------------------------


def image_record(release) -> dict:
    return next(a for a in json.loads(release["manifest"].read_text())["artifacts"] if a["kind"] == "image")


def check(release, images, inspect):
    return verify.verify(
        release["manifest"],
        fingerprint=release["fingerprint"],
        wheels=release["packages"],
        images=images,
        image_inspect=inspect,
    )


def test_the_image_is_checked_under_the_reference_the_operator_pulled(release):
    a = image_record(release)
    asked = []

    def inspect(ref):
        asked.append(ref)
        return a["digest"], {verify.LABEL: a["inputs_digest"]}

    result = check(release, [PULLED], inspect)
    assert asked == [PULLED] and result.images == [PULLED] and result.not_checked == []


@pytest.mark.parametrize(
    "seen, message",
    [
        (("sha256:" + "e" * 64, None), "its id is sha256:eee"),
        ((None, "sha256:" + "0" * 64), f"its label {verify.LABEL} is sha256:000"),
        ((None, {}), f"its label {verify.LABEL} is None"),
    ],
)
def test_an_image_whose_id_or_label_differs_is_refused(release, seen, message):
    a = image_record(release)
    image_id = seen[0] or a["digest"]
    labels = seen[1] if isinstance(seen[1], dict) else {verify.LABEL: seen[1] or a["inputs_digest"]}
    with pytest.raises(ManifestError, match=f"image {PULLED}: {message}.*do not run"):
        check(release, [PULLED], lambda ref: (image_id, labels))


def test_an_image_given_but_not_pulled_is_refused(release):
    with pytest.raises(ManifestError, match=f"image {PULLED}: not here; pull it first"):
        check(release, [PULLED], lambda ref: None)


def test_an_image_asked_for_that_cannot_be_inspected_fails(release):
    def no_engine(ref):
        raise FileNotFoundError("docker")

    with pytest.raises(ManifestError, match=f"image {PULLED}: could not be checked: no container engine"):
        check(release, [PULLED], no_engine)


def test_an_image_the_manifest_does_not_list_is_refused(release):
    with pytest.raises(
        ConfigError, match=f"--image registry/other:1: the manifest lists no image other \\(it lists: {IMAGE}\\)"
    ):
        check(release, ["registry/other:1"], lambda ref: None)


def test_without_a_container_engine_the_cli_fails_for_the_image_it_was_asked_to_check(release):
    result = cli(*pinned(release), "--image", PULLED, env={"PATH": str(release["tmp"] / "no-bin")})
    assert result.returncode == ManifestError.exit_code
    assert result.stderr == (
        f"error: image {PULLED}: could not be checked: no container engine here to "
        f"inspect it; verify where the image is pulled (or leave out --image to "
        f"check the files only)\n"
    )
    assert "Traceback" not in result.stderr
