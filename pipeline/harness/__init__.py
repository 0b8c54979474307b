"""Real vLLM driven offline with a tiny generated model: shared by the tests,
the parity harness, the benchmarks and the patch-vllm stage's check.

    vllm_harness  start vLLM with or without a connector, generate, read telemetry
    tiny_model    the generated Llama the harness runs
    standalone    a connector pair outside vLLM (scheduler and worker side)
    patch_check   the patched vLLM's check in a clean venv (python -m)
"""
