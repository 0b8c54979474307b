"""The free space each target's image builds ask for before they start."""

from __future__ import annotations

from pipeline import config, images


class RecordingRuntime:
    """A container runtime that has no image and records what each build asks."""

    def __init__(self) -> None:
        self.needs_free: dict[str, int] = {}

    def references(self, repository: str) -> list[str]:
        return []

    def image_id(self, ref: str) -> None:
        return None

    def prune_untagged(self, label: str) -> None:
        pass

    def build_image(self, *, tag: str, needs_free: int, **_: object) -> str:
        self.needs_free[tag.split(":")[0]] = needs_free
        return "sha256:built"


def test_an_image_build_asks_for_its_targets_free_space(tmp_path, monkeypatch):
    monkeypatch.setattr(images, "IMAGES_DIR", tmp_path / "images")
    dockerfile = tmp_path / "Dockerfile"
    dockerfile.write_text("FROM scratch\n")
    cfg = config.load(environ={})
    runtime = RecordingRuntime()
    for name in ("cpu", "cuda"):
        images._image(runtime, cfg.target(name), "probe", dockerfile, {}, {}, on=("base:ref", "sha256:base"))
    asked = {name: runtime.needs_free[f"activekv/probe-{name}"] for name in ("cpu", "cuda")}
    assert asked == {name: cfg.target(name).image_build_gib << 30 for name in asked}
    # CUDA's runtime base commits a 6 GB layer of torch and its libraries:
    # more than the default leaves room for.
    assert asked["cpu"] == config.DEFAULT_IMAGE_BUILD_GIB << 30 < 12 << 30 < asked["cuda"]
