"""The verdict of 06_qualify against the last good run, and the server's state after it."""

import dataclasses

from opsbook.steps import qualify_gate as gate
from opsbook.steps import qualify_matrix as matrix
from opsbook.steps import qualify_receipt as receipts
from opsbook.steps.metrics import MetricsSnapshot

TTFT = matrix.Spread(50.0, 80.0, 100.0)
FINGERPRINT = receipts.Fingerprint("NVIDIA RTX PRO 6000", 8, "580.65", "13.0", "EPYC", "ab12")


def cell(
    tok_s: float,
    ttft: matrix.Spread = TTFT,
    prompt: int = 128,
    concurrency: int = 4,
    requests: int = 120,
):
    return matrix.CellResult(
        matrix.Cell(prompt, concurrency), matrix.DRIVER_CLIENT, requests, requests, 0, 1.0,
        tok_s, tok_s / 4, ttft, matrix.Spread(), matrix.Spread(),
    )  # fmt: skip


def receipt(
    tok_s: float = 100.0,
    *,
    ttft: float = 100.0,
    p90: float = 80.0,
    requests: int = 120,
    passed: bool = True,
    **changes,
):
    made = receipts.Receipt(
        host="ops@gpu-01", started_at="2026-12-06T10:00:00+00:00", profile="quick",
        driver=matrix.DRIVER_CLIENT, fingerprint=FINGERPRINT,
        software=receipts.Software(vllm="0.32.0", model="tiny"), startup=receipts.Startup(),
        cells=[cell(tok_s, matrix.Spread(50.0, p90, ttft), requests=requests)],
        greedy_sha256={"p": "h1"}, deterministic=True,
        passed=passed, run_folder="runs/one",
    )  # fmt: skip
    return dataclasses.replace(made, **changes)


def codes(findings) -> list[str]:
    return [f.code for f in findings if f.is_problem]


def test_twenty_percent_slower_is_a_regression_and_the_same_speed_is_not() -> None:
    good = receipt(100.0)
    assert codes(gate.against_last_good(receipt(98.0), good, gate.Bands())) == []
    (slow,) = gate.against_last_good(receipt(80.0), good, gate.Bands())
    assert slow.code == gate.CODE_DECODE and "20% below last good 100.0" in slow.message
    assert slow.source == "runs/one"


def test_p99_ttft_beyond_its_band_and_floor_is_a_regression() -> None:
    good = receipt(ttft=100.0)
    assert codes(gate.against_last_good(receipt(ttft=114.0), good, gate.Bands())) == []
    assert codes(gate.against_last_good(receipt(ttft=130.0), good, gate.Bands())) == [
        gate.CODE_TTFT
    ]
    # 8 ms to 30 ms is +275% but scheduling jitter, not a regression.
    assert codes(gate.against_last_good(receipt(ttft=30.0), receipt(ttft=8.0), gate.Bands())) == []


def test_the_tail_compared_is_the_highest_percentile_the_slowest_request_does_not_set_alone() -> (
    None
):
    for n in range(3, 400):
        p = gate.tail_percentile(n)
        latencies = [float(i) for i in range(n)]
        held_up = [*latencies[:-1], 1e6]
        assert matrix.percentile(held_up, p) == matrix.percentile(latencies, p), n
        higher = [q for q in matrix.PERCENTILES if q > p]
        if higher:
            assert matrix.percentile(held_up, higher[0]) != matrix.percentile(latencies, higher[0])
    assert [gate.tail_percentile(n) for n in (10, 11, 24, 100, 101)] == [50, 90, 90, 90, 99]


def test_one_slow_request_of_24_is_no_ttft_regression_a_slower_tail_is() -> None:
    good = receipt(ttft=16.0, p90=15.0, requests=24)
    # The quick profile's 24 requests: the p99 is the slowest one's, 16 ms to 93 ms.
    assert (
        codes(gate.against_last_good(receipt(ttft=93.0, p90=15.5, requests=24), good, gate.Bands()))
        == []
    )
    (slow,) = gate.against_last_good(receipt(ttft=93.0, p90=60.0, requests=24), good, gate.Bands())
    assert slow.code == gate.CODE_TTFT
    assert slow.message.startswith("p90 TTFT 60.0 ms, 300% above last good 15.0 ms (band 15%; p90")
    assert "24 requests" in slow.message
    # The fewer requests of the two runs decide: a p99 only when both had 101 or more.
    fewer_then = receipt(ttft=16.0, p90=15.0, requests=24)
    assert (
        codes(gate.against_last_good(receipt(ttft=93.0, p90=15.5), fewer_then, gate.Bands())) == []
    )


def test_a_software_change_is_said_in_the_regression() -> None:
    upgraded = receipt(50.0, software=receipts.Software(vllm="0.33.0", model="tiny"))
    (slow,) = gate.against_last_good(upgraded, receipt(100.0), gate.Bands())
    assert "software changed: vllm: 0.33.0 vs 0.32.0" in slow.message


def test_correctness_flips_against_the_last_good_run() -> None:
    flipped = receipt(deterministic=False, degenerate={"p": "one token (id 0) repeated 32 times"})
    assert codes(gate.flips(flipped, receipt())) == [gate.CODE_FLIP, gate.CODE_FLIP]
    other_tokens = receipt(greedy_sha256={"p": "h2"})
    assert codes(gate.flips(other_tokens, receipt())) == [gate.CODE_FLIP]
    upgraded = dataclasses.replace(
        other_tokens, software=receipts.Software(vllm="0.33.0", model="tiny")
    )
    (info,) = gate.flips(upgraded, receipt())
    assert info.severity == "info" and "the software changed" in info.message


def test_the_last_good_is_the_latest_passing_run_of_the_same_hardware_and_model() -> None:
    older = receipt(90.0, started_at="2026-12-01")
    failed = receipt(10.0, passed=False, started_at="2026-12-02")
    other_gpu = receipt(300.0, fingerprint=dataclasses.replace(FINGERPRINT, gpu_count=4))
    other_model = receipt(5.0, software=receipts.Software(model="big"))
    earlier = [older, failed, other_gpu, other_model]
    good, alike = gate.last_good(receipt(), earlier)
    assert good is older and alike == [older]
    assert gate.other_hardware(receipt(), earlier) is other_gpu
    info = gate.for_information(receipt(150.0), other_gpu)
    assert info.severity == "info" and "gpu_count: 8 vs 4" in info.message
    assert "decode 0.50x of it" in info.message
    assert gate.last_good(receipt(), []) == (None, [])


def test_bands_are_learned_from_two_earlier_runs_and_never_narrower_than_the_default() -> None:
    assert gate.learned_bands([receipt(100.0)], gate.Bands()) == gate.Bands()
    steady = gate.learned_bands([receipt(100.0), receipt(100.5)], gate.Bands())
    assert steady == gate.Bands()
    noisy = gate.learned_bands([receipt(100.0), receipt(80.0), receipt(120.0)], gate.Bands())
    assert noisy.decode > 0.5


def snapshot(at: float, running: float, generated: float) -> MetricsSnapshot:
    return MetricsSnapshot(
        at, {"vllm:num_requests_running": running, "vllm:generation_tokens_total": generated}
    )


def test_requests_running_and_no_token_made_is_a_hang() -> None:
    (hung,) = gate.hang_findings(snapshot(0, 2, 500), snapshot(30, 2, 500))
    assert hung.code == gate.CODE_HUNG and "2 request(s) running" in hung.message
    assert "in 30 s" in hung.message
    assert gate.hang_findings(snapshot(0, 2, 500), snapshot(30, 2, 900)) == []
    assert gate.hang_findings(snapshot(0, 0, 500), snapshot(30, 0, 500)) == []
    assert gate.hang_findings(None, snapshot(30, 2, 500)) == []


def test_a_server_gone_after_the_run_is_an_engine_death() -> None:
    (died,) = gate.engine_findings(False, snapshot(0, 0, 1), None)
    assert died.code == gate.CODE_DIED
    assert gate.engine_findings(True, snapshot(0, 0, 1), snapshot(1, 0, 1)) == []


def test_failed_requests_and_preemptions_of_the_matrix_are_findings() -> None:
    broken = dataclasses.replace(
        cell(10.0, requests=8), failed=3, completed=5, errors=("HTTP 500: dead",)
    )
    preempted = dataclasses.replace(cell(10.0), server_preemptions=4.0)
    found = gate.own_findings([broken, preempted])
    assert [(f.severity, f.code) for f in found] == [
        ("error", gate.CODE_FAILED),
        ("warning", gate.CODE_PREEMPTED),
    ]
    assert "3 of 8 request(s) failed: HTTP 500: dead" in found[0].message


def test_a_cell_the_server_hung_in_is_a_hang_with_its_figures_not_failed_requests() -> None:
    hung = {"running": 2.0, "waiting": 1.0, "generation": 640.0, "prompt": 900.0,
            "seconds": 15.2, "after": 17.0}  # fmt: skip
    cell = dataclasses.replace(receipt().cells[0], completed=0, failed=3, hung=hung)
    (found,) = gate.own_findings([cell])
    assert found.code == gate.CODE_HUNG and found.subject == "cell 128 x 4"
    assert "2 request(s) running and 1 waiting" in found.message
    assert "stayed at 640 (prompt tokens at 900) for 15.2 s, 17 s into it" in found.message
