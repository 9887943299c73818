"""06_qualify's correctness checks: greedy determinism across batch sizes, and degenerate output.

Determinism: fixed prompts at temperature 0, each answered alone (concurrency 1), then each
sent ``n`` times at once (concurrency ``n``); the sha256 of each answer's token ids must be the
same every time. Token ids, never text: detokenisation hides nothing and invents nothing.

Degenerate output: an answer made of one token repeated ("!!!!!!!!": vllm issue 42426, an
NVFP4 GEMM bug, flashinfer issue 2708), an answer with no tokens, or text holding the
replacement character (bytes that decode to no text).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from opsbook.core.results import Finding
from opsbook.remote.protocol import RemoteHost
from opsbook.steps.qualify_matrix import Target, call_client

# Prompts whose greedy continuations are compared; each is its own text (no shared prefix).
PROMPTS = (
    "The capital of France is",
    "def fibonacci(n):",
    "Once upon a time, in a small village,",
    "The three primary colours are",
)
ANSWER_TOKENS = 32
# An answer with at least this many tokens, all the same one, is degenerate.
REPEATED_AT_LEAST = 16
REPLACEMENT = "\ufffd"
KEEP_TEXT = 400

CODE_NONDETERMINISTIC = "qualify-nondeterministic"
CODE_DEGENERATE = "qualify-degenerate-output"
CODE_FAILED_REQUESTS = "qualify-failed-requests"


@dataclass(frozen=True)
class Answer:
    """One request's answer as the checks see it."""

    prompt: int
    ok: bool
    ids_sha256: str
    tokens: int
    ids_head: tuple[int, ...] = ()
    text_head: str = ""
    error: str = ""

    @classmethod
    def of(cls, prompt: int, raw: dict[str, Any]) -> Answer:
        return cls(
            prompt,
            bool(raw.get("ok")),
            str(raw.get("ids_sha256") or ""),
            int(raw.get("tokens") or 0),
            tuple(int(i) for i in raw.get("ids_head") or []),
            str(raw.get("text_head") or ""),
            str(raw.get("error") or ""),
        )


@dataclass(frozen=True)
class Correctness:
    """What the correctness checks found.

    Args:
        alone: per prompt, the sha256 of its token ids answered alone.
        together: per prompt, the hashes of its answers at concurrency ``concurrency``.
        degenerate: per prompt, why its answer is degenerate.
        failed: errors of requests that did not complete.
        without_ids: prompts answered without token ids (a release that does not know
            ``return_token_ids``): their determinism is not checked.
    """

    concurrency: int
    alone: dict[str, str] = field(default_factory=dict)
    together: dict[str, list[str]] = field(default_factory=dict)
    degenerate: dict[str, str] = field(default_factory=dict)
    failed: list[str] = field(default_factory=list)
    without_ids: list[str] = field(default_factory=list)

    @property
    def deterministic(self) -> bool:
        return not self.flips

    @property
    def flips(self) -> list[str]:
        """The prompts whose answer changed with the batch."""
        return [
            prompt
            for prompt, hashes in self.together.items()
            if any(h != self.alone.get(prompt) for h in hashes)
        ]

    def findings(self) -> list[Finding]:
        found = []
        for prompt in self.flips:
            found.append(
                Finding(
                    "error",
                    f"prompt {prompt!r}",
                    f"greedy output differs between concurrency 1 and {self.concurrency} "
                    "(token ids' sha256)",
                    "a batch-variant kernel or a numerics bug: compare with the last good "
                    "release, try another attention backend",
                    code=CODE_NONDETERMINISTIC,
                )
            )
        for prompt, why in self.degenerate.items():
            found.append(
                Finding(
                    "error",
                    f"prompt {prompt!r}",
                    f"degenerate output: {why}",
                    "the server answers 200 with garbage: check the quantisation and kernels "
                    "(vllm issue 42426, flashinfer issue 2708)",
                    code=CODE_DEGENERATE,
                )
            )
        if self.without_ids:
            found.append(
                Finding(
                    "warning",
                    "determinism",
                    f"{len(self.without_ids)} answer(s) came without token ids: determinism "
                    "not checked",
                    "a release whose completions take return_token_ids (vLLM 0.32.0 does: "
                    "vllm/entrypoints/openai/completion/protocol.py) checks it",
                )
            )
        if self.failed:
            found.append(
                Finding(
                    "error",
                    "correctness requests",
                    f"{len(self.failed)} request(s) failed: {self.failed[0]}",
                    "read the server's log (05_diagnose)",
                    code=CODE_FAILED_REQUESTS,
                )
            )
        return found


def degenerate_reason(answer: Answer) -> str:
    """Why an answer is degenerate, or "" when it is not."""
    if answer.tokens == 0:
        return "no tokens"
    head = answer.ids_head
    if len(head) >= REPEATED_AT_LEAST and len(set(head)) == 1:
        return f"one token (id {head[0]}) repeated {len(head)} times"
    text = answer.text_head
    if not head and len(text) >= REPEATED_AT_LEAST and len(set(text)) == 1:
        return f"one character ({text[0]!r}) repeated"
    if REPLACEMENT in text:
        return "replacement characters in the text (undecodable bytes)"
    return ""


def check_correctness(
    host: RemoteHost, target: Target, concurrency: int, prompts: Sequence[str] = PROMPTS
) -> Correctness:
    """Each prompt alone, then each ``concurrency`` times at once; their token ids compared."""
    one = [{"prompt": p, "max_tokens": ANSWER_TOKENS} for p in prompts]
    alone_raw = call_client(host, target, one, 1, keep_ids=ANSWER_TOKENS, keep_text=KEEP_TEXT)[
        "answers"
    ]
    many = [{"prompt": p, "max_tokens": ANSWER_TOKENS} for _ in range(concurrency) for p in prompts]
    together_raw = call_client(host, target, many, concurrency)["answers"]
    return judge(prompts, alone_raw, together_raw, concurrency)


def judge(
    prompts: Sequence[str],
    alone_raw: Sequence[dict[str, Any]],
    together_raw: Sequence[dict[str, Any]],
    concurrency: int,
) -> Correctness:
    """The checks over the client's answers (``together_raw`` in the order sent: the prompts
    over and over)."""
    result = Correctness(concurrency)
    for n, raw in enumerate(alone_raw):
        answer = Answer.of(n, raw)
        name = prompts[n]
        if not answer.ok:
            result.failed.append(answer.error)
            continue
        why = degenerate_reason(answer)
        if answer.ids_sha256:
            result.alone[name] = answer.ids_sha256
        else:
            result.without_ids.append(name)
        if why:
            result.degenerate[name] = why
    for n, raw in enumerate(together_raw):
        answer = Answer.of(n % len(prompts), raw)
        name = prompts[n % len(prompts)]
        if not answer.ok:
            result.failed.append(answer.error)
        elif name in result.alone:
            result.together.setdefault(name, []).append(answer.ids_sha256)
    return result
