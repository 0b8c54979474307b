"""The layer-streaming goals, point by point, against result rows."""

from __future__ import annotations

import statistics

from .results import MEASURED, BadRun, point_name, tokens_k

# The layer-streaming goals. Exact homes: every point with scattered ids at most 1.05x
# its bound, copied by the engine's own method. Compressed homes, by the
# engine's default on CUDA (fused codec kernels, batched copies): at most 1.10x
# their bound, and at least 1.6x exact homes' tokens/s at 128k decode. Inside
# vLLM (bench.gpu_vllm streaming's JSON): a decode step at most 1.10x
# the bus's bound, exact and compressed homes alike.
EXACT_GOAL = 1.05
COMPRESSED_GOAL = 1.10
SPEEDUP_GOAL = 1.6
VLLM_GOAL = 1.10
COMPRESSED_DEFAULT = "compressed-fused-batch"


def _medians(rows: list[dict], key: str) -> list[tuple[dict, float, list[float]]]:
    """Rows of the same point (several runs) as one: (a row, the median of
    `key`, every sample), in the order the points first appear."""
    points: dict[tuple, list[dict]] = {}
    for r in rows:
        points.setdefault(tuple(sorted((k, v) for k, v in r.items() if k not in MEASURED)), []).append(r)
    return [(same[0], statistics.median(r[key] for r in same), [r[key] for r in same]) for same in points.values()]


def _samples(values: list[float]) -> str:
    return "" if len(values) == 1 else f" (median of {len(values)}: {', '.join(f'{v:.3f}' for v in values)})"


def _gpu(r: dict) -> str:
    return r.get("gpu") or "a GPU its file does not name"


def _on(rows: list[dict]) -> str:
    """Which GPUs the rows were measured on: the goals name the H200, and an
    H100's figures differ."""
    return " on " + " and ".join(sorted({_gpu(r) for r in rows}))


def _goal(title: str, rows: list[dict], key: str, limit: float, at_most: bool = True) -> tuple[bool | None, list[str]]:
    """(met, lines): every point's median of `key` at most (or at least) `limit`;
    None when no row measured it."""
    points = _medians(rows, key)
    if not points:
        return None, [f"- {title}: **not measured** in these files"]
    missed = [p for p in points if (p[1] > limit if at_most else p[1] < limit)]
    worst = (max if at_most else min)(points, key=lambda p: p[1])
    counted = "the one point" if len(points) == 1 else f"all {len(points)} points"
    verdict = f"**missed** at {len(missed)} of {len(points)} points" if missed else f"met at {counted}"
    # Runs of one GPU pool into a point; where the rows span several GPUs, a
    # point says its own.
    several = len({r.get("gpu") for r in rows}) > 1

    def name(r):
        return point_name(r) + (f", {_gpu(r)}" if several else "")

    lines = [f"- {title}: {verdict}{_on(rows)}; the worst {name(worst[0])}: {worst[1]:.3f}x{_samples(worst[2])}"]
    lines += [f"  - {name(r)}: {value:.3f}x{_samples(samples)}" for r, value, samples in missed]
    return not missed, lines


def goals(results: list[dict]) -> tuple[bool | None, str]:
    """The layer-streaming goals against these results: (True when every goal is
    measured and met, False when one is missed, None when none is missed but
    some are not measured; the verdict as markdown lines, each missed point
    named). Raises BadRun when the grid's rows cannot be judged."""
    methods = {r["copy_method"] for r in results if r["part"] == "grid-setup"}
    if len(methods) > 1:
        raise BadRun(
            f"these runs' grids chose different copy methods ({', '.join(sorted(methods))}): "
            "give runs of one device and one engine"
        )
    grid = [r for r in results if r["part"] == "grid"]
    if grid and not methods:
        raise BadRun(
            "grid rows without the grid's header ('grid: ... copy method X'), which names the engine's "
            "own method: give streaming_bench's whole output"
        )
    method = next(iter(methods), "")
    said = [
        _goal(
            f"exact homes, scattered ids, copied by the engine's method{' ' + method if method else ''}, "
            f"at most {EXACT_GOAL:.2f}x the bound",
            [r for r in grid if r.get("homes") == "extents" and not r.get("contiguous") and r.get("method") == method],
            "ratio",
            EXACT_GOAL,
        ),
        _goal(
            f"compressed homes ({COMPRESSED_DEFAULT}), at most {COMPRESSED_GOAL:.2f}x their bound",
            [r for r in results if r["part"] == "compressed" and r.get("method") == COMPRESSED_DEFAULT],
            "ratio",
            COMPRESSED_GOAL,
        ),
        _goal(
            f"compressed homes' tokens/s at 128k decode, at least {SPEEDUP_GOAL:.1f}x exact homes'",
            [
                r
                for r in results
                if r["part"] == "compressed-speedup"
                and r.get("method") == COMPRESSED_DEFAULT
                and r["kind"] == "decode"
                and r["context"] == 131072
            ],
            "speedup",
            SPEEDUP_GOAL,
            at_most=False,
        ),
        _goal(
            f"inside vLLM, a decode step at most {VLLM_GOAL:.2f}x the bus's bound",
            [r for r in results if r["part"] == "vllm"],
            "ratio",
            VLLM_GOAL,
        ),
        _bytes_goal(results),
    ]
    lines = [line for _, goal_lines in said for line in goal_lines]
    left_out: dict[str, int] = {}
    for r in results:
        if r["part"] == "left-out":
            left_out[r["why"]] = left_out.get(r["why"], 0) + 1
    lines += [f"- left out: {n} vLLM run{'s' if n > 1 else ''}, {why}" for why, n in left_out.items()]
    verdicts = [met for met, _ in said]
    met = False if False in verdicts else None if None in verdicts else True
    return met, "\n".join(lines)


def _bytes_goal(results: list[dict]) -> tuple[bool | None, list[str]]:
    title = "every staged and written-back block bitwise its home (through the homes' codec)"
    checks = [r for r in results if r["part"] == "verify"]
    codecs = [r for r in results if r["part"] == "codec"]
    if not checks and not codecs:
        return None, [f"- {title}: **not measured** in these files"]
    wrong = [r for r in checks if not r["ok"]]
    codec_wrong = [r for r in codecs if not r["decode_bitwise"]]
    said = f"{len(checks) - len(wrong)} of {len(checks)} steps"
    if codecs:
        said += f"; the device's decode {'differs from' if codec_wrong else 'equals'} the CPU's"
    lines = [f"- {title}: {'**missed**' if wrong or codec_wrong else 'met'}: {said}"]
    lines += [f"  - {r['kind']} {tokens_k(r['context'])} x{r['batch']}, {r['homes']} homes: differ" for r in wrong]
    return not wrong and not codec_wrong, lines
