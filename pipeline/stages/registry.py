"""The release's stages, in order: the one registry of what a release does.

    check-tree → build → audit → patch-vllm → parity → runtime-image → manifest → publish

`python -m pipeline release` runs them all, stopping at the first failure;
`python -m pipeline STAGE` runs one (each reads the records the stages before
it wrote). Each stage is a module of pipeline/stages/ whose `execute(run)`
this registry calls with the Run (pipeline/run.py). The noxfile only wires
sessions to these commands. A run holds the checkout's pipeline lock
(pipeline/lock.py) from start to end.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

from pipeline import images
from pipeline.run import Run
from pipeline.stages import audit, build, check_tree, manifest, parity_gate, patch_vllm, publish, runtime_image


@dataclasses.dataclass(frozen=True)
class Stage:
    name: str
    summary: str
    execute: Callable[[Run], None]


RELEASE: tuple[Stage, ...] = (
    Stage("check-tree", "refuse uncommitted changes (--allow-dirty records them)", check_tree.execute),
    Stage("build", "engine wheels in each target's builder container", build.execute),
    Stage("audit", "the payload audit, with the load check in the runtime base", audit.execute),
    Stage("patch-vllm", "the patch series applied to the target's vLLM, verified", patch_vllm.execute),
    Stage("parity", "the parity gate on the shipped wheels (or evidence for them)", parity_gate.execute),
    Stage("runtime-image", "the image operators pull", runtime_image.execute),
    Stage("manifest", "the signed manifest, SBOM and provenance", manifest.execute),
    Stage("publish", "wheels, images, then the manifest", publish.execute),
)
# Not part of a release: the images of pipeline/images.py, made on demand by the
# stages that need them, and by this tool.
TOOLS: tuple[Stage, ...] = (Stage("images", "the targets' builder and runtime base images", images.execute),)
BY_NAME = {s.name: s for s in (*RELEASE, *TOOLS)}


def run_release(run: Run) -> None:
    """Every stage in order; the first failure stops the release (its error
    propagates), so nothing after it, publishing included, happens."""
    for i, stage in enumerate(RELEASE, 1):
        run.say(f"\n=== stage {i}/{len(RELEASE)}: {stage.name}: {stage.summary}")
        stage.execute(run)
    run.say(f"\nrelease done: profile {run.profile.name}, targets {', '.join(t.name for t in run.targets)}")

