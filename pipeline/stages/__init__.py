"""The release's stages, one module each, in order (registry.py holds the order):

    check_tree     refuse uncommitted changes
    build          engine wheels in each target's builder container
    audit          the payload audit of the wheels
    patch_vllm     the patch series applied to the target's vLLM
    parity_gate    parity: the parity gate on the shipped wheels (it runs the
                   parity harness, pipeline/parity/, on them)
    runtime_image  the image operators pull
    manifest       the signed manifest, SBOM and provenance
    publish        wheels, images, then the manifest

Each stage module's `execute(run)` is what the registry calls with the Run
(pipeline/run.py); the rest of the module is the stage's machinery, usable on
its own. The builder and runtime base images are no stage: pipeline/images.py
makes them for the stages that need them, and the registry offers them as the
`images` tool.
"""
