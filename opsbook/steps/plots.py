"""Charts for the notebooks, drawn as plain SVG: no plotting library on the operator's machine.

Each function returns a :class:`Chart`, which Jupyter shows through ``_repr_svg_`` and whose
text form is a one-line description of what the chart shows (stable between runs, so stored
notebook outputs compare equal). Every drawn value carries its number in a ``data-value``
attribute and its kind in ``class``, so the SVG can be checked without rendering it.

- :func:`download_progress`: bytes present over time against the expected total;
- :func:`gpu_memory`: per GPU, memory held by each process, other use and free;
- :func:`startup_timeline`: the startup phases of a server as horizontal bars;
- :func:`throughput_by_concurrency`, :func:`ttft_by_prompt_length`: 06_qualify's matrix, this
  run's lines solid and the last good run's dashed in the same colour.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any
from xml.sax.saxutils import escape, quoteattr

from opsbook.core.results import Table
from opsbook.steps.host_facts import Gpu, GpuProcess
from opsbook.steps.qualify_matrix import CellResult
from opsbook.steps.shard_check import format_bytes, format_duration

WIDTH = 640
HEIGHT = 320
LEFT, RIGHT, TOP, BOTTOM = 80, 24, 40, 48
FONT = "font-family='sans-serif' font-size='12'"
LINE_COLOUR = "#0969da"
EXPECTED_COLOUR = "#cf222e"
FREE_COLOUR = "#d0d7de"
OTHER_COLOUR = "#8c959f"
PALETTE = ("#0969da", "#1a7f37", "#bf8700", "#8250df", "#cf222e", "#1b7c83", "#bc4c00")
BAR_ROW = 24
MIB_PER_GIB = 1024


@dataclass(frozen=True)
class Chart:
    """An SVG chart that a notebook displays, with a one-line text description.

    Args:
        description: what the chart shows, e.g. ``download progress: 547.4 GB expected``.
        svg: the whole ``<svg>`` document.
    """

    description: str
    svg: str

    def _repr_svg_(self) -> str:
        return self.svg

    def __repr__(self) -> str:
        return f"<Chart: {self.description}>"

    def __str__(self) -> str:
        return self.description


@dataclass(frozen=True)
class Scale:
    """A linear map from data values to pixels."""

    low: float
    high: float
    start: float
    end: float

    def __call__(self, value: float) -> float:
        span = self.high - self.low
        fraction = (value - self.low) / span if span else 0.0
        return round(self.start + fraction * (self.end - self.start), 2)


# --- the charts ------------------------------------------------------------------------------


def download_progress(samples: Sequence[tuple[float, int]], expected: int) -> Chart:
    """Bytes present over time, with a dashed line at the expected total.

    Args:
        samples: ``(seconds since the watch began, bytes present)`` in time order, as
            ``watch_download`` returns in ``data["samples"]``.
        expected: bytes the complete checkpoint holds (0 when unknown: no line is drawn).

    Returns:
        The chart; one saying "no data" when there are no samples.
    """
    title = "download progress"
    if not samples:
        return empty_chart(title)
    longest = max(max(t for t, _ in samples), 1.0)
    top = max(max(b for _, b in samples), expected, 1)
    ticks_y = nice_ticks(0, top)
    x = Scale(0, longest, LEFT, WIDTH - RIGHT)
    y = Scale(0, ticks_y[-1], HEIGHT - BOTTOM, TOP)
    parts = [heading(f"{title}: {format_bytes(samples[-1][1])} of {format_bytes(expected)}")]
    parts += y_axis(y, ticks_y, format_bytes)
    parts += x_axis(x, nice_ticks(0, longest), format_duration)
    if expected:
        parts.append(
            element(
                "line",
                cls="expected",
                x1=LEFT,
                x2=WIDTH - RIGHT,
                y1=y(expected),
                y2=y(expected),
                stroke=EXPECTED_COLOUR,
                stroke_dasharray="6 4",
                data_value=expected,
            )
        )
        parts.append(
            label(WIDTH - RIGHT, y(expected) - 4, f"expected {format_bytes(expected)}", "end")
        )
    points = " ".join(f"{x(t)},{y(b)}" for t, b in samples)
    parts.append(
        element(
            "polyline",
            cls="progress",
            points=points,
            fill="none",
            stroke=LINE_COLOUR,
            stroke_width=2,
        )
    )
    parts += [
        element("circle", cls="sample", cx=x(t), cy=y(b), r=2.5, fill=LINE_COLOUR, data_value=b)
        for t, b in samples[-1:]
    ]
    description = f"{title}: {format_bytes(expected)} expected"
    return Chart(description, document(title, WIDTH, HEIGHT, parts))


def gpu_memory(gpus: Sequence[Gpu], processes: Sequence[GpuProcess] = ()) -> Chart:
    """One stacked bar per GPU: memory held by each process, other use, then free.

    "Other" is memory the GPU reports as used that no listed process accounts for (processes
    of other users or containers that ``nvidia-smi`` cannot name).

    Args:
        gpus: the GPUs, as ``opsbook.steps.host_facts`` reports them (memory in MiB).
        processes: processes holding GPU memory; matched to a GPU by index, else by UUID.

    Returns:
        The chart; one saying "no data" when there are no GPUs with a known memory size.
    """
    title = "GPU memory"
    sized = [(gpu, memory_total(gpu)) for gpu in gpus]
    known = [total for _, total in sized if total]
    if not known:
        return empty_chart(title)
    ticks = nice_ticks(0, max(known) / MIB_PER_GIB)
    y = Scale(0, ticks[-1] * MIB_PER_GIB, HEIGHT - BOTTOM, TOP)
    slot = (WIDTH - LEFT - RIGHT) / len(sized)
    width = min(slot * 0.7, 60)
    colours = process_colours(processes)
    parts = [heading(f"{title} (GiB) on {len(gpus)} GPU(s)")]
    parts += y_axis(y, [t * MIB_PER_GIB for t in ticks], lambda v: f"{v / MIB_PER_GIB:g}")
    for k, (gpu, total) in enumerate(sized):
        left = LEFT + slot * k + (slot - width) / 2
        parts.append(label(left + width / 2, HEIGHT - BOTTOM + 16, f"GPU {gpu.index}", "middle"))
        if not total:
            parts.append(label(left + width / 2, HEIGHT - BOTTOM - 6, "N/A", "middle"))
            continue
        parts += gpu_bar(gpu, total, holders(gpu, processes), colours, y, left, width)
    parts += legend(colours, processes)
    description = f"{title}: {len(gpus)} GPU(s), {len({p.pid for p in processes})} process(es)"
    return Chart(description, document(title, WIDTH, HEIGHT, parts))


def startup_timeline(phases: Table | Iterable[Sequence[Any]]) -> Chart:
    """Each startup phase as a bar from its start to the next phase's start.

    Args:
        phases: the Table of ``opsbook.steps.server.timeline`` (columns phase, starts at (s),
            lasts (s)) or its rows; the last phase's duration is None (still running or
            the end), drawn as a marker.

    Returns:
        The chart; one saying "no data" when there are no phases.
    """
    title = "startup timeline"
    rows = [list(row[:3]) for row in (phases.rows if isinstance(phases, Table) else phases)]
    if not rows:
        return empty_chart(title)
    end = max(max(float(start) + float(lasts or 0) for _, start, lasts in rows), 1.0)
    name_width = min(max(len(str(name)) for name, _, _ in rows) * 7 + 12, 260)
    height = TOP + BAR_ROW * len(rows) + BOTTOM
    x = Scale(0, nice_ticks(0, end)[-1], name_width, WIDTH - RIGHT - 48)
    parts = [heading(f"{title}: {len(rows)} phase(s) over {format_duration(end)}")]
    parts += x_axis(x, nice_ticks(0, end), lambda v: f"{v:g} s", bottom=height - BOTTOM)
    for k, (name, start, lasts) in enumerate(rows):
        top = TOP + BAR_ROW * k
        middle = top + BAR_ROW / 2 + 4
        parts.append(label(name_width - 8, middle, str(name), "end"))
        parts.append(phase_bar(x, float(start), lasts, top, PALETTE[k % len(PALETTE)]))
        shown = f"{float(lasts):g} s" if lasts is not None else "…"
        parts.append(label(x(float(start) + float(lasts or 0)) + 6, middle, shown, "start"))
    description = f"{title}: {len(rows)} phase(s)"
    return Chart(description, document(title, WIDTH, height, parts))


@dataclass(frozen=True)
class Series:
    """One line of a line chart: ``(x, y)`` points, drawn solid (this run) or dashed (the
    last good run)."""

    name: str
    points: tuple[tuple[float, float], ...]
    colour: str
    last_good: bool = False


def throughput_by_concurrency(
    cells: Sequence[CellResult], last_good: Sequence[CellResult] = ()
) -> Chart:
    """Output tok/s (all requests together) by concurrency, a line per prompt length; the
    last good run's cells dashed beside this run's.

    Returns:
        The chart; one saying "no data" when no cell completed a request.
    """
    return _matrix_chart(
        "output tok/s by concurrency",
        cells,
        last_good,
        x_of=lambda c: c.cell.concurrency,
        line_of=lambda c: c.cell.prompt_tokens,
        y_of=lambda c: c.output_tok_s,
        line_name=lambda n: f"prompt {n:g}",
        lines_are="prompt length(s)",
    )


def ttft_by_prompt_length(
    cells: Sequence[CellResult], last_good: Sequence[CellResult] = ()
) -> Chart:
    """p99 time to first token (ms) by prompt length, a line per concurrency; the last good
    run's dashed beside this run's.

    Returns:
        The chart; one saying "no data" when no cell has a p99 TTFT.
    """
    return _matrix_chart(
        "p99 TTFT (ms) by prompt length",
        cells,
        last_good,
        x_of=lambda c: c.cell.prompt_tokens,
        line_of=lambda c: c.cell.concurrency,
        y_of=lambda c: c.ttft_ms.p99,
        line_name=lambda n: f"{n:g} at once",
        lines_are="concurrenc(ies)",
    )


def _matrix_chart(
    title: str,
    cells: Sequence[CellResult],
    last_good: Sequence[CellResult],
    *,
    x_of: Callable[[CellResult], float],
    line_of: Callable[[CellResult], float],
    y_of: Callable[[CellResult], float | None],
    line_name: Callable[[float], str],
    lines_are: str,
) -> Chart:
    """A line chart of the matrix: a series per value of ``line_of`` for this run, and the
    same for the last good run (dashed, same colour). A cell without a request done or
    without the value is left out."""

    def series_of(source: Sequence[CellResult], dashed: bool) -> list[Series]:
        found: dict[float, list[tuple[float, float]]] = {}
        for c in source:
            y = y_of(c)
            if c.completed and y is not None:
                found.setdefault(line_of(c), []).append((x_of(c), float(y)))
        return [
            Series(line_name(key), tuple(sorted(found[key])), colours[key], dashed)
            for key in sorted(found)
        ]

    keys = sorted({line_of(c) for c in (*cells, *last_good)})
    colours = {key: PALETTE[k % len(PALETTE)] for k, key in enumerate(keys)}
    now = series_of(cells, False)
    if not now:
        return empty_chart(title)
    then = series_of(last_good, True)
    against = "against the last good run" if then else "no last good run"
    description = f"{title}: {len(now)} {lines_are}, {against}"
    return line_chart(title, [*now, *then], description)


def line_chart(title: str, series: Sequence[Series], description: str) -> Chart:
    """Lines over a categorical x axis (the distinct x values, evenly spaced: concurrencies
    and prompt lengths grow by factors, not steps), with a legend.

    Every point is a circle whose ``class`` is ``now`` or ``last-good`` and which carries
    ``data-series``, ``data-x`` and ``data-value``.
    """
    xs = sorted({x for s in series for x, _ in s.points})
    top = max((y for s in series for _, y in s.points), default=0.0)
    ticks = nice_ticks(0, top)
    slot = (WIDTH - LEFT - RIGHT) / len(xs)
    place = {x: round(LEFT + slot * (k + 0.5), 2) for k, x in enumerate(xs)}
    y = Scale(0, ticks[-1], HEIGHT - BOTTOM - 16, TOP)
    parts = [heading(title)]
    parts += y_axis(y, ticks, lambda v: f"{v:g}")
    bottom = HEIGHT - BOTTOM - 16
    parts.append(element("line", x1=LEFT, x2=WIDTH - RIGHT, y1=bottom, y2=bottom, stroke="#57606a"))
    parts += [label(place[x], bottom + 16, f"{x:g}", "middle") for x in xs]
    for s in series:
        kind = "last-good" if s.last_good else "now"
        dash = {"stroke_dasharray": "6 4"} if s.last_good else {}
        points = " ".join(f"{place[x]},{y(v)}" for x, v in s.points)
        parts.append(
            element("polyline", cls=kind, points=points, fill="none", stroke=s.colour,
                    stroke_width=2, data_series=s.name, **dash)
        )  # fmt: skip
        parts += [
            element("circle", cls=kind, cx=place[x], cy=y(v), r=3, fill=s.colour,
                    data_series=s.name, data_x=f"{x:g}", data_value=v)
            for x, v in s.points
        ]  # fmt: skip
    parts += line_legend(series)
    return Chart(description, document(title, WIDTH, HEIGHT, parts))


def line_legend(series: Sequence[Series]) -> list[str]:
    """A swatch per line of this run along the bottom, then one dashed "last good" swatch
    when the last good run's lines are drawn (in their lines' colours)."""
    entries = [(s.colour, s.name, False) for s in series if not s.last_good]
    if any(s.last_good for s in series):
        entries.append((OTHER_COLOUR, "last good", True))
    parts = []
    left = float(LEFT)
    for colour, name, dashed in entries:
        dash = {"stroke_dasharray": "4 3"} if dashed else {}
        parts.append(
            element("line", x1=left, x2=left + 16, y1=HEIGHT - 15, y2=HEIGHT - 15,
                    stroke=colour, stroke_width=2, **dash)
        )  # fmt: skip
        parts.append(label(left + 20, HEIGHT - 11, name, "start"))
        left += 32 + 7 * len(name)
    return parts


# --- parts of the charts --------------------------------------------------------------------


def gpu_bar(
    gpu: Gpu,
    total: int,
    holding: Sequence[GpuProcess],
    colours: dict[int, str],
    y: Scale,
    left: float,
    width: float,
) -> list[str]:
    """The stacked segments of one GPU's bar, bottom up: processes, other use, free."""
    held = [(p, p.used_memory_mib or 0) for p in holding]
    used = gpu.memory_used_mib if gpu.memory_used_mib is not None else sum(m for _, m in held)
    segments: list[tuple[str, int, str, dict[str, Any]]] = [
        ("process", mib, colours[p.pid], {"data_pid": p.pid}) for p, mib in held if mib
    ]
    segments.append(("other", max(used - sum(m for _, m in held), 0), OTHER_COLOUR, {}))
    segments.append(("free", max(total - max(used, sum(m for _, m in held)), 0), FREE_COLOUR, {}))
    parts = []
    base = 0
    for kind, mib, colour, extra in segments:
        if mib <= 0:
            continue
        parts.append(
            element(
                "rect",
                cls=kind,
                x=round(left, 2),
                y=y(base + mib),
                width=round(width, 2),
                height=round(y(base) - y(base + mib), 2),
                fill=colour,
                data_gpu=gpu.index,
                data_value=mib,
                **extra,
            )
        )
        base += mib
    return parts


def phase_bar(x: Scale, start: float, lasts: float | None, top: float, colour: str) -> str:
    """A phase's bar, or a narrow marker for the last phase (whose length is unknown)."""
    width = x(start + float(lasts)) - x(start) if lasts is not None else 0.0
    return element(
        "rect",
        cls="phase",
        x=x(start),
        y=top + 4,
        width=round(max(width, 2.0), 2),
        height=BAR_ROW - 8,
        fill=colour,
        data_start=start,
        data_value="" if lasts is None else float(lasts),
    )


def legend(colours: dict[int, str], processes: Sequence[GpuProcess]) -> list[str]:
    """Swatches naming each process by PID and name, then other use and free memory."""
    names = {p.pid: p.process_name for p in processes}
    entries = [(colour, f"PID {pid} {names[pid]}") for pid, colour in colours.items()]
    entries += [(OTHER_COLOUR, "other use"), (FREE_COLOUR, "free")]
    parts = []
    left = LEFT
    for colour, text in entries:
        shown = text if len(text) <= 32 else text[:31] + "…"
        parts.append(element("rect", x=left, y=HEIGHT - 20, width=10, height=10, fill=colour))
        parts.append(label(left + 14, HEIGHT - 11, shown, "start"))
        left += 24 + 7 * len(shown)
    return parts


def y_axis(y: Scale, ticks: Sequence[float], show: Callable[[float], str]) -> list[str]:
    """The left axis: grid lines at ``ticks`` labelled with ``show(tick)``."""
    parts = [element("line", x1=LEFT, x2=LEFT, y1=y.start, y2=y.end, stroke="#57606a")]
    for tick in ticks:
        parts.append(
            element("line", x1=LEFT, x2=WIDTH - RIGHT, y1=y(tick), y2=y(tick), stroke="#eaeef2")
        )
        parts.append(label(LEFT - 6, y(tick) + 4, show(tick), "end"))
    return parts


def x_axis(
    x: Scale,
    ticks: Sequence[float],
    show: Callable[[float], str],
    bottom: float = HEIGHT - BOTTOM,
) -> list[str]:
    """The bottom axis with ticks labelled with ``show(tick)``."""
    parts = [element("line", x1=x.start, x2=x.end, y1=bottom, y2=bottom, stroke="#57606a")]
    for tick in ticks:
        parts.append(
            element("line", x1=x(tick), x2=x(tick), y1=bottom, y2=bottom + 4, stroke="#57606a")
        )
        parts.append(label(x(tick), bottom + 16, show(tick), "middle"))
    return parts


def empty_chart(title: str) -> Chart:
    """A chart that says there is nothing to draw."""
    parts = [
        heading(title),
        label(WIDTH / 2, HEIGHT / 2, "no data", "middle"),
    ]
    return Chart(f"{title}: no data", document(title, WIDTH, HEIGHT, parts))


# --- helpers -------------------------------------------------------------------------------


def memory_total(gpu: Gpu) -> int | None:
    """The GPU's memory in MiB: its total, or used + free when the total is not reported."""
    if gpu.memory_total_mib:
        return gpu.memory_total_mib
    if gpu.memory_used_mib is not None and gpu.memory_free_mib is not None:
        return gpu.memory_used_mib + gpu.memory_free_mib
    return None


def holders(gpu: Gpu, processes: Sequence[GpuProcess]) -> list[GpuProcess]:
    """The processes on ``gpu``: by index when known, else by UUID."""
    return [
        p
        for p in processes
        if p.gpu_index == gpu.index
        or (p.gpu_index is None and p.gpu_uuid is not None and p.gpu_uuid == gpu.uuid)
    ]


def process_colours(processes: Sequence[GpuProcess]) -> dict[int, str]:
    """One colour per PID, in order of first appearance."""
    colours: dict[int, str] = {}
    for process in processes:
        if process.pid not in colours:
            colours[process.pid] = PALETTE[len(colours) % len(PALETTE)]
    return colours


def nice_ticks(low: float, high: float, count: int = 5) -> list[float]:
    """Round tick values from ``low`` to at least ``high`` (steps of 1, 2 or 5 x 10^n)."""
    if high <= low:
        high = low + 1
    raw = (high - low) / count
    magnitude = 10 ** math.floor(math.log10(raw))
    step = next(m * magnitude for m in (1, 2, 5, 10) if m * magnitude >= raw)
    first = math.floor(low / step) * step
    ticks = []
    value = first
    while value < high + step:
        ticks.append(round(value, 10))
        if value >= high:
            break
        value += step
    return ticks


def element(tag: str, cls: str = "", **attributes: Any) -> str:
    """One empty SVG element; ``stroke_width`` is written ``stroke-width``."""
    if cls:
        attributes = {"class": cls, **attributes}
    text = " ".join(
        f"{name.replace('_', '-')}={quoteattr(str(value))}" for name, value in attributes.items()
    )
    return f"<{tag} {text}/>"


def label(x: float, y: float, text: str, anchor: str) -> str:
    """A text label anchored at ``start``, ``middle`` or ``end``."""
    return (
        f"<text x={quoteattr(str(round(x, 2)))} y={quoteattr(str(round(y, 2)))} "
        f"text-anchor={quoteattr(anchor)} {FONT} fill='#24292f'>{escape(text)}</text>"
    )


def heading(text: str) -> str:
    """The chart's title line."""
    return (
        f"<text class='heading' x='{LEFT}' y='22' font-family='sans-serif' font-size='14' "
        f"font-weight='bold' fill='#24292f'>{escape(text)}</text>"
    )


def document(title: str, width: int, height: int, parts: Sequence[str]) -> str:
    """The whole SVG document, with a white background and an accessible title."""
    body = "\n".join(parts)
    return (
        f"<svg xmlns='http://www.w3.org/2000/svg' width='{width}' height='{height}' "
        f"viewBox='0 0 {width} {height}' role='img'>\n<title>{escape(title)}</title>\n"
        f"<rect width='{width}' height='{height}' fill='white'/>\n{body}\n</svg>"
    )
