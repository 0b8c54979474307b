"""The release's stages, in order: the one registry of what a release does.

    check-tree → build → audit → patch-vllm → parity → runtime-image → manifest → publish

`python -m pipeline release` runs them all, stopping at the first failure:
it prints its plan first (pipeline/plan.py), each stage's elapsed time as it
ends (a failure names its stage), and last the run's time and its outputs.
`python -m pipeline plan` prints the plan and runs the checks that cost
nothing (preflight). `python -m pipeline STAGE` runs one stage (each reads the
records the stages before it wrote). Each stage is a module of pipeline/stages/ whose `execute(run)`
this registry calls with the Run (pipeline/run.py). The noxfile only wires
sessions to these commands. A run holds the checkout's pipeline lock
(pipeline/lock.py) from start to end.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable, Sequence
from pathlib import Path

from pipeline import images, plan
from pipeline.paths import ROOT
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


def elapsed(seconds: float) -> str:
    """A duration as the release prints it: 4.2 s, 3 min 07 s, 1 h 02 min."""
    if seconds < 60:
        return f"{seconds:.1f} s"
    whole = round(seconds)
    if whole < 3600:
        return f"{whole // 60} min {whole % 60:02d} s"
    return f"{whole // 3600} h {whole % 3600 // 60:02d} min"


def preflight(run: Run, *, root: Path = ROOT) -> None:
    """`python -m pipeline plan`: the plan, then the checks that need no
    stage's environment, each refusing before anything is built or installed:
    the flags, profile, targets and evidence files (already checked by
    Run.create), the signing key (plan.describe) and the working tree. The
    release session runs it before it installs the release's environment."""
    for line in plan.describe(run, [s.name for s in RELEASE]):
        run.say(line)
    check_tree.check_tree(allow_dirty=run.options.allow_dirty, root=root)
    run.say("preflight passed: the flags, the profile, the signing key and the working tree")


def run_release(run: Run, *, stages: Sequence[Stage] = RELEASE, clock: Callable[[], float] = time.monotonic) -> None:
    """Every stage in order, after the plan; the first failure stops the
    release (its error propagates), so nothing after it, publishing included,
    happens. Each stage's end is printed with its elapsed time; a failure
    names the stage, its time and the run's; a release that finishes ends
    with its time, each stage's, and the outputs the stages recorded."""
    for line in plan.describe(run, [s.name for s in stages]):
        run.say(line)
    start = clock()
    times = []
    for i, stage in enumerate(stages, 1):
        where = f"stage {i}/{len(stages)}: {stage.name}"
        run.say(f"\n=== {where}: {stage.summary}")
        began = clock()
        try:
            stage.execute(run)
        except BaseException as e:
            how = "interrupted" if isinstance(e, KeyboardInterrupt) else "FAILED"
            run.say(
                f"\n=== {where} {how} after {elapsed(clock() - began)} (the release ran "
                f"{elapsed(clock() - start)}; no later stage ran)"
            )
            raise
        took = clock() - began
        times.append(f"{stage.name} {elapsed(took)}")
        run.say(f"=== {where} done in {elapsed(took)}")
    run.say(
        f"\nrelease done in {elapsed(clock() - start)}: profile {run.profile.name}, targets "
        f"{', '.join(t.name for t in run.targets)}"
    )
    run.say(f"stage times: {'; '.join(times)}")
    if run.outputs:
        run.say("outputs:")
        width = max(len(what) for what, _ in run.outputs)
        for what, where in run.outputs:
            run.say(f"  {what + ':':<{width + 1}} {where}")
