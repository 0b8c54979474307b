"""`python -m bench.gpu_vllm WHAT`: the package's docstring says what each measures."""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

import bench.gpu_vllm

from . import common
from .common import ENGINES
from .decode import decode
from .restart import restart
from .streaming import streaming
from .ttft import ttft


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m bench.gpu_vllm",
        description=bench.gpu_vllm.__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("what", choices=["ttft", "streaming", "decode", "restart"])
    parser.add_argument("--lengths", default="8192,32768,131072")
    parser.add_argument("--engines", default=",".join(e for e in ENGINES if e != "plain-piecewise"))
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--budgets-gib", default="4,16")
    parser.add_argument("--homes", default="exact", help="exact,compressed: streaming's homes, one LLM each")
    parser.add_argument("--resident-layers", type=int, help="streaming's R for every budget")
    parser.add_argument(
        "--no-plain",
        action="store_true",
        help="streaming: leave out plain vLLM's decode step with all KV on the device",
    )
    parser.add_argument("--contexts", default="32768,131072", help="0 for the longest context the budget serves")
    parser.add_argument("--decode-tokens", type=int, default=17)
    parser.add_argument(
        "--async-scheduling",
        choices=["on", "off"],
        help="streaming: vLLM's async scheduling (its own choice unless given)",
    )
    parser.add_argument(
        "--settle",
        help="streaming: off,on: write-backs settling across steps, "
        "an LLM each (ACTIVEKV_SETTLE_ACROSS_STEPS otherwise)",
    )
    parser.add_argument("--store-dir", default="/dev/shm", help="restart: where the store file goes")
    parser.add_argument("--block-size", type=int, default=common.BLOCK, help="tokens a KV block, every engine")
    parser.add_argument("--out", type=Path)
    args = parser.parse_args(argv)
    common.BLOCK = args.block_size
    if args.repeats < 1:
        parser.error(f"--repeats {args.repeats}: at least 1")
    if args.settle and set(args.settle.split(",")) - {"on", "off"}:
        parser.error(f"--settle {args.settle}: a comma-separated list of on and off")
    os.environ.setdefault("VLLM_ALLOW_INSECURE_SERIALIZATION", "1")
    if args.what == "ttft":
        result = ttft([int(x) for x in args.lengths.split(",")], args.repeats, args.engines.split(","))
    elif args.what == "restart":
        result = restart([int(x) for x in args.lengths.split(",")], args.store_dir)
    elif args.what == "decode":
        result = decode(
            [int(x) for x in args.lengths.split(",")], args.repeats, args.engines.split(","), args.decode_tokens
        )
    else:
        result = streaming(
            [float(x) for x in args.budgets_gib.split(",")],
            [int(x) for x in args.contexts.split(",")],
            args.decode_tokens,
            args.repeats,
            args.homes.split(","),
            args.resident_layers,
            not args.no_plain,
            None if args.async_scheduling is None else args.async_scheduling == "on",
            [x == "on" for x in args.settle.split(",")] if args.settle else None,
        )
    import torch
    import vllm

    result["eager"], result["block_size"] = common.EAGER, common.BLOCK
    result["machine"] = {"gpu": torch.cuda.get_device_name(0), "torch": torch.__version__, "vllm": vllm.__version__}
    text = json.dumps(result, indent=1)
    print(text)
    if args.out:
        args.out.write_text(text + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
