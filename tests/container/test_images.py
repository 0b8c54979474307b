"""Images of ours do not pile up on a host that keeps them between runs (a CI
host): superseded tags and untagged earlier builds carrying our label are
removed; images without it are left alone. A build checks free space first.
The cpu runtime base runs torch.compile (vLLM's default compiled mode needs it)."""

from __future__ import annotations

import pytest

from pipeline import config, images
from pipeline.errors import ImageError

pytestmark = pytest.mark.container

REPO = "activekv/test-superseded"
STRANGER = "activekv-test-stranger:x"
# What vLLM's compiled mode asks of the image at start-up, in small: inductor
# generates a C++ kernel and builds it with g++ against Python.h.
COMPILE_CHECK = """
import torch
f = torch.compile(lambda x: torch.sin(x) + 2 * x, fullgraph=True, backend="inductor")
x = torch.arange(8.0)
torch.testing.assert_close(f(x), torch.sin(x) + 2 * x)
"""


@pytest.fixture
def build(runtime, tmp_path):
    base_ref, _ = images.base_image(runtime, config.load().target("cpu"))
    made: list[str] = []

    def build(tag: str, label: str) -> str:
        (tmp_path / "Dockerfile").write_text(f"FROM {base_ref}\nLABEL {label}\n")
        image = runtime.build_image(tag=tag, context=tmp_path, dockerfile=tmp_path / "Dockerfile", needs_free=0)
        made.append(image)
        return image

    yield build
    for ref in [*runtime.references(REPO), STRANGER, *made]:
        if runtime.image_id(ref) is not None:
            runtime.run("image", "rm", "--force", ref, check=False)


def test_superseded_tags_and_our_untagged_builds_are_removed(runtime, build):
    old = build(f"{REPO}:old", f"{images.BASE_LABEL}=old")
    new = build(f"{REPO}:new", f"{images.BASE_LABEL}=new")
    images.drop_superseded(runtime, REPO, keep=f"{REPO}:new")
    assert runtime.references(REPO) == [f"{REPO}:new"]
    assert runtime.image_id(old) is None and runtime.image_id(new) == new

    # A rebuild moves the tag and leaves the last build untagged; the same for
    # an image that is not ours.
    newer = build(f"{REPO}:new", f"{images.BASE_LABEL}=newer")
    strangers = [build(STRANGER, "org.example.other=1"), build(STRANGER, "org.example.other=2")]
    assert runtime.image_id(new) == new  # untagged, still here
    runtime.prune_untagged(images.BASE_LABEL)
    assert runtime.image_id(new) is None
    assert runtime.image_id(newer) == newer
    assert runtime.image_id(strangers[0]) == strangers[0]  # untagged, not ours: kept


def test_a_build_without_the_space_it_needs_stops_before_it_starts(runtime, tmp_path):
    (tmp_path / "Dockerfile").write_text("FROM scratch\n")
    needed = runtime.free_bytes() + 2**40
    with pytest.raises(ImageError, match=r"building activekv/x:y needs about \d+ GiB free .* GiB are free"):
        runtime.build_image(tag="activekv/x:y", context=tmp_path, dockerfile=tmp_path / "Dockerfile", needs_free=needed)
    assert runtime.image_id("activekv/x:y") is None


def test_the_cpu_runtime_base_compiles_with_inductor(runtime):
    ref, _ = images.runtime_base_image(runtime, config.load().target("cpu"))
    result = runtime.run("run", "--rm", "--network=host", ref, "python", "-c", COMPILE_CHECK, capture=True, check=False)
    assert result.returncode == 0, result.stderr[-3000:]
