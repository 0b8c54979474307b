"""One streamed completion over HTTP, timed token by token.

The prompt goes as token ids to /v1/completions with `stream`, greedy, exactly
`max_tokens` (ignore_eos); `return_token_ids` has each chunk carry its token
ids (the answer a multi-turn conversation appends). The usage chunk at the end
gives the prompt's cached tokens (with the server's
--enable-prompt-tokens-details): vLLM's GPU prefix hits and the connector's
together.
"""

from __future__ import annotations

import hashlib
import json
import time
from typing import Any

from bench.served.server import MODEL_NAME


def _ids_of_text(text: str) -> list[int]:
    # The offline tokenizer's words are "w<id>" (tokenizer.py): a server that
    # does not return token ids still gives them back as text.
    return [int(w[1:]) for w in text.split() if w.startswith("w") and w[1:].isdigit()]


async def complete(session, url: str, prompt: list[int], max_tokens: int, timeout_s: float = 1800) -> dict[str, Any]:
    """Sends one request and returns its record: send time (monotonic), time
    to first token, latency, time per output token after the first, the
    prompt's, cached and output token counts, the output ids, or an error."""
    import aiohttp

    payload = {
        "model": MODEL_NAME,
        "prompt": prompt,
        "max_tokens": max_tokens,
        "min_tokens": max_tokens,
        "ignore_eos": True,
        "temperature": 0.0,
        "stream": True,
        "return_token_ids": True,
        "stream_options": {"include_usage": True},
    }
    record: dict[str, Any] = {"sent": time.monotonic(), "prompt_tokens": len(prompt)}
    times: list[float] = []
    output: list[int] = []
    usage: dict[str, Any] = {}
    try:
        async with session.post(
            url + "/v1/completions", json=payload, timeout=aiohttp.ClientTimeout(total=timeout_s)
        ) as r:
            if r.status != 200:
                record["error"] = f"HTTP {r.status}: {(await r.text())[:500]}"
                return record
            async for raw in r.content:
                line = raw.strip()
                if not line.startswith(b"data:"):
                    continue
                data = line[5:].strip()
                if data == b"[DONE]":
                    break
                chunk = json.loads(data)
                if chunk.get("usage"):
                    usage = chunk["usage"]
                for choice in chunk.get("choices") or []:
                    ids = choice.get("token_ids")
                    if ids is None:
                        ids = _ids_of_text(choice.get("text") or "")
                    if ids:
                        times.extend([time.monotonic()] * len(ids))
                        output.extend(ids)
    except Exception as e:  # noqa: BLE001 - every failure becomes the request's record
        record["error"] = f"{type(e).__name__}: {e}"[:500]
        return record
    end = time.monotonic()
    record["latency_s"] = end - record["sent"]
    record["output_tokens"] = len(output)
    record["output"] = output
    # What the answer was, comparable between engines without keeping it.
    record["output_sha"] = hashlib.sha256(json.dumps(output).encode()).hexdigest()[:16]
    if times:
        record["ttft_s"] = times[0] - record["sent"]
        if len(times) > 1:
            record["tpot_s"] = (times[-1] - times[0]) / (len(times) - 1)
    details = usage.get("prompt_tokens_details") or {}
    record["cached_tokens"] = details.get("cached_tokens")
    if usage.get("prompt_tokens") is not None and usage["prompt_tokens"] != len(prompt):
        record["error"] = f"the server counted {usage['prompt_tokens']} prompt tokens, {len(prompt)} sent"
    if len(output) != max_tokens and "error" not in record:
        record["error"] = f"{len(output)} output tokens, {max_tokens} asked"
    return record
