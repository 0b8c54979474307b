"""Tables (and the resident-layers plot) for the benchmark record from streaming_bench's raw output.

streaming_bench (engine/bench/streaming/) prints a ``RESULT {json}``
line per measured point. This reads them back and prints the markdown tables
docs/benchmarks/history.md quotes, including the Arc Pro B60 table, which is *computed*
from the H200's measured ratios and the card's published link and memory
figures, never measured.

    python -m bench.gpu_report bench/raw/<run>.txt [--plot PNG] [--trace TRACE.json.gz ...]
    python -m bench.gpu_report --goals bench/raw/<grid>.txt bench/raw/<compressed>.txt

--goals says, point by point, whether the layer-streaming goals are met by the runs
given (several runs of a point: their median). It also reads
`python -m bench.gpu_vllm streaming --out X.json`'s JSON for the goal
inside vLLM. Exit 0: every goal measured and met; 1: one missed; 3: none
missed, some not measured; 2: input it cannot read.

The plot needs matplotlib (not a dependency of the project: install it in a
throwaway environment to redraw it).
"""
