"""ActiveKV's release pipeline and the tools that check the product.

    stages/    the release's stages, one module each, and their order (registry.py)
    audit/     the payload audit's rules, one module per concern (the audit stage
               runs them)
    harness/   real vLLM driven with the tiny model: the tests', parity's and
               the benchmarks' shared harness
    parity/    the parity harness: the native engine against the Python reference
    bench/     benchmarks that print figures
    the rest   what they share: release.toml (config), one run of stages and
               its options (run), what a release will do, said first (plan),
               the build tree (paths), exit codes (errors),
               the container runtime (container), the builder and runtime base
               images (images), what a stage reads of another's output
               (artifacts), a vLLM patch series (patch_series), a release as
               operators read it (release_format), the checkout (source), host
               preparation, the pipeline lock, signing; and the operators'
               commands verify, verify-rebuild (rebuild) and the language
               boundary report (boundary)

`python -m pipeline` runs stages; noxfile.py only wires sessions to it and
to sessions.py (the tests' environment and runs).
"""
