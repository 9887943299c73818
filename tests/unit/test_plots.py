import dataclasses
import xml.etree.ElementTree as ET

import pytest

from opsbook.core.results import Table
from opsbook.steps import plots
from opsbook.steps import qualify_matrix as matrix
from opsbook.steps.host_facts import Gpu, GpuProcess
from opsbook.steps.qualify_matrix import CellResult

SVG = "{http://www.w3.org/2000/svg}"


def parse(chart: plots.Chart) -> ET.Element:
    root = ET.fromstring(chart._repr_svg_())
    assert root.tag == f"{SVG}svg"
    return root


def of_class(root: ET.Element, tag: str, cls: str) -> list[ET.Element]:
    return [e for e in root.iter(f"{SVG}{tag}") if e.get("class") == cls]


def texts(root: ET.Element) -> list[str]:
    return [e.text or "" for e in root.iter(f"{SVG}text")]


def height(rect: ET.Element) -> float:
    return float(rect.get("height", "0"))


def gpu(index: int, used: int, total: int = 97887) -> Gpu:
    return Gpu(
        index,
        "NVIDIA RTX PRO 6000 Blackwell Workstation Edition",
        "12.0",
        total,
        used,
        total - used,
        uuid=f"GPU-{index}",
    )


@pytest.mark.parametrize(
    "chart",
    [
        plots.download_progress([], 100),
        plots.gpu_memory([], []),
        plots.gpu_memory([Gpu(0, "unknown")], []),
        plots.startup_timeline(Table(["phase", "starts at (s)", "lasts (s)"], [])),
        plots.startup_timeline([]),
    ],
)
def test_empty_inputs_say_no_data(chart: plots.Chart) -> None:
    root = parse(chart)
    assert "no data" in texts(root)
    assert repr(chart).endswith(": no data>")


def test_download_progress_scales_bytes_and_time() -> None:
    chart = plots.download_progress([(0.0, 0), (10.0, 500), (20.0, 1000)], 1000)
    root = parse(chart)
    points = [
        tuple(map(float, p.split(",")))
        for p in of_class(root, "polyline", "progress")[0].get("points", "").split()
    ]
    assert len(points) == 3
    (x0, y0), (x1, y1), (x2, y2) = points
    assert x1 - x0 == pytest.approx(x2 - x1)
    assert y0 - y1 == pytest.approx(y1 - y2)
    assert y2 < y0  # more bytes are drawn higher
    expected = of_class(root, "line", "expected")[0]
    assert float(expected.get("y1", "0")) == pytest.approx(y2)
    assert expected.get("data-value") == "1000"
    assert "expected 1.0 kB" in texts(root)


def test_download_progress_below_expected_stays_under_the_line() -> None:
    root = parse(plots.download_progress([(0.0, 100), (5.0, 250)], 1000))
    last = of_class(root, "circle", "sample")[-1]
    expected = of_class(root, "line", "expected")[0]
    assert float(last.get("cy", "0")) > float(expected.get("y1", "0"))
    assert last.get("data-value") == "250"


def test_download_progress_description_is_stable_across_runs() -> None:
    first = plots.download_progress([(0.0, 1), (3.2, 7)], 547_000_000_000)
    second = plots.download_progress([(0.0, 5), (9.9, 12), (15.0, 20)], 547_000_000_000)
    assert repr(first) == repr(second) == "<Chart: download progress: 547.0 GB expected>"


def test_gpu_memory_stacks_processes_other_use_and_free() -> None:
    gpus = [gpu(0, 80000), gpu(1, 0)]
    processes = [
        GpuProcess(4242, "VLLM::Worker_TP0", 70000, "GPU-0", 0),
        GpuProcess(4343, "python3 <tricky & name>", 6000, "GPU-0", None),
    ]
    chart = plots.gpu_memory(gpus, processes)
    root = parse(chart)
    assert repr(chart) == "<Chart: GPU memory: 2 GPU(s), 2 process(es)>"
    held = of_class(root, "rect", "process")
    assert [(r.get("data-pid"), r.get("data-value")) for r in held] == [
        ("4242", "70000"),
        ("4343", "6000"),
    ]
    other = of_class(root, "rect", "other")
    assert [r.get("data-value") for r in other] == ["4000"]
    free = of_class(root, "rect", "free")
    assert [(r.get("data-gpu"), r.get("data-value")) for r in free] == [
        ("0", "17887"),
        ("1", "97887"),
    ]
    per_mib = height(held[0]) / 70000
    assert height(free[1]) == pytest.approx(97887 * per_mib, rel=1e-3)
    bar0 = sum(height(r) for r in held + other) + height(free[0])
    assert bar0 == pytest.approx(height(free[1]), rel=1e-3)
    assert "PID 4343 python3 <tricky & name>" in texts(root)


def test_gpu_memory_total_from_used_and_free_and_unknown_gpus() -> None:
    gpus = [Gpu(0, "A", memory_used_mib=1000, memory_free_mib=3000), Gpu(1, "B")]
    root = parse(plots.gpu_memory(gpus))
    assert [r.get("data-value") for r in of_class(root, "rect", "other")] == ["1000"]
    assert [r.get("data-value") for r in of_class(root, "rect", "free")] == ["3000"]
    assert "N/A" in texts(root)


def test_startup_timeline_bars_are_proportional() -> None:
    table = Table(
        ["phase", "starts at (s)", "lasts (s)"],
        [["config", 0.0, 2.0], ["weights", 2.0, 8.0], ["ready", 10.0, None]],
    )
    chart = plots.startup_timeline(table)
    root = parse(chart)
    assert repr(chart) == "<Chart: startup timeline: 3 phase(s)>"
    bars = of_class(root, "rect", "phase")
    widths = [float(b.get("width", "0")) for b in bars]
    assert widths[1] == pytest.approx(4 * widths[0])
    starts = [float(b.get("x", "0")) for b in bars]
    assert starts[1] == pytest.approx(starts[0] + widths[0])
    assert bars[2].get("data-value") == ""
    assert {"config", "weights", "ready", "8 s"} <= set(texts(root))


def test_nice_ticks_cover_the_range() -> None:
    assert plots.nice_ticks(0, 547e9) == [0, 2e11, 4e11, 6e11]
    assert plots.nice_ticks(0, 95.6) == [0, 20, 40, 60, 80, 100]
    assert plots.nice_ticks(0, 0) == [0, 0.2, 0.4, 0.6, 0.8, 1.0]


def cell(prompt: int, concurrency: int, tok_s: float, ttft_p99: float | None) -> CellResult:
    return CellResult(
        matrix.Cell(prompt, concurrency), matrix.DRIVER_CLIENT, 8, 8, 0, 2.0, tok_s, tok_s / 2,
        matrix.Spread(1.0, 2.0, ttft_p99), matrix.Spread(), matrix.Spread(),
    )  # fmt: skip


NOW = [cell(128, 1, 100.0, 20.0), cell(128, 4, 300.0, 40.0), cell(1024, 1, 90.0, 80.0),
       cell(1024, 4, 250.0, 120.0)]  # fmt: skip
GOOD = [cell(128, 1, 110.0, 20.0), cell(128, 4, 320.0, 35.0), cell(1024, 4, 260.0, 100.0)]


def points(root: ET.Element, kind: str) -> dict[tuple[str, str], float]:
    return {
        (c.get("data-series", ""), c.get("data-x", "")): float(c.get("data-value", "nan"))
        for c in of_class(root, "circle", kind)
    }


def test_throughput_by_concurrency_draws_this_run_and_the_last_good_run_dashed() -> None:
    chart = plots.throughput_by_concurrency(NOW, GOOD)
    assert repr(chart) == (
        "<Chart: output tok/s by concurrency: 2 prompt length(s), against the last good run>"
    )
    root = parse(chart)
    assert points(root, "now") == {
        ("prompt 128", "1"): 100.0, ("prompt 128", "4"): 300.0,
        ("prompt 1024", "1"): 90.0, ("prompt 1024", "4"): 250.0,
    }  # fmt: skip
    assert points(root, "last-good") == {
        ("prompt 128", "1"): 110.0, ("prompt 128", "4"): 320.0, ("prompt 1024", "4"): 260.0,
    }  # fmt: skip
    now = {line.get("data-series"): line for line in of_class(root, "polyline", "now")}
    then = {line.get("data-series"): line for line in of_class(root, "polyline", "last-good")}
    assert now["prompt 128"].get("stroke") == then["prompt 128"].get("stroke")
    assert now["prompt 128"].get("stroke") != now["prompt 1024"].get("stroke")
    assert then["prompt 128"].get("stroke-dasharray") and not now["prompt 128"].get(
        "stroke-dasharray"
    )
    # The same concurrency is drawn at the same x, and more tok/s higher.
    circles = {(c.get("data-series"), c.get("data-x")): c for c in of_class(root, "circle", "now")}
    assert circles[("prompt 128", "4")].get("cx") == circles[("prompt 1024", "4")].get("cx")
    assert float(circles[("prompt 128", "4")].get("cy", "0")) < float(
        circles[("prompt 128", "1")].get("cy", "0")
    )
    assert "last good" in texts(root)


def test_ttft_by_prompt_length_a_line_per_concurrency_and_a_first_run_alone() -> None:
    chart = plots.ttft_by_prompt_length(NOW)
    assert repr(chart) == (
        "<Chart: p99 TTFT (ms) by prompt length: 2 concurrenc(ies), no last good run>"
    )
    root = parse(chart)
    assert points(root, "now") == {
        ("1 at once", "128"): 20.0, ("1 at once", "1024"): 80.0,
        ("4 at once", "128"): 40.0, ("4 at once", "1024"): 120.0,
    }  # fmt: skip
    assert not of_class(root, "circle", "last-good")
    assert "last good" not in texts(root)


def test_matrix_charts_leave_out_failed_cells_and_say_no_data_without_any() -> None:
    failed = [cell(128, 1, 0.0, None)]
    failed[0] = dataclasses.replace(failed[0], completed=0)
    assert repr(plots.throughput_by_concurrency(failed)).endswith(": no data>")
    assert repr(plots.ttft_by_prompt_length([])).endswith(": no data>")
    root = parse(plots.throughput_by_concurrency([*failed, cell(128, 4, 50.0, 9.0)]))
    assert points(root, "now") == {("prompt 128", "4"): 50.0}
