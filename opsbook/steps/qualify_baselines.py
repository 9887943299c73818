"""06_qualify's published baselines: figures others published for the same model on the same
GPU model (``opsbook/knowledge/data/qualify_baselines.yaml``, each with its source), shown
beside this run's nearest cell for information only: never a pass or a fail, since their
platform, engine, flags and load are their own.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from functools import cache
from importlib import resources
from typing import Any

import yaml

from opsbook.core.results import Table
from opsbook.steps.qualify_matrix import CellResult

DATA_FILE = "qualify_baselines.yaml"
PER_REQUEST = "per_request"
AGGREGATE = "aggregate"


@dataclass(frozen=True)
class Baseline:
    """One published figure (the data file's fields)."""

    id: str
    model: tuple[str, ...]
    gpu: str
    gpus: int
    engine: str
    setting: str
    figure: str
    concurrency: int
    context: int
    low: float
    high: float
    source: str
    not_: tuple[str, ...] = ()

    def applies_to(self, model: str, gpu_model: str) -> bool:
        """Whether it is about this model (every word of ``model`` in its name or path, none
        of ``not``) on this GPU model."""
        name = model.lower()
        return (
            all(word.lower() in name for word in self.model)
            and not any(word.lower() in name for word in self.not_)
            and self.gpu.lower() in gpu_model.lower()
        )

    @property
    def shown(self) -> str:
        return f"{self.low:g}" if self.low == self.high else f"{self.low:g}-{self.high:g}"


@cache
def load() -> tuple[Baseline, ...]:
    """The baselines of the data file."""
    text = resources.files("opsbook.knowledge").joinpath("data", DATA_FILE).read_text("utf-8")
    doc: dict[str, Any] = yaml.safe_load(text)
    return tuple(
        Baseline(
            **{k: v for k, v in raw.items() if k not in ("model", "not")},
            model=tuple(raw["model"]),
            not_=tuple(raw.get("not") or ()),
        )
        for raw in doc["baselines"]
    )


def matching(
    model: str, gpu_model: str, baselines: Sequence[Baseline] | None = None
) -> list[Baseline]:
    """The baselines about ``model`` (its served name and checkpoint path, together) on
    ``gpu_model``."""
    known = load() if baselines is None else baselines
    return [b for b in known if b.applies_to(model, gpu_model)]


def nearest_cell(baseline: Baseline, cells: Sequence[CellResult]) -> CellResult | None:
    """This run's cell nearest the baseline's setting: the same concurrency if measured (else
    the nearest), then the shortest prompt (the baselines' contexts are mostly near 0)."""
    done = [c for c in cells if c.completed]
    if not done:
        return None
    return min(
        done,
        key=lambda c: (
            abs(c.cell.concurrency - baseline.concurrency),
            abs(c.cell.prompt_tokens - baseline.context),
        ),
    )


def baselines_table(
    baselines: Sequence[Baseline], cells: Sequence[CellResult], gpu_count: int
) -> Table:
    """One row per published baseline: its figure and setting, this run's nearest cell and
    figure of the same kind, whether the GPU count is the same, and the source."""
    rows: list[list[Any]] = []
    for b in baselines:
        near = nearest_cell(b, cells)
        mine = None
        if near is not None:
            mine = near.per_request_tok_s if b.figure == PER_REQUEST else near.output_tok_s
        count = "" if b.gpus == gpu_count else " (other count)"
        rows.append(
            [
                f"{b.engine} on {b.gpus} x {b.gpu}{count}",
                b.setting,
                f"{b.shown} tok/s {b.figure.replace('_', ' ')} at {b.concurrency} at once",
                near.cell.label if near is not None else "",
                mine,
                b.source,
            ]
        )
    return Table(
        ["published (for information)", "setting", "figure", "this run's cell", "this run tok/s",
         "source"],
        rows,
    )  # fmt: skip
