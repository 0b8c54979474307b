"""Host preparation: what a fresh Debian build host needs beyond Python.

Runs only what is missing, echoes every command, and says what to install by
hand where it cannot (not root, not Debian).
"""

from __future__ import annotations

import os
import shutil
import subprocess
from collections.abc import Sequence


class HostPreparationError(RuntimeError):
    pass


def _installed(package: str) -> bool:
    probe = subprocess.run(
        ["dpkg-query", "-W", "-f=${Status}", package], capture_output=True, text=True
    )
    return probe.returncode == 0 and probe.stdout.strip().endswith("installed")


def ensure_debian_packages(packages: Sequence[str]) -> None:
    """Install the Debian packages that are missing (needs root and apt-get)."""
    if shutil.which("dpkg-query") is None or shutil.which("apt-get") is None:
        missing = list(packages)
    else:
        missing = [p for p in packages if not _installed(p)]
    if not missing:
        return
    if os.geteuid() != 0 or shutil.which("apt-get") is None:
        raise HostPreparationError(
            f"this host lacks {', '.join(missing)}; install them (Debian: "
            f"apt-get install {' '.join(missing)}) or run as root on Debian"
        )
    env = dict(os.environ, DEBIAN_FRONTEND="noninteractive")
    for cmd in (["apt-get", "update", "-q"], ["apt-get", "install", "-y", "-q", *missing]):
        print("+", " ".join(cmd), flush=True)
        subprocess.run(cmd, check=True, env=env)
