"""Every stage that reads another stage's artifact refuses a symbolic link to
it by name, before any work (publish's own refusals: test_publish.py)."""

import json

import pytest

from pipeline import config
from pipeline.digest import sha256_of
from pipeline.errors import AuditError, ImageError, ManifestError, ParityError, PatchError
from pipeline.stages import audit, manifest, parity_gate, patch_vllm, runtime_image

TARGET = config.load(environ={}).targets["cpu"]
WHEEL = "activekv-0.1.0-cp311-cp311-manylinux_2_34_x86_64.whl"


@pytest.fixture
def linked(tmp_path):
    """A link named like a wheel, to genuine bytes elsewhere."""
    genuine = tmp_path / "elsewhere" / WHEEL
    genuine.parent.mkdir()
    genuine.write_bytes(b"the wheel's bytes")
    folder = tmp_path / "release" / "cpu" / "wheels"
    folder.mkdir(parents=True)
    (folder / WHEEL).symlink_to(genuine)
    return folder / WHEEL, genuine


def refused(link, error):
    return pytest.raises(error, match=f"^{link}: a symbolic link \\(to .*{WHEEL}\\), not the .* itself")


def test_the_audit(linked, tmp_path):
    link, _ = linked
    with refused(link, AuditError):
        audit.audit(None, TARGET, link.parent, tmp_path / "audit.json")
    assert not (tmp_path / "audit.json").exists()


def test_the_parity_gate(linked, tmp_path):
    link, genuine = linked
    target_dir = link.parent.parent
    (target_dir / "audit.json").write_text(
        json.dumps({"passed": True, "wheels": [{"file": WHEEL, "sha256": sha256_of(genuine)}]})
    )
    with refused(link, ParityError):
        parity_gate.shipped_wheels(TARGET, target_dir, tmp_path / "vllm.whl")


def test_the_parity_gate_given_a_linked_vllm_wheel(linked, tmp_path):
    link, genuine = linked
    target_dir = tmp_path / "plain"
    (target_dir / "wheels").mkdir(parents=True)
    (target_dir / "wheels" / WHEEL).write_bytes(genuine.read_bytes())
    (target_dir / "audit.json").write_text(
        json.dumps({"passed": True, "wheels": [{"file": WHEEL, "sha256": sha256_of(genuine)}]})
    )
    with refused(link, ParityError):
        parity_gate.shipped_wheels(TARGET, target_dir, link)


@pytest.mark.parametrize("which", ["engine_wheels", "vllm_wheel", "launcher"])
def test_the_runtime_image(linked, tmp_path, which):
    link, genuine = linked
    given = {"engine_wheels": [genuine], "vllm_wheel": genuine, "launcher": genuine}
    given[which] = [link] if which == "engine_wheels" else link
    with refused(link, ImageError):  # before the runtime (None here) is used
        runtime_image.build_runtime_image(None, TARGET, version="0.1.0", commit="0" * 40, out=tmp_path, **given)


def test_the_manifest(linked):
    link, _ = linked
    with refused(link, ManifestError):
        manifest._file_artifact("engine-wheel", "cpu", link)


def test_the_patch_stage_given_a_linked_download(linked):
    link, _ = linked
    pin = patch_vllm.Pin(name="activekv", version="0.1.0", file=WHEEL, sha256="0" * 64)
    with refused(link, PatchError):
        patch_vllm.obtain(pin, downloads=link.parent)


def test_the_patch_stages_check_given_a_linked_engine_wheel(linked, tmp_path):
    link, _ = linked
    with refused(link, PatchError):
        patch_vllm.verify(
            {"patched": {"file": "vllm.whl"}}, tmp_path, [link], tmp_path / "c.txt", broken_beside_torch=[]
        )
