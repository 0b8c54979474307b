"""The served benchmark: `vllm serve` under a multi-user load, an engine at a
time (ActiveKV beside plain vLLM, vLLM's OffloadingConnector and LMCache);
see __main__.py."""
