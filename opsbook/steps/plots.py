"""Charts for the notebooks, drawn as plain SVG: no plotting library on the operator's machine.

Each function returns a :class:`Chart`, which Jupyter shows through ``_repr_svg_`` and whose
text form is a one-line description of what the chart shows (stable between runs, so stored
notebook outputs compare equal). Every drawn value carries its number in a ``data-value``
attribute and its kind in ``class``, so the SVG can be checked without rendering it.

- :func:`download_progress`: bytes present over time against the expected total;
- :func:`gpu_memory`: per GPU, memory held by each process, other use and free;
- :func:`startup_timeline`: the startup phases of a server as horizontal bars.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any
from xml.sax.saxutils import escape, quoteattr

from opsbook.core.results import Table
from opsbook.steps.host_facts import Gpu, GpuProcess
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


# --- the three charts ------------------------------------------------------------------------


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
