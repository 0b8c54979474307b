"""Build times of a target: cold from nothing, and warm after a one-file change.

    python -m bench.build_times [--target cpu] [--skip-cold]

Cold: the target's images (the debootstrap base included) and the compiler
cache are removed first, so the figure is images + compile + repair from
nothing. Warm: one .cpp of the engine gets a changed line (restored after),
then the build stage runs again with its images and cache in place. Prints
the figures and the wheel size; asserts nothing.
"""

from __future__ import annotations

import argparse
import shutil
import time

from pipeline import config, images
from pipeline.container import ContainerRuntime
from pipeline.host import prepared_runtime
from pipeline.paths import BENCH_BUILD_DIR, CCACHE_DIR, ROOT
from pipeline.stages import build

TOUCHED = ROOT / "engine" / "src" / "kv_layout.cpp"


def timed(label: str, fn) -> float:
    start = time.monotonic()
    fn()
    seconds = time.monotonic() - start
    print(f"{label:<48} {seconds:8.1f} s", flush=True)
    return seconds


def remove_images(runtime: ContainerRuntime, target: config.Target) -> None:
    refs = runtime.run("images", "--format", "{{.Repository}}:{{.Tag}}", capture=True).stdout.split()
    ours = [
        r
        for r in refs
        if r.startswith(
            (f"activekv/builder-{target.name}:", f"activekv/runtime-base-{target.name}:", "activekv/debian:")
        )
    ]
    if ours:
        runtime.run("rmi", "--force", *ours)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--target", default="cpu")
    parser.add_argument("--skip-cold", action="store_true", help="keep images and cache; warm only")
    args = parser.parse_args()
    cfg = config.load()
    target = cfg.target(args.target)
    runtime = prepared_runtime(cfg.container_engine)
    out = BENCH_BUILD_DIR / target.name
    if not args.skip_cold:
        remove_images(runtime, target)
        shutil.rmtree(CCACHE_DIR, ignore_errors=True)
        timed("cold: builder image (debootstrap base included)", lambda: images.builder_image(runtime, target))
        timed("cold: compile + repair, empty compiler cache", lambda: build.build(runtime, target, out=out))
    else:
        build.build(runtime, target, out=out)  # make sure the cache is warm
    original = TOUCHED.read_bytes()
    try:
        TOUCHED.write_bytes(original + f"// touched {time.time()}\n".encode())
        timed(f"warm: rebuild after changing {TOUCHED.name}", lambda: build.build(runtime, target, out=out))
    finally:
        TOUCHED.write_bytes(original)
    (wheel,) = sorted((out / "wheels").glob("*.whl"))
    print(f"{'wheel size (' + wheel.name + ')':<48} {wheel.stat().st_size / 1024:8.1f} KiB")


if __name__ == "__main__":
    main()
