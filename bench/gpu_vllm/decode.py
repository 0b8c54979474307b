"""decode: what a connector costs each decode step with all KV on the device."""

from __future__ import annotations

from typing import Any

from pipeline.vllm_driver.llm import shutdown

from .common import ENGINES, cudagraph_mode, decode_steps, make_llm, median_ms, prompt_of, timed_generate


def decode(lengths: list[int], repeats: int, engines: list[str], decode_tokens: int) -> dict[str, Any]:
    out: dict[str, Any] = {"lengths": lengths, "repeats": repeats, "decode_tokens": decode_tokens, "engines": {}}
    for name in engines:
        connector, extra = ENGINES[name]
        llm = make_llm(
            connector,
            extra,
            max_model_len=max(lengths) + decode_tokens + 64,
            cudagraph_mode="PIECEWISE" if name == "plain-piecewise" else None,
        )
        row: dict[str, Any] = {"cudagraph_mode": cudagraph_mode(llm), "decode_step_ms": {}}
        timed_generate(llm, prompt_of(2048, 0), "warm-up", decode_tokens)
        for n in lengths:
            prompt = prompt_of(n - decode_tokens, 11 + n)
            timed_generate(llm, prompt, f"d{n}", 1)  # the miss: prefill (and, with a connector, its save)
            _, steps = decode_steps(llm, prompt, f"d{n}", decode_tokens, repeats)
            row["decode_step_ms"][str(n)] = median_ms(steps)
        print(f"  {name}: {row}", flush=True)
        out["engines"][name] = row
        shutdown(llm)
    plain = out["engines"].get("plain", {}).get("decode_step_ms", {})
    for name, row in out["engines"].items():
        if plain and name != "plain":
            row["x_plain"] = {n: round(ms / plain[n], 3) for n, ms in row["decode_step_ms"].items()}
    return out
