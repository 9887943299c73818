"""How the simulated vLLM serves a request once it is ready: which tokens, how fast, and the
serving faults that make a qualification fail on purpose.

A reply is deterministic for its prompt (greedy decoding): its token ids come from the prompt's
hash, each token a word of the reply. Tokens are paced (``token_seconds`` times ``slowdown``
each) and streamed one chunk a token. Faults (``_simconfig.SERVING_FAULTS``): ``bang`` answers
"!" for every token, ``batch-dependent`` changes the tokens with the requests in flight,
``crash-after:N`` and ``crash-under:C`` end the engine at request N+1 or with C in flight.

Standard library only: copied into the rehearsal host's venv with the rest of this package.
"""

from __future__ import annotations

import hashlib
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field

from . import _simconfig

# The token id and text of the "!!!!" fault (id 0 is "!" in GPT-2 style vocabularies, and in
# Kimi-K2.6's garbage output of vllm issue 42426 every token was it).
BANG_ID = 0
BANG_TEXT = "!"
# Without ignore_eos a reply ends after this many tokens (the simulator's stop).
NATURAL_LENGTH = 12


@dataclass(frozen=True)
class Reply:
    """One request's answer: its tokens (ids and texts), prompt length, finish reason, and the
    seconds each token takes."""

    token_ids: tuple[int, ...]
    pieces: tuple[str, ...]
    prompt_tokens: int
    finish: str
    token_seconds: float
    # Called as each token is made (the server waits for its engine core, counts the token).
    made: Callable[[], None] = field(default=lambda: None, compare=False)

    @property
    def count(self) -> int:
        return len(self.token_ids)

    @property
    def text(self) -> str:
        return "".join(self.pieces)

    def paced(self) -> Iterator[str]:
        """The pieces one by one, each after its token's time (a stream's chunks)."""
        for piece in self.pieces:
            self._make_token()
            yield piece

    def wait(self) -> None:
        """The time of the whole reply (a non-streamed answer)."""
        for _ in self.pieces:
            self._make_token()

    def _make_token(self) -> None:
        if self.token_seconds:
            time.sleep(self.token_seconds)
        self.made()


class Serving:
    """The serving side of one server process.

    Args:
        settings: the simulation settings (``_simconfig.load``).
        words: the vocabulary a token id picks its text from.
        on_crash: ends the engine (the server's death, as vLLM's EngineDeadError).
    """

    def __init__(
        self, settings: dict[str, object], words: tuple[str, ...], on_crash: Callable[[], None]
    ):
        seconds = _float(settings.get("token_seconds"), 0.0)
        self.token_seconds = seconds * _float(settings.get("slowdown"), 1.0)
        kind, _, limit = str(settings.get("serving_fault") or "").partition(":")
        self.fault = kind if kind in _simconfig.SERVING_FAULTS else None
        self.limit = int(limit) if limit.isdigit() else 1
        self.words = words
        self.on_crash = on_crash
        self.admitted = 0
        self.lock = threading.Lock()

    def reply(
        self,
        prompt: str,
        max_tokens: int,
        ignore_eos: bool,
        in_flight: int,
        made: Callable[[], None] = lambda: None,
    ) -> Reply:
        """The answer to ``prompt`` with ``in_flight`` requests (this one included) being
        served, ``made`` called at each of its tokens; a crash fault ends the engine here
        instead."""
        with self.lock:
            self.admitted += 1
            admitted = self.admitted
        if self.fault == "crash-after" and admitted > self.limit:
            self.on_crash()
        if self.fault == "crash-under" and in_flight >= self.limit:
            self.on_crash()
        count = max(1, max_tokens if ignore_eos else min(max_tokens, NATURAL_LENGTH))
        ids = token_ids(prompt, count)
        if self.fault == "batch-dependent" and in_flight > 1:
            ids = tuple((i + in_flight) % 256 for i in ids)
        if self.fault == "bang":
            ids = (BANG_ID,) * count
            pieces = (BANG_TEXT,) * count
        else:
            pieces = tuple(" " + self.words[i % len(self.words)] for i in ids)
        finish = "length" if ignore_eos or max_tokens <= NATURAL_LENGTH else "stop"
        prompt_tokens = max(1, len(prompt.encode()) // 4)
        return Reply(ids, pieces, prompt_tokens, finish, self.token_seconds, made)


def token_ids(prompt: str, count: int) -> tuple[int, ...]:
    """``count`` token ids for ``prompt``: the bytes of its sha256, then of further hashes."""
    data = hashlib.sha256(prompt.encode()).digest()
    block = 0
    while len(data) < count:
        block += 1
        data += hashlib.sha256(f"{prompt}\0{block}".encode()).digest()
    return tuple(data[:count])


def _float(value: object, default: float) -> float:
    try:
        return float(value)  # type: ignore[arg-type]
    except (TypeError, ValueError):
        return default
