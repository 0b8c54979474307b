"""The served workloads: what each user sends, as token ids, from a seed.

Each workload is sized by its parameters (the defaults are the GPU's, at the
Llama-3-8B geometry: 128 KiB of KV a token in bf16) so that the GPU's KV
budget holds a quarter or less of the working set and the host tier all of it;
the "-fits" variants shrink the working set into the GPU's budget, which is
what a host tier costs when it is not needed. Every prompt is drawn from a
`random.Random` seeded by the workload, the rate and the user or document, so
two engines of one sweep receive the same prompts (a multi-turn conversation
then grows by the answers each engine gives: the same for engines that
answer bit for bit alike).

multi-turn: LMCache's multi-round QA and vLLM's multi-turn benchmark as one
definition: `users` conversations of `turns` turns; a conversation opens with
the shared system prompt and the user's own history (uniform in
`history_tokens`), each turn adds a question (uniform in `question_tokens`)
and asks for `answer_tokens`; the next turn's prompt is the whole
conversation so far, the answer included. Arrivals are Poisson at the rate;
each arrival is taken by the user who has waited longest among those whose
last answer has come back (a user never has two turns in flight), so when
every user waits on an answer the offered rate is what the server sustains.
Each rate point has users of its own (new histories; the system prompt is
shared by all).

doc-qa: LMCache's long-document QA: `documents` documents (uniform in
`document_tokens`), read once at `warmup_concurrency` before the sweep, then
asked again in random order, each request a document and a short question,
Poisson arrivals at the rate, `requests` a rate point.

long-streaming: `users` contexts of `context_tokens`, all sent at once, each
decoding `answer_tokens`: the aggregate decode rate and time to first token
when the KV budget holds one or two of them (with layer streaming the rest is
in host memory; plain vLLM queues and preempts).
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field, replace
from typing import Any

# Token ids a prompt may use: above the special ids, below the vocabulary's end
# (the offline tokenizer has a word for each; see tokenizer.py).
FIRST_ID = 10


@dataclass(frozen=True)
class Workload:
    name: str
    kind: str  # multi-turn | doc-qa | long-streaming
    # multi-turn
    users: int = 0
    turns: int = 0
    system_tokens: int = 0
    history_tokens: tuple[int, int] = (0, 0)
    question_tokens: tuple[int, int] = (0, 0)
    # doc-qa
    documents: int = 0
    document_tokens: tuple[int, int] = (0, 0)
    requests: int = 0
    warmup_concurrency: int = 4
    # long-streaming
    context_tokens: int = 0
    # all
    answer_tokens: int = 100
    # The server's memory for this workload (every engine alike).
    kv_budget_gib: float = 16.0
    host_gib: float = 64.0
    rates: tuple[float, ...] = (1.0, 2.0, 4.0, 8.0)
    seed: int = 0
    notes: dict[str, Any] = field(default_factory=dict)

    def max_prompt_tokens(self) -> int:
        if self.kind == "multi-turn":
            return (
                self.system_tokens
                + self.history_tokens[1]
                + self.turns * (self.question_tokens[1] + self.answer_tokens)
            )
        if self.kind == "doc-qa":
            return self.document_tokens[1] + self.question_tokens[1]
        return self.context_tokens

    def max_model_len(self) -> int:
        return self.max_prompt_tokens() + self.answer_tokens + 64

    def least_point_s(self, rate: float) -> float:
        """The least a rate point can take: the time its arrivals take to be
        sent (0 for a burst, rate 0)."""
        requests = self.users * self.turns if self.kind == "multi-turn" else self.requests
        return requests / rate if rate > 0 else 0.0

    def working_set_tokens(self) -> int:
        """Tokens of KV the workload keeps reusing (a rate point's worth, at its
        largest: every conversation at its last turn, every document)."""
        if self.kind == "multi-turn":
            mean_history = sum(self.history_tokens) // 2
            per_user = mean_history + self.turns * (sum(self.question_tokens) // 2 + self.answer_tokens)
            return self.system_tokens + self.users * per_user
        if self.kind == "doc-qa":
            return self.documents * sum(self.document_tokens) // 2
        return self.users * self.context_tokens


_MULTI_TURN = Workload(
    "multi-turn",
    "multi-turn",
    users=64,
    turns=8,
    system_tokens=2048,
    history_tokens=(1000, 5000),
    question_tokens=(50, 150),
    kv_budget_gib=8.0,
    host_gib=64.0,
    rates=(1.0, 2.0, 4.0, 8.0),
)
_DOC_QA = Workload(
    "doc-qa",
    "doc-qa",
    documents=24,
    document_tokens=(20000, 30000),
    question_tokens=(16, 48),
    requests=96,
    kv_budget_gib=16.0,
    host_gib=80.0,
    rates=(0.5, 1.0, 2.0, 4.0),
)
WORKLOADS: dict[str, Workload] = {
    w.name: w
    for w in [
        _MULTI_TURN,
        _DOC_QA,
        # The same where everything fits in the GPU's KV: the cost of having a host tier at all.
        replace(_MULTI_TURN, name="multi-turn-fits", users=8, kv_budget_gib=16.0),
        replace(_DOC_QA, name="doc-qa-fits", documents=4),
        Workload(
            "long-streaming",
            "long-streaming",
            users=8,
            context_tokens=200_000,
            answer_tokens=256,
            kv_budget_gib=40.0,
            host_gib=100.0,
            rates=(0.0,),
        ),
    ]
}


def scaled(workload: Workload, **changes: Any) -> Workload:
    """The workload with some parameters changed (the CPU's tiny model, a
    shorter sweep): `rates` as a tuple, token ranges as (low, high)."""
    return replace(workload, **changes)


def _ids(rng: random.Random, n: int, vocab: int) -> list[int]:
    return [rng.randrange(FIRST_ID, vocab) for _ in range(n)]


def _length(rng: random.Random, bounds: tuple[int, int]) -> int:
    return rng.randint(bounds[0], bounds[1])


def system_prompt(w: Workload, vocab: int) -> list[int]:
    return _ids(random.Random(f"{w.seed}-system"), w.system_tokens, vocab)


def conversation_opening(w: Workload, vocab: int, rate: float, user: int) -> list[int]:
    """The system prompt and the user's own history: the first turn's prompt
    before its question."""
    rng = random.Random(f"{w.seed}-history-{rate}-{user}")
    return system_prompt(w, vocab) + _ids(rng, _length(rng, w.history_tokens), vocab)


def question(w: Workload, vocab: int, rate: float, who: int, turn: int) -> list[int]:
    rng = random.Random(f"{w.seed}-question-{rate}-{who}-{turn}")
    return _ids(rng, _length(rng, w.question_tokens), vocab)


def document(w: Workload, vocab: int, doc: int) -> list[int]:
    """Document `doc` (the same at every rate point: the sweep re-asks them)."""
    rng = random.Random(f"{w.seed}-document-{doc}")
    return _ids(rng, _length(rng, w.document_tokens), vocab)


def document_order(w: Workload, rate: float) -> list[int]:
    """Which document each of a rate point's requests asks: shuffled passes
    over all documents, so each is asked again and again in random order."""
    rng = random.Random(f"{w.seed}-order-{rate}")
    order: list[int] = []
    while len(order) < w.requests:
        one_pass = list(range(w.documents))
        rng.shuffle(one_pass)
        order.extend(one_pass)
    return order[: w.requests]


def long_context(w: Workload, vocab: int, user: int) -> list[int]:
    rng = random.Random(f"{w.seed}-context-{user}")
    return _ids(rng, w.context_tokens, vocab)


def arrival_gaps(w: Workload, rate: float, n: int) -> list[float]:
    """Seconds between arrivals: exponential at `rate` a second (Poisson
    arrivals); all at once where the rate is 0 (the long-streaming burst)."""
    if rate <= 0:
        return [0.0] * n
    rng = random.Random(f"{w.seed}-arrivals-{rate}")
    return [rng.expovariate(rate) for _ in range(n)]
