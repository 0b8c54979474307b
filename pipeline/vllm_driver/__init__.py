"""Real vLLM driven offline with a tiny generated model: shared by the tests,
the parity harness, the benchmarks and the patch-vllm stage's check.

    llm           start vLLM with or without a connector, generate, read telemetry
    tiny_model    the generated Llama it runs
    standalone    a connector pair outside vLLM (scheduler and worker side)
    patch_check   the patched vLLM's check in a clean venv (python -m)
"""
