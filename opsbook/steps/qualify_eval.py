"""06_qualify's optional evaluation: a JSONL file of questions and answers on the host (GSM8K's
form: ``{"question": ..., "answer": "... #### 72"}``), each answered greedily, scored by exact
match, with a Wilson confidence interval; and against the last good run, a paired test on the
items both answered (exact McNemar).

Each line holds ``question`` (sent as ``Question: ...\\nAnswer:``) or ``prompt`` (sent as it
is), and ``answer``. The expected answer is what follows the last ``####``, else the whole
answer. The model's answer is what follows its last ``####``; else, for a numeric expected
answer, the last number it wrote; else its whole text. Both are normalised (case, spaces,
thousands separators, a ``$``, a trailing full stop, ``72.0`` as ``72``) and must be equal.

The per-item outcomes are kept in the receipt by a hash of each prompt, so that a later run
pairs them even if the file grew or was reordered. The binomial tails are computed here
(exact integers): no statistics library on the operator's machine.
"""

from __future__ import annotations

import hashlib
import json
import math
import re
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

from opsbook.core.exceptions import HostError, RunError
from opsbook.core.results import Finding
from opsbook.remote.protocol import RemoteHost
from opsbook.steps.qualify_matrix import Target, call_client

# Tokens an answer may take: room for a worked answer (GSM8K's reasoning runs to ~200 tokens).
ANSWER_TOKENS = 512
# Characters of each answer the client sends back to be scored.
KEEP_TEXT = 4000
# The 95% interval's z (the standard normal's 0.975 quantile).
Z95 = 1.959963984540054
# A paired difference with a two-sided exact McNemar p below this is no noise.
SIGNIFICANCE = 0.05
CODE_EVAL_REGRESSION = "qualify-eval-regression"
CODE_EVAL_FAILED = "qualify-eval-failed-requests"

_NUMBER = re.compile(r"-?\$?\d[\d,]*(?:\.\d+)?")


@dataclass(frozen=True)
class Item:
    """One question: its key (a hash of the prompt), the prompt sent, the expected answer."""

    key: str
    prompt: str
    expected: str


@dataclass(frozen=True)
class Evaluation:
    """An evaluation's score.

    Args:
        file: the file on the host; file_sha256: its content's hash (first 16 hex).
        items, correct: how many were asked and answered right; failed: requests that failed.
        accuracy, low, high: the share right and its 95% Wilson interval.
        outcomes: per item key, 1 right, 0 wrong (a failed request counts wrong).
    """

    file: str
    file_sha256: str
    items: int
    correct: int
    failed: int
    accuracy: float
    low: float
    high: float
    outcomes: dict[str, int] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, doc: Mapping[str, Any]) -> Evaluation:
        return cls(**{**doc, "outcomes": dict(doc.get("outcomes") or {})})


def wilson_interval(correct: int, n: int, z: float = Z95) -> tuple[float, float]:
    """The Wilson score interval of ``correct`` successes in ``n`` trials ((0, 1) for none)."""
    if n <= 0:
        return 0.0, 1.0
    p = correct / n
    denominator = 1 + z * z / n
    centre = (p + z * z / (2 * n)) / denominator
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / denominator
    return max(0.0, centre - half), min(1.0, centre + half)


def binomial_cdf_half(k: int, n: int) -> float:
    """P(X <= k) for X ~ Binomial(n, 1/2), from exact integers."""
    if k < 0:
        return 0.0
    if k >= n:
        return 1.0
    return sum(math.comb(n, i) for i in range(k + 1)) / 2**n


def mcnemar_exact(worse: int, better: int) -> float:
    """The two-sided exact McNemar p-value of ``worse`` items right before and wrong now
    against ``better`` wrong before and right now (a binomial test of the discordant pairs
    at 1/2)."""
    n = worse + better
    if n == 0:
        return 1.0
    return min(1.0, 2 * binomial_cdf_half(min(worse, better), n))


def normalise(answer: str) -> str:
    """An answer as it is compared: lower case, single spaces, no thousands separators nor
    ``$``, no trailing full stop, ``72.0`` as ``72``."""
    text = " ".join(answer.strip().lower().split()).rstrip(".").strip()
    if _NUMBER.fullmatch(text):
        text = text.replace(",", "").replace("$", "")
        if "." in text:
            text = text.rstrip("0").rstrip(".")
    return text


def expected_of(answer: str) -> str:
    """The expected answer of a file's ``answer``: after its last ``####``, else all of it."""
    return normalise(answer.rsplit("####", 1)[-1]) if "####" in answer else normalise(answer)


def extracted(reply: str, expected: str) -> str:
    """The model's answer in its ``reply``, as compared with ``expected``."""
    if "####" in reply:
        tail = reply.rsplit("####", 1)[-1].strip()
        return normalise(tail.splitlines()[0] if tail else "")
    if _NUMBER.fullmatch(expected):
        numbers = _NUMBER.findall(reply)
        return normalise(numbers[-1]) if numbers else ""
    return normalise(reply)


def parse_items(text: str, path: str) -> list[Item]:
    """The file's items, in order.

    Raises:
        RunError: a line is not a JSON object with a question (or prompt) and an answer.
    """
    items = []
    for number, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        try:
            doc = json.loads(line)
            prompt = doc["prompt"] if "prompt" in doc else f"Question: {doc['question']}\nAnswer:"
            answer = str(doc["answer"])
        except (ValueError, KeyError, TypeError) as e:
            raise RunError(
                f"{path} line {number} is not a JSON object with a question and an answer",
                remedy='one object a line: {"question": "...", "answer": "... #### 72"}',
            ) from e
        key = hashlib.sha256(prompt.encode()).hexdigest()[:12]
        items.append(Item(key, prompt, expected_of(answer)))
    if not items:
        raise RunError(f"{path} holds no item", remedy="one JSON object a line, as GSM8K's")
    return items


@dataclass(frozen=True)
class EvalFile:
    """An evaluation file read from the host: its path, its content's hash, its items."""

    path: str
    sha256: str
    items: tuple[Item, ...]


def read_eval_file(host: RemoteHost, path: str) -> EvalFile:
    """The file on the host, read and parsed (before any measurement: a wrong file is said
    at once, not after the matrix).

    Raises:
        RunError: it cannot be read, or is not a JSONL of questions and answers.
    """
    try:
        text = host.read_text(path)
    except HostError as e:
        raise RunError(
            f"the evaluation file {path} cannot be read on {host.name}: {e.message}",
            remedy="-p eval_file with the path of a JSONL file on the host, readable by its user",
        ) from e
    digest = hashlib.sha256(text.encode()).hexdigest()[:16]
    return EvalFile(path, digest, tuple(parse_items(text, path)))


def evaluate(host: RemoteHost, target: Target, file: EvalFile, concurrency: int) -> Evaluation:
    """Ask each item of the file, greedily, ``concurrency`` at a time; score the answers."""
    requests = [
        {"prompt": item.prompt, "max_tokens": ANSWER_TOKENS, "ignore_eos": False}
        for item in file.items
    ]
    answers = call_client(host, target, requests, concurrency, keep_text=KEEP_TEXT)["answers"]
    return score(file.path, file.sha256, file.items, answers)


def score(
    path: str, digest: str, items: Sequence[Item], answers: Sequence[Mapping[str, Any]]
) -> Evaluation:
    """The evaluation of the client's ``answers`` (in the items' order)."""
    outcomes = {}
    failed = 0
    for item, answer in zip(items, answers, strict=True):
        if not answer.get("ok"):
            failed += 1
        right = bool(answer.get("ok")) and (
            extracted(str(answer.get("text_head") or ""), item.expected) == item.expected
        )
        outcomes[item.key] = int(right)
    correct = sum(outcomes.values())
    low, high = wilson_interval(correct, len(outcomes))
    accuracy = correct / len(outcomes) if outcomes else 0.0
    return Evaluation(
        path, digest, len(outcomes), correct, failed,
        round(accuracy, 4), round(low, 4), round(high, 4), outcomes,
    )  # fmt: skip


def describe(evaluation: Evaluation) -> str:
    """One line: the score and its interval."""
    e = evaluation
    return (
        f"evaluation {e.file}: {e.correct} of {e.items} right, {e.accuracy:.1%} "
        f"(95% Wilson interval {e.low:.1%} to {e.high:.1%})"
    )


def own_findings(evaluation: Evaluation) -> list[Finding]:
    """Failed requests of the evaluation (a wrong answer is a score, not a finding)."""
    if not evaluation.failed:
        return []
    return [
        Finding(
            "error",
            f"evaluation {evaluation.file}",
            f"{evaluation.failed} of {evaluation.items} request(s) failed",
            "read the server's log (05_diagnose)",
            code=CODE_EVAL_FAILED,
        )
    ]


def against_last_good(now: Evaluation, good: Evaluation, source: str = "") -> list[Finding]:
    """The paired test on the items both runs answered: fewer right now, with an exact
    McNemar p below :data:`SIGNIFICANCE`, is a regression; otherwise an info finding says
    how they compare."""
    shared = [key for key in now.outcomes if key in good.outcomes]
    worse = sum(1 for k in shared if good.outcomes[k] and not now.outcomes[k])
    better = sum(1 for k in shared if now.outcomes[k] and not good.outcomes[k])
    p = mcnemar_exact(worse, better)
    said = (
        f"{len(shared)} item(s) paired with the last good run: {worse} right then and wrong "
        f"now, {better} the other way (exact McNemar p = {p:.3g})"
    )
    if worse > better and p < SIGNIFICANCE:
        return [
            Finding(
                "error",
                f"evaluation {now.file}",
                f"accuracy fell: {said}",
                "compare what changed since the last good run (release, quantisation, "
                "kernels); roll back if it is the release",
                source=source,
                code=CODE_EVAL_REGRESSION,
            )
        ]
    return [Finding("info", f"evaluation {now.file}", said, source=source)]
