"""06_qualify's performance matrix: prompt length x concurrency, each cell driven by the host's
own ``vllm bench serve`` (its saved JSON read back) or, where the host's vLLM has none, by the
built-in client (probe ``serve_client``); the server's counters read before and after.

A cell whose requests do not fit the KV cache the server made (its startup log's ``KV cache
size``) or the model's length is skipped, and said so. Warm-up requests go first in each cell
and are discarded: by ``--num-warmups`` or the client's ``warmup``, and from the counters'
deltas by their known token count (requests ignore EOS, so each makes exactly its tokens).

While a cell runs, the probe on the host reads ``/metrics`` each second: requests in flight and
neither token counter moving for :data:`~opsbook.steps.metrics.STALL_SECONDS` is a hung server
(``/health`` can stay 200: vllm issue 51663). The cell ends then, not at the client's timeout,
and carries the figures (``hung``).
"""

from __future__ import annotations

import hashlib
import json
import math
import posixpath
import shlex
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from opsbook.core.exceptions import HostError
from opsbook.core.results import Table
from opsbook.knowledge.metric_names import MetricNames
from opsbook.remote.protocol import RemoteHost
from opsbook.steps import metrics
from opsbook.steps.metrics import MetricsSnapshot

PROBE = "serve_client"
DRIVER_BENCH = "vllm bench serve"
DRIVER_CLIENT = "built-in client"
PERCENTILES = (50, 90, 99)
# Seconds one request may take before the client gives up on it.
REQUEST_TIMEOUT = 120.0
# Seconds a whole cell may take over SSH (vllm bench serve imports torch: ~10 s on its own).
CELL_TIMEOUT = 900.0


@dataclass(frozen=True)
class Profile:
    """What a qualification profile measures.

    Args:
        name: ``quick``, ``standard`` or ``full``.
        prompt_lengths: the matrix's rows, in tokens.
        concurrencies: its columns, requests in flight.
        output_tokens: tokens each request makes (EOS ignored).
        requests_per_cell: at least this many measured requests per cell (and at least twice
            the cell's concurrency, so that the batch is full most of the time).
        warmup: requests sent first in each cell and discarded.
        soak_minutes: the soak's length (0: none).
    """

    name: str
    prompt_lengths: tuple[int, ...]
    concurrencies: tuple[int, ...]
    output_tokens: int
    requests_per_cell: int
    warmup: int
    soak_minutes: float = 0.0

    def requests_for(self, concurrency: int) -> int:
        return max(self.requests_per_cell, 2 * concurrency)


PROFILES = {
    # About a minute on the real-vLLM tier (bench/qualify.py); 24 requests make each cell a
    # few seconds of decoding, not one, so that the cell is not one scheduler hiccup.
    "quick": Profile("quick", (128, 1024), (1, 4), 64, 24, 2),
    "standard": Profile("standard", (128, 1024, 4096), (1, 4, 16), 128, 16, 2, 5.0),
    "full": Profile("full", (128, 1024, 4096, 16384), (1, 4, 16, 64), 256, 32, 4, 30.0),
}
PROFILE_NAMES = ("off", *PROFILES)


@dataclass(frozen=True)
class Target:
    """The server a qualification drives: where it listens and what it serves.

    Args:
        port: its port on the host.
        model: the model name it serves (``/v1/models``).
        tokenizer: the checkpoint folder (``vllm bench serve --tokenizer``).
        python: the deployment's interpreter (its venv's ``vllm bench serve``).
        max_model_len: the longest request it takes, in tokens (0: unknown).
        kv_cache_tokens: the tokens its KV cache holds (None: unknown).
        api_key: its ``--api-key``, when it has one.
        seed: this run's prompts' seed: a run's prompts are its own, never served from the
            prefix cache an earlier run on the same server filled (its speed would be that
            cache's).
        names: the ``/metrics`` names of the release it runs, for the watch of each cell.
        stall_seconds: how long the counters may stand still with requests in flight before
            the server is hung.
    """

    port: int
    model: str
    tokenizer: str
    python: str
    max_model_len: int = 0
    kv_cache_tokens: int | None = None
    api_key: str | None = field(default=None, repr=False)
    seed: int = 0
    names: MetricNames = field(default_factory=MetricNames)
    stall_seconds: float = metrics.STALL_SECONDS

    def watch(self) -> dict[str, Any]:
        """The probe's ``watch`` argument: what to read in ``/metrics`` and how long a stall
        may last."""
        n = self.names
        return {
            "running": n.running, "waiting": n.waiting, "generation": n.generation_tokens,
            "prompt": n.prompt_tokens, "stall": self.stall_seconds,
            "interval": metrics.WATCH_INTERVAL,
        }  # fmt: skip


@dataclass(frozen=True)
class Cell:
    """One cell of the matrix."""

    prompt_tokens: int
    concurrency: int

    @property
    def label(self) -> str:
        return f"{self.prompt_tokens} x {self.concurrency}"


@dataclass(frozen=True)
class SkippedCell:
    cell: Cell
    reason: str


def plan_cells(profile: Profile, target: Target) -> tuple[list[Cell], list[SkippedCell]]:
    """The profile's cells that fit the server, and those that do not with the reason: a
    request longer than the model takes, or a batch whose tokens exceed the KV cache (it
    would be preempted, and measure the preemption instead)."""
    cells, skipped = [], []
    for length in profile.prompt_lengths:
        for concurrency in profile.concurrencies:
            cell = Cell(length, concurrency)
            per_request = length + profile.output_tokens
            if target.max_model_len and per_request > target.max_model_len:
                reason = f"{per_request} tokens a request > max model length {target.max_model_len}"
                skipped.append(SkippedCell(cell, reason))
            elif target.kv_cache_tokens is not None and (
                per_request * concurrency > target.kv_cache_tokens
            ):
                needed = per_request * concurrency
                reason = f"{needed:,} tokens in flight > KV cache {target.kv_cache_tokens:,} tokens"
                skipped.append(SkippedCell(cell, reason))
            else:
                cells.append(cell)
    return cells, skipped


@dataclass(frozen=True)
class Spread:
    """A latency's percentiles, in milliseconds."""

    p50: float | None = None
    p90: float | None = None
    p99: float | None = None

    def at(self, p: int) -> float | None:
        """The ``p`` percentile, one of :data:`PERCENTILES`."""
        return {50: self.p50, 90: self.p90, 99: self.p99}[p]

    @classmethod
    def of(cls, seconds: Sequence[float]) -> Spread:
        values = sorted(seconds)
        if not values:
            return cls()
        return cls(*(round(percentile(values, p) * 1000, 3) for p in PERCENTILES))


def percentile(ordered: Sequence[float], p: float) -> float:
    """The ``p`` percentile of sorted values, interpolated linearly (numpy's default, which
    ``vllm bench serve`` uses)."""
    rank = (len(ordered) - 1) * p / 100
    low, high = math.floor(rank), math.ceil(rank)
    return ordered[low] + (ordered[high] - ordered[low]) * (rank - low)


@dataclass(frozen=True)
class CellResult:
    """What one cell measured.

    Args:
        output_tok_s: output tokens a second over the cell (all requests together).
        per_request_tok_s: mean of each request's output tokens over its decode time.
        ttft_ms, tpot_ms, itl_ms: time to first token, time per output token after the first,
            inter-token latency.
        server_generation_tokens, server_prompt_tokens, server_preemptions: the deltas of the
            server's counters over the measured requests (warm-up taken out); None when the
            server does not export them.
        server_decode_tok_s: generation tokens a second by the server's counter.
        errors: the first few failed requests' errors.
        hung: when the server hung during the cell, what ``/metrics`` showed then
            (``running``, ``waiting``, ``generation``, ``prompt``, ``seconds`` the counters
            stood still, ``after`` seconds into the cell); None otherwise.
    """

    cell: Cell
    driver: str
    requests: int
    completed: int
    failed: int
    duration_s: float
    output_tok_s: float
    per_request_tok_s: float
    ttft_ms: Spread
    tpot_ms: Spread
    itl_ms: Spread
    server_generation_tokens: float | None = None
    server_prompt_tokens: float | None = None
    server_preemptions: float | None = None
    server_decode_tok_s: float | None = None
    errors: tuple[str, ...] = ()
    raw: str = ""
    hung: dict[str, float] | None = None


def bench_serve_available(host: RemoteHost, python: str) -> bool:
    """Whether the deployment's python has ``vllm bench serve`` (its ``vllm.benchmarks.serve``
    module), found without importing vLLM (seconds of torch)."""
    check = (
        "import importlib.util, os; s = importlib.util.find_spec('vllm'); "
        "d = list(s.submodule_search_locations or []) if s else []; "
        "print(bool(d) and os.path.exists(os.path.join(d[0], 'benchmarks', 'serve.py')))"
    )
    done = host.run(f"{shlex.quote(python)} -c {shlex.quote(check)}", label="vllm bench serve?")
    return done.ok and done.stdout.strip().endswith("True")


def run_cell(
    host: RemoteHost, target: Target, profile: Profile, cell: Cell, driver: str, result_dir: str
) -> CellResult:
    """Measure one cell with ``driver``, the server's counters read around it."""
    before = _snapshot(host, target)
    if driver == DRIVER_BENCH:
        measured = _bench_serve(host, target, profile, cell, result_dir)
    else:
        measured = _client(host, target, profile, cell)
    after = _snapshot(host, target)
    warm_tokens = profile.warmup * profile.output_tokens
    return with_server_deltas(
        measured, before, after, warm_tokens, profile.warmup * cell.prompt_tokens
    )


def with_server_deltas(
    measured: CellResult,
    before: MetricsSnapshot | None,
    after: MetricsSnapshot | None,
    warm_tokens: int,
    warm_prompt_tokens: int,
) -> CellResult:
    """The cell with its server-side deltas (the warm-up's tokens taken out)."""
    if before is None or after is None:
        return measured

    def delta(name: str, less: float = 0.0) -> float | None:
        start, end = getattr(before, name), getattr(after, name)
        if start is None or end is None:
            return None
        return max(0.0, end - start - less)

    generated = delta("generation_tokens", warm_tokens)
    decode = (
        round(generated / measured.duration_s, 2)
        if generated is not None and measured.duration_s > 0
        else None
    )
    return replace(
        measured,
        server_generation_tokens=generated,
        server_prompt_tokens=delta("prompt_tokens", warm_prompt_tokens),
        server_preemptions=delta("preemptions"),
        server_decode_tok_s=decode,
    )


def _snapshot(host: RemoteHost, target: Target) -> MetricsSnapshot | None:
    try:
        return metrics.read_metrics(host, target.port, api_key=target.api_key)
    except HostError:
        return None


def cell_seed(target: Target, cell: Cell | str) -> int:
    """The seed of one cell's prompts (or of another part of the run, by name): the run's
    seed made the cell's own. Two cells of one length with the run's seed would send the same
    prompts (vLLM 0.32.0 ``vllm/benchmarks/datasets/datasets.py``: ``RandomDataset`` draws each
    prompt's tokens from ``numpy.random.default_rng(seed)``; the client's from the salt), and the
    second would be served from the prefix cache the first filled (its TTFT and tok/s that
    cache's, not the server's)."""
    part = cell.label if isinstance(cell, Cell) else cell
    digest = hashlib.sha256(f"{target.seed}:{part}".encode()).hexdigest()
    return int(digest[:8], 16) % 100_000_000


def prompt_of(tokens: int, salt: int) -> str:
    """A prompt of about ``tokens`` tokens (one short word each in common tokenizers), unlike
    the others by ``salt`` so that no prefix cache serves it."""
    words = ["alpha", "bravo", "delta", "echo", "kilo", "lima", "oscar", "papa"]
    body = " ".join(words[(salt + i) % len(words)] for i in range(max(1, tokens - 2)))
    return f"{salt}: {body}"


def _client(host: RemoteHost, target: Target, profile: Profile, cell: Cell) -> CellResult:
    count = profile.requests_for(cell.concurrency)
    requests = [
        {
            "prompt": prompt_of(cell.prompt_tokens, cell_seed(target, cell) * 100_000 + n),
            "max_tokens": profile.output_tokens,
        }
        for n in range(profile.warmup + count)
    ]
    answer = call_client(host, target, requests, cell.concurrency, warmup=profile.warmup)
    return cell_from_client(answer, cell)


def call_client(
    host: RemoteHost,
    target: Target,
    requests: list[dict[str, Any]],
    concurrency: int,
    *,
    warmup: int = 0,
    keep_ids: int = 0,
    keep_text: int = 0,
) -> dict[str, Any]:
    """The built-in client's answer for ``requests`` (probe ``serve_client``)."""
    args: dict[str, Any] = {
        "port": target.port,
        "model": target.model,
        "requests": requests,
        "concurrency": concurrency,
        "warmup": warmup,
        "timeout": REQUEST_TIMEOUT,
        "keep_ids": keep_ids,
        "keep_text": keep_text,
        "watch": target.watch(),
    }
    if target.api_key:
        args["bearer"] = target.api_key
    answer: dict[str, Any] = host.probe(PROBE, args, timeout=CELL_TIMEOUT)
    return answer


def cell_from_client(answer: dict[str, Any], cell: Cell) -> CellResult:
    """A cell's result from the built-in client's answer."""
    answers = answer.get("answers") or []
    done = [a for a in answers if a.get("ok") and a.get("tokens")]
    duration = float(answer.get("duration") or 0.0)
    tokens = sum(int(a["tokens"]) for a in done)
    tpots = [
        (a["latency"] - a["ttft"]) / (a["tokens"] - 1)
        for a in done
        if a.get("ttft") is not None and a["tokens"] > 1
    ]
    rates = [
        (a["tokens"] - 1) / (a["latency"] - a["ttft"])
        for a in done
        if a.get("ttft") is not None and a["tokens"] > 1 and a["latency"] > a["ttft"]
    ]
    return CellResult(
        cell=cell,
        driver=DRIVER_CLIENT,
        requests=len(answers),
        completed=len(done),
        failed=len(answers) - len(done),
        duration_s=round(duration, 3),
        output_tok_s=round(tokens / duration, 2) if duration > 0 else 0.0,
        per_request_tok_s=round(sum(rates) / len(rates), 2) if rates else 0.0,
        ttft_ms=Spread.of([a["ttft"] for a in done if a.get("ttft") is not None]),
        tpot_ms=Spread.of(tpots),
        itl_ms=Spread.of([gap for a in done for gap in a.get("itl") or []]),
        errors=tuple(str(a.get("error")) for a in answers if not a.get("ok"))[:3],
        hung=answer.get("hung"),
    )


def bench_serve_command(
    target: Target, profile: Profile, cell: Cell, result_dir: str, result_file: str
) -> str:
    """The ``vllm bench serve`` command of a cell (vLLM 0.32.0 ``vllm/benchmarks/serve.py``
    ``add_cli_args`` and ``vllm/benchmarks/datasets/datasets.py`` for the random dataset),
    every value quoted."""
    vllm = posixpath.join(posixpath.dirname(target.python), "vllm")
    args = [
        vllm, "bench", "serve",
        "--backend", "vllm",
        "--base-url", f"http://127.0.0.1:{target.port}",
        "--endpoint", "/v1/completions",
        "--model", target.model,
        "--tokenizer", target.tokenizer,
        "--dataset-name", "random",
        "--random-input-len", str(cell.prompt_tokens),
        "--random-output-len", str(profile.output_tokens),
        "--num-prompts", str(profile.requests_for(cell.concurrency)),
        "--max-concurrency", str(cell.concurrency),
        "--num-warmups", str(profile.warmup),
        "--ignore-eos",
        "--seed", str(cell_seed(target, cell)),
        "--percentile-metrics", "ttft,tpot,itl,e2el",
        "--metric-percentiles", ",".join(str(p) for p in PERCENTILES),
        "--save-result",
        "--result-dir", result_dir,
        "--result-filename", result_file,
        "--disable-tqdm",
    ]  # fmt: skip
    return shlex.join(args)


def _bench_serve(
    host: RemoteHost, target: Target, profile: Profile, cell: Cell, result_dir: str
) -> CellResult:
    name = f"bench-{cell.prompt_tokens}x{cell.concurrency}.json"
    command = bench_serve_command(target, profile, cell, result_dir, name)
    host.run(f"mkdir -p -- {shlex.quote(result_dir)}", check=True, label="bench result folder")
    # Run by the probe, which watches /metrics beside it and ends it if the server hangs.
    # vllm bench serve reads the key from OPENAI_API_KEY (vllm/benchmarks/lib/
    # endpoint_request_func.py): the probe puts it there, never on the command line.
    args: dict[str, Any] = {
        "port": target.port, "command": shlex.split(command), "timeout": CELL_TIMEOUT,
        "watch": target.watch(),
    }  # fmt: skip
    if target.api_key:
        args["bearer"] = target.api_key
    done: dict[str, Any] = host.probe(PROBE, args, timeout=CELL_TIMEOUT + 60)
    if done.get("hung"):
        return _failed_cell(cell, "the server hung: the cell was ended", hung=done["hung"])
    if done.get("exit_code") != 0:
        said = str(done.get("stderr") or "").strip() or str(done.get("stdout") or "").strip()
        last = " ".join(said.splitlines()[-3:])
        return _failed_cell(cell, f"vllm bench serve exited {done.get('exit_code')}: {last}")
    raw = host.read_text(posixpath.join(result_dir, name))
    return cell_from_bench_json(json.loads(raw), cell, raw)


def cell_from_bench_json(doc: dict[str, Any], cell: Cell, raw: str = "") -> CellResult:
    """A cell's result from ``vllm bench serve``'s saved JSON (vLLM 0.32.0 ``benchmarks/
    serve.py``: ``completed``, ``failed``, ``duration``, ``output_throughput``,
    ``mean_tpot_ms``, ``p50_ttft_ms``... for ``--metric-percentiles``, and ``errors`` only with
    ``--save-detailed``)."""
    # The per-request lists are saved only with --save-detailed; the mean time per output
    # token is always there: a request's decode rate is its inverse.
    tpot = float(doc.get("mean_tpot_ms") or 0.0)

    def spread(metric: str) -> Spread:
        values = [doc.get(f"p{p}_{metric}_ms") for p in PERCENTILES]
        return Spread(*(round(float(v), 3) if v is not None else None for v in values))

    errors = tuple(str(e) for e in doc.get("errors") or [] if e)[:3]
    return CellResult(
        cell=cell,
        driver=DRIVER_BENCH,
        requests=int(doc.get("completed", 0)) + int(doc.get("failed", 0)),
        completed=int(doc.get("completed", 0)),
        failed=int(doc.get("failed", 0)),
        duration_s=round(float(doc.get("duration", 0.0)), 3),
        output_tok_s=round(float(doc.get("output_throughput", 0.0)), 2),
        per_request_tok_s=round(1000 / tpot, 2) if tpot > 0 else 0.0,
        ttft_ms=spread("ttft"),
        tpot_ms=spread("tpot"),
        itl_ms=spread("itl"),
        errors=errors,
        raw=raw,
    )


def _failed_cell(cell: Cell, error: str, hung: dict[str, float] | None = None) -> CellResult:
    return CellResult(
        cell, DRIVER_BENCH, 0, 0, 0, 0.0, 0.0, 0.0, Spread(), Spread(), Spread(),
        errors=(error,), hung=hung,
    )  # fmt: skip


def matrix_table(cells: Sequence[CellResult], skipped: Sequence[SkippedCell]) -> Table:
    """One row per cell: what it measured, or why it was skipped."""
    rows: list[list[Any]] = [
        [
            r.cell.prompt_tokens, r.cell.concurrency, r.driver, f"{r.completed}/{r.requests}",
            r.output_tok_s, r.per_request_tok_s, r.server_decode_tok_s, r.ttft_ms.p50,
            r.ttft_ms.p99, r.tpot_ms.p50, r.itl_ms.p99, r.server_preemptions,
        ]
        for r in cells
    ]  # fmt: skip
    rows += [
        [s.cell.prompt_tokens, s.cell.concurrency, f"skipped: {s.reason}", *[""] * 9]
        for s in skipped
    ]
    return Table(
        [
            "prompt", "concurrency", "driver", "done", "tok/s", "tok/s per request",
            "server tok/s", "TTFT p50 ms", "TTFT p99 ms", "TPOT p50 ms", "ITL p99 ms",
            "preemptions",
        ],
        rows,
    )  # fmt: skip
