"""Build-time metadata provider (never packaged): pins the wheel to the torch it
was compiled against. The engine links libtorch's C++ ABI, which changes between
torch releases and builds (+cpu, +xpu, CUDA), so any other torch must be refused
at install time, not discovered as a crash at import."""

from __future__ import annotations

from typing import Any


def dynamic_metadata(settings: dict[str, Any], project: dict[str, Any]) -> dict[str, Any]:
    # The build environment's torch, the one the engine compiles against; read
    # from its metadata, as a CUDA or XPU torch may not import on a builder.
    from importlib.metadata import version

    return {"dependencies": [f"torch=={version('torch')}"]}
