"""06_qualify's verdict: this run's own checks, then against the last good run.

The last good run is the latest passing receipt of the same hardware fingerprint and model in
earlier run folders. A cell measured in both is a regression when its output tok/s fell by
more than the decode band (default 7%) or its tail TTFT rose by more than the TTFT band
(default 15%, and by at least :data:`TTFT_FLOOR_MS`: tens of milliseconds of scheduling
jitter are no regression). The tail is the p99 where the cell has the requests for one (101 or
more), else the p90 (11 or more), else the median: a p99 of 24 requests moves with the slowest
request alone, and one request held up by a scheduler hiccup is no regression to fail an upgrade
on. With at least two earlier passing runs the bands widen to three times the
spread those runs showed, where that is wider. A check that passed then and fails now is a
flip. A first run (no last good) passes on its own checks and becomes the last good.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from opsbook.core.results import Finding
from opsbook.steps.last_good import judged_good, newest_good
from opsbook.steps.metrics import MetricsSnapshot
from opsbook.steps.qualify_matrix import PERCENTILES, CellResult
from opsbook.steps.qualify_receipt import Receipt

DECODE_BAND = 0.07
TTFT_BAND = 0.15
# A tail TTFT rise smaller than this is no regression whatever its share: a loaded host's
# scheduling jitter moves a p99 of a few dozen requests by tens of milliseconds.
TTFT_FLOOR_MS = 25.0
LEARN_FROM = 2

CODE_DECODE = "qualify-decode-regression"
CODE_TTFT = "qualify-ttft-regression"
CODE_FLIP = "qualify-correctness-flip"
CODE_FAILED = "qualify-failed-requests"
CODE_DIED = "qualify-engine-died"
CODE_HUNG = "qualify-hung"
CODE_PREEMPTED = "qualify-preemptions"
CODE_OTHER_HARDWARE = "qualify-other-fingerprint"


@dataclass(frozen=True)
class Bands:
    """The noise bands: relative change allowed before a change is a regression."""

    decode: float = DECODE_BAND
    ttft: float = TTFT_BAND


def tail_percentile(requests: int) -> int:
    """The highest of :data:`PERCENTILES` that the slowest of ``requests`` latencies cannot move
    alone (interpolated as :func:`opsbook.steps.qualify_matrix.percentile` does: its upper
    rank, ``ceil((n - 1) p / 100)``, is at most the second slowest); 50 below 11 requests."""
    for p in sorted(PERCENTILES, reverse=True):
        if math.ceil((requests - 1) * p / 100) <= requests - 2:
            return p
    return 50


def learned_bands(history: Sequence[Receipt], default: Bands) -> Bands:
    """``default``, widened to three times the relative spread (coefficient of variation) of
    the earlier passing runs' cells, when there are at least :data:`LEARN_FROM` of them."""
    if len(history) < LEARN_FROM:
        return default
    decode, ttft = [default.decode], [default.ttft]
    for cell in history[-1].cells:
        same = [r.cell(cell.cell.prompt_tokens, cell.cell.concurrency) for r in history]
        rates = [c.output_tok_s for c in same if c is not None and c.output_tok_s > 0]
        tail = tail_percentile(min(c.completed for c in same if c is not None))
        ttfts = [t for c in same if c is not None and (t := c.ttft_ms.at(tail))]
        decode.append(3 * _variation(rates))
        ttft.append(3 * _variation(ttfts))
    return Bands(max(decode), max(ttft))


def _variation(values: Sequence[float]) -> float:
    if len(values) < 2 or not statistics.mean(values):
        return 0.0
    return statistics.stdev(values) / statistics.mean(values)


def last_good(receipt: Receipt, earlier: Sequence[Receipt]) -> tuple[Receipt | None, list[Receipt]]:
    """The latest good receipt of the same host, fingerprint and model, and all such receipts
    (oldest first): good and grouped by :func:`opsbook.steps.last_good.newest_good`, the rule
    ``records last-good`` follows, so that the two name the same run."""

    def key(r: Receipt) -> tuple[str, str, str]:
        return r.host, r.fingerprint_id, r.software.model

    def why(r: Receipt) -> str:
        return judged_good("pass" if r.passed else "fail", False, False)

    alike = newest_good(reversed(earlier), key, why).get(key(receipt), [])[::-1]
    return (alike[-1] if alike else None), alike


def other_hardware(receipt: Receipt, earlier: Sequence[Receipt]) -> Receipt | None:
    """The latest passing receipt of the same model on other hardware: compared for
    information only."""
    others = [
        r
        for r in earlier
        if r.passed
        and r.fingerprint_id != receipt.fingerprint_id
        and r.software.model == receipt.software.model
    ]
    return others[-1] if others else None


def own_findings(cells: Sequence[CellResult]) -> list[Finding]:
    """What the matrix shows on its own: failed requests, preemptions."""
    found = []
    for c in cells:
        if c.hung:
            found.append(hung_during(f"cell {c.cell.label}", c.hung))
        elif c.failed or not c.completed:
            first = c.errors[0] if c.errors else "no request completed"
            found.append(
                Finding(
                    "error",
                    f"cell {c.cell.label}",
                    f"{c.failed} of {c.requests} request(s) failed: {first}",
                    "read the server's log (05_diagnose): a crash under load or a timeout",
                    code=CODE_FAILED,
                )
            )
        if c.server_preemptions:
            found.append(
                Finding(
                    "warning",
                    f"cell {c.cell.label}",
                    f"{c.server_preemptions:.0f} preemption(s): the KV cache was too small for "
                    "the batch",
                    "lower max-num-seqs or raise gpu-memory-utilization",
                    code=CODE_PREEMPTED,
                )
            )
    return found


def hung_during(subject: str, hung: Mapping[str, float]) -> Finding:
    """A server found hung while a cell or the soak ran, with what ``/metrics`` showed."""
    return Finding(
        "error",
        subject,
        f"hung: {hung.get('running', 0):.0f} request(s) running and "
        f"{hung.get('waiting', 0):.0f} waiting, and the generation counter stayed at "
        f"{hung.get('generation', 0):.0f} (prompt tokens at {hung.get('prompt', 0):.0f}) for "
        f"{hung.get('seconds', 0):g} s, {hung.get('after', 0):g} s into it; its requests were "
        "ended (/health can stay 200: vllm issue 51663)",
        "restart the server (04_launch with restart always) and report the log",
        code=CODE_HUNG,
    )


def engine_findings(
    healthy_after: bool, before: MetricsSnapshot | None, after: MetricsSnapshot | None
) -> list[Finding]:
    """The server's state after the run: gone (no ``/health``), or hung: requests still
    running and no token made since ``before``."""
    if not healthy_after:
        return [
            Finding(
                "error",
                "server",
                "the server stopped answering during the qualification (the engine died)",
                "read the server's log (05_diagnose) for the engine's death",
                code=CODE_DIED,
            )
        ]
    return hang_findings(before, after)


def hang_findings(before: MetricsSnapshot | None, after: MetricsSnapshot | None) -> list[Finding]:
    """Hung: between two snapshots requests were running and the generation counter did not
    move (``/health`` can stay 200 for hours: vllm issue 51663)."""
    if before is None or after is None:
        return []
    running = after.running or 0
    made = (after.generation_tokens or 0) - (before.generation_tokens or 0)
    if running > 0 and made <= 0:
        return [
            Finding(
                "error",
                "server",
                f"hung: {running:.0f} request(s) running and no token generated in "
                f"{after.taken_at - before.taken_at:.0f} s",
                "restart the server (04_launch with restart always) and report the log",
                code=CODE_HUNG,
            )
        ]
    return []


def against_last_good(receipt: Receipt, good: Receipt, bands: Bands) -> list[Finding]:
    """Regressions and flips of ``receipt`` against ``good`` (same fingerprint and model)."""
    found = []
    changed = receipt.software.differences(good.software)
    where = f" (software changed: {'; '.join(changed)})" if changed else ""
    for cell in receipt.cells:
        then = good.cell(cell.cell.prompt_tokens, cell.cell.concurrency)
        if then is None or not cell.completed:
            continue
        if then.output_tok_s and cell.output_tok_s < then.output_tok_s * (1 - bands.decode):
            drop = 1 - cell.output_tok_s / then.output_tok_s
            found.append(
                Finding(
                    "error",
                    f"cell {cell.cell.label}",
                    f"decode {cell.output_tok_s:.1f} tok/s, {drop:.0%} below last good "
                    f"{then.output_tok_s:.1f} (band {bands.decode:.0%}){where}",
                    "compare what changed since the last good run; roll back if it is the release",
                    source=good.run_folder,
                    code=CODE_DECODE,
                )
            )
        fewest = min(cell.completed, then.completed)
        p = tail_percentile(fewest)
        now_ttft, then_ttft = cell.ttft_ms.at(p), then.ttft_ms.at(p)
        if (
            now_ttft is not None
            and then_ttft
            and now_ttft > then_ttft * (1 + bands.ttft)
            and now_ttft - then_ttft > TTFT_FLOOR_MS
        ):
            why_p = (
                f"; p{p}, as {fewest} requests make no p99 apart from the slowest"
                if p != 99
                else ""
            )
            found.append(
                Finding(
                    "error",
                    f"cell {cell.cell.label}",
                    f"p{p} TTFT {now_ttft:.1f} ms, {now_ttft / then_ttft - 1:.0%} above last good "
                    f"{then_ttft:.1f} ms (band {bands.ttft:.0%}{why_p}){where}",
                    "compare what changed since the last good run (scheduler flags, chunked "
                    "prefill, the release)",
                    source=good.run_folder,
                    code=CODE_TTFT,
                )
            )
    found += flips(receipt, good)
    return found


def flips(receipt: Receipt, good: Receipt) -> list[Finding]:
    """Correctness checks that passed in the last good run and fail now; greedy output that
    changed on the same software."""
    found = []
    if good.deterministic and receipt.deterministic is False:
        found.append(
            Finding("error", "determinism", "greedy output was batch-invariant in the last good "
                    "run and is not now", code=CODE_FLIP, source=good.run_folder)
        )  # fmt: skip
    if not good.degenerate and receipt.degenerate:
        found.append(
            Finding("error", "output", "degenerate output now, none in the last good run",
                    code=CODE_FLIP, source=good.run_folder)
        )  # fmt: skip
    same_software = not receipt.software.differences(good.software)
    changed = [
        p
        for p, digest in receipt.greedy_sha256.items()
        if good.greedy_sha256.get(p) and digest != good.greedy_sha256[p]
    ]
    if changed:
        found.append(
            Finding(
                "error" if same_software else "info",
                "greedy output",
                f"{len(changed)} prompt(s) answer other tokens than in the last good run"
                + ("" if same_software else " (the software changed)"),
                code=CODE_FLIP,
                source=good.run_folder,
            )
        )
    return found


def for_information(receipt: Receipt, other: Receipt) -> Finding:
    """A receipt of other hardware: what differs, and how the speed compares."""
    differs = "; ".join(receipt.fingerprint.differences(other.fingerprint))
    ratios = [
        cell.output_tok_s / then.output_tok_s
        for cell in receipt.cells
        if (then := other.cell(cell.cell.prompt_tokens, cell.cell.concurrency))
        and then.output_tok_s
    ]
    speed = f"; decode {statistics.mean(ratios):.2f}x of it" if ratios else ""
    return Finding(
        "info",
        "other hardware",
        f"compared for information with {other.host} ({differs}){speed}",
        source=other.run_folder,
        code=CODE_OTHER_HARDWARE,
    )
