"""ActiveKV inside vLLM on a CUDA GPU, beside vLLM's own CPU offloading, on a
Llama-3-8B-geometry model with random weights made on the device (vLLM's
load_format="dummy": 32 layers, 32 query heads, 8 KV heads of 128, bf16).

    python -m bench.gpu_vllm ttft      [--lengths 8192,32768,131072] [--out FILE.json]
    python -m bench.gpu_vllm streaming [--budgets-gib 4,16] [--contexts 32768,131072]
                                                [--homes exact,compressed] [--resident-layers R]
                                                [--async-scheduling on|off] [--settle off,on] [--repeats 3]
                                                [--out FILE.json]
    python -m bench.gpu_vllm decode    [--lengths 8192,32768,131072] [--out FILE.json]
    python -m bench.gpu_vllm restart   [--lengths 32768,131072] [--store-dir /dev/shm] [--out FILE.json]

Run by ci/gpu-vllm-check.sh's environment (its PYTHONPATH), in vLLM's
default mode (compiled, FULL_AND_PIECEWISE CUDA graphs; PIECEWISE for a
connector that asks, as ActiveKV does only with layer streaming).

ttft: for each prompt length, in one process and one engine after another:
plain vLLM (recompute; its own GPU prefix hit; a miss), ActiveKV exact and
compressed (from the host store after vLLM's prefix cache is reset; a miss,
which also stores), vLLM's OffloadingConnector (from its CPU tier after the
reset). Each figure is the median of --repeats generate() calls for one token.
The bound of a host-store hit: its KV bytes over the pinned host->device peak
measured in the same run, plus the same request's GPU prefix hit.

streaming: decode step time with layer streaming in a device KV budget, from
the time of generate(N tokens) minus generate(1 token) on the same prompt
(both after a first generate(1) that settles what the prefill left in flight:
without it the 32k step read below the bus's own time, docs/benchmarks/history.md
2026-12-04 evening), the median of --repeats such pairs (each pair's step is
reported too), against the bus bound (the streamed bytes of a step, exact or
compressed as the homes hold them, over the same peak) and plain vLLM's
decode step with all KV on the device (a median alike). --contexts 0: the
longest context the budget serves.
--async-scheduling: vLLM's async scheduling on or off (its own choice unless
given; each run reports what it ran with). With it vLLM queues a step while
the last one runs, which the engine's stagings use by default (write-backs
settle across steps: a step's first layers cross during the last step's last
ones; ACTIVEKV_SETTLE_ACROSS_STEPS=0 in the environment settles them on the
host each step). --settle off,on: one LLM with it off and one with it on, side
by side (each run reports which; the environment's setting otherwise).

restart: the first request after a restart, with the host store in a file
(store_path): one vLLM with ActiveKV exact serves each prompt once (a miss:
recomputed, and stored), is shut down, and a new vLLM on the same file serves
the same prompts (each its first request for that prompt: from the file),
then a prompt nobody stored (recompute). Start times of both say what the
restart's reopen costs (every sealed slot verified). The worker's start-up line
says whether the file's mapping is pinned for the device.

decode: what a connector costs each decode step with all KV on the device
(no streaming): for each engine, the step time from generate(N) minus
generate(1) on a prompt vLLM holds (so prefill is its GPU hit), after the
miss that stored it. Each engine's CUDA graph mode is reported with it;
plain-piecewise (plain vLLM forced to PIECEWISE) shows what the mode alone
costs.
"""
