"""The one rule no static reading can settle: the wheel installs and imports
after torch in a clean container of the target's runtime base, with no
accelerator, so an ABI mismatch with that torch shows before a release."""

from __future__ import annotations

from pathlib import Path, PurePosixPath

from pipeline.audit.wheel import Finding
from pipeline.config import Target
from pipeline.container import Container, ContainerRuntime
from pipeline.images import runtime_base_image

LOAD_CHECK = """
import importlib.metadata, torch, activekv
print("torch", torch.__version__, "activekv", importlib.metadata.version("activekv"), activekv.__file__)
"""


def load_check(runtime: ContainerRuntime, target: Target, wheels: list[Path]) -> tuple[dict[str, str], list[Finding]]:
    """Install each wheel offline in a clean container of the target's runtime
    base (its torch must satisfy the wheel's torch pin) and import it after
    torch. Returns the image ({ref, id}) and the findings."""
    image, image_id = runtime_base_image(runtime, target)
    findings = []
    for wheel in wheels:
        with Container(runtime=runtime, image=image) as c:
            inside = PurePosixPath("/tmp/wheels") / wheel.name
            c.copy_into(wheel, inside)
            install = c.call(["python", "-m", "pip", "install", "--no-index", str(inside)], capture=True, check=False)
            result = (
                install
                if install.returncode != 0
                else c.call(["python", "-c", LOAD_CHECK], capture=True, check=False, cwd="/")
            )
            print(result.stdout, end="", flush=True)
            if result.returncode != 0:
                findings.append(
                    Finding(
                        wheel=wheel.name,
                        file=wheel.name,
                        rule="loads",
                        message=f"does not install and import in {image} after torch: {result.stderr.strip()[-800:]}",
                    )
                )
    return {"ref": image, "id": image_id}, findings
