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
DOCKERFILES = sorted({(name, kind, getattr(t, f"{kind}_dockerfile"))
                      for name, t in CFG.targets.items() for kind in ("builder", "runtime")})


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
    assert steps[0] == ("ARG", "BASE_IMAGE") and steps[1] == ("FROM", "${BASE_IMAGE}")
    # Every argument without a default is one the pipeline passes.
    assert {a for a, has_default in args.items() if not has_default} <= PIPELINE_ARGS
    used = set(re.findall(r"\$\{?([A-Z_]+)\}?", path.read_text()))
    env = {m for word, rest in steps if word == "ENV" for m in re.findall(r"([A-Z_]+)=", rest)}
    shell_vars = {"PATH", "LD_LIBRARY_PATH"}
    assert used <= set(args) | env | shell_vars, f"{path.name} uses an argument nobody defines"
    for word, rest in steps:
        if word == "COPY":
            source = rest.split()[0]
            assert source in CONTEXT_FILES, f"{path.name} copies {source}, not in the build context"
    if kind == "builder":
        text = path.read_text()
        assert "/opt/python/$tag-$tag" in text  # cibuildwheel's layout, one per Python version
        assert "builder-requirements.txt" in text and "ccache" in text


def test_context_files_exist():
    assert images.BUILDER_REQUIREMENTS.is_file()
    assert (images.DOCKER_DIR / "install-torch.sh").is_file()
