"""The performance matrix of 06_qualify: which cells fit, the driver's commands and answers
read into cells, the server's counters with the warm-up taken out."""

import dataclasses
import shlex

import pytest

from opsbook.core.exceptions import ProbeError
from opsbook.remote.testing import FakeHost
from opsbook.steps import qualify_matrix as matrix
from opsbook.steps.metrics import MetricsSnapshot

TARGET = matrix.Target(8000, "tiny", "/models/tiny", "/opt/venv/bin/python", 2048, 20_000)
QUICK = matrix.PROFILES["quick"]


def test_cells_beyond_the_model_length_or_the_kv_cache_are_skipped_with_the_reason() -> None:
    profile = matrix.Profile("t", (128, 1024, 4096), (1, 16), 64, 8, 2)
    cells, skipped = matrix.plan_cells(profile, TARGET)
    assert [c.label for c in cells] == ["128 x 1", "128 x 16", "1024 x 1", "1024 x 16"]
    reasons = {s.cell.label: s.reason for s in skipped}
    assert reasons == {
        "4096 x 1": "4160 tokens a request > max model length 2048",
        "4096 x 16": "4160 tokens a request > max model length 2048",
    }
    small = matrix.Target(8000, "tiny", "/m", "/p", 0, 10_000)
    _, skipped = matrix.plan_cells(profile, small)
    assert "17,408 tokens in flight > KV cache 10,000 tokens" in [s.reason for s in skipped]


def test_percentiles_interpolate_as_numpy_does() -> None:
    values = [1.0, 2.0, 3.0, 4.0, 10.0]
    assert matrix.percentile(values, 50) == 3.0
    assert matrix.percentile(values, 90) == pytest.approx(7.6)  # numpy.percentile(values, 90)
    assert matrix.Spread.of([0.010, 0.020]).p50 == pytest.approx(15.0)
    assert matrix.Spread.of([]) == matrix.Spread()


def test_the_bench_serve_command_is_the_venvs_own_with_every_value_quoted() -> None:
    target = matrix.Target(8000, "my model; rm -rf /", "/m", "/opt/my venv/bin/python")
    command = matrix.bench_serve_command(target, QUICK, matrix.Cell(128, 4), "/tmp/r", "b.json")
    words = shlex.split(command)
    assert words[:3] == ["/opt/my venv/bin/vllm", "bench", "serve"]
    assert words[words.index("--model") + 1] == "my model; rm -rf /"

    def value(flag: str) -> str:
        return words[words.index(flag) + 1]

    assert value("--random-input-len") == "128" and value("--max-concurrency") == "4"
    assert value("--num-warmups") == "2" and value("--metric-percentiles") == "50,90,99"
    assert "--ignore-eos" in words and "--save-result" in words


def test_bench_serve_json_is_read_into_a_cell() -> None:
    # The keys vLLM 0.32.0's benchmarks/serve.py saves (a run's real file, shortened).
    doc = {
        "duration": 2.0, "completed": 4, "failed": 0, "output_throughput": 128.0,
        "mean_tpot_ms": 10.0, "max_concurrency": 4, "total_output_tokens": 256,
        "p50_ttft_ms": 150.0, "p90_ttft_ms": 200.0, "p99_ttft_ms": 200.0,
        "p50_tpot_ms": 10.0, "p90_tpot_ms": 10.0, "p99_tpot_ms": 10.0,
        "p50_itl_ms": 10.0, "p90_itl_ms": 11.0, "p99_itl_ms": 12.0,
    }  # fmt: skip
    cell = matrix.cell_from_bench_json(doc, matrix.Cell(128, 4), "raw")
    assert (cell.driver, cell.completed, cell.failed, cell.requests) == (
        "vllm bench serve", 4, 0, 4,
    )  # fmt: skip
    assert cell.output_tok_s == 128.0 and cell.per_request_tok_s == pytest.approx(100.0)
    assert cell.ttft_ms == matrix.Spread(150.0, 200.0, 200.0)
    assert cell.itl_ms.p99 == 12.0 and cell.raw == "raw" and cell.errors == ()


def test_the_clients_answers_are_read_into_a_cell() -> None:
    ok = {"ok": True, "tokens": 11, "ttft": 0.05, "latency": 0.15, "itl": [0.01] * 10}
    failed = {"ok": False, "tokens": 0, "error": "RemoteDisconnected: closed", "itl": []}
    cell = matrix.cell_from_client(
        {"duration": 0.5, "answers": [ok, ok, failed]}, matrix.Cell(128, 2)
    )
    assert (cell.completed, cell.failed, cell.requests) == (2, 1, 3)
    assert cell.output_tok_s == 44.0
    assert cell.per_request_tok_s == pytest.approx(100.0)
    assert cell.ttft_ms.p50 == pytest.approx(50.0) and cell.tpot_ms.p99 == pytest.approx(10.0)
    assert cell.errors == ("RemoteDisconnected: closed",)


def snapshot(at: float, generated: float, prompt: float, preempted: float) -> MetricsSnapshot:
    return MetricsSnapshot(
        at,
        {
            "vllm:generation_tokens_total": generated,
            "vllm:prompt_tokens_total": prompt,
            "vllm:num_preemptions_total": preempted,
        },
    )


def test_server_deltas_leave_the_warm_up_out() -> None:
    measured = matrix.cell_from_client(
        {"duration": 2.0, "answers": [{"ok": True, "tokens": 64, "ttft": 0.1, "latency": 1.0}]},
        matrix.Cell(128, 1),
    )
    before, after = snapshot(0, 1000, 500, 1), snapshot(3, 1000 + 128 + 64, 500 + 384, 3)
    cell = matrix.with_server_deltas(
        measured, before, after, warm_tokens=128, warm_prompt_tokens=256
    )
    assert cell.server_generation_tokens == 64 and cell.server_prompt_tokens == 128
    assert cell.server_preemptions == 2 and cell.server_decode_tok_s == 32.0
    assert matrix.with_server_deltas(measured, None, after, 0, 0) is measured


HUNG = {"running": 2.0, "waiting": 0.0, "generation": 640.0, "prompt": 900.0, "seconds": 15.2,
        "after": 17.0, "in_flight": 0}  # fmt: skip
BENCH_JSON = (
    '{"duration": 2.0, "completed": 24, "failed": 0, "output_throughput": 768.0, '
    '"mean_tpot_ms": 5.0, "p50_ttft_ms": 20.0, "p90_ttft_ms": 30.0, "p99_ttft_ms": 40.0}'
)


def bench_host(answer: dict, seen: list) -> FakeHost:
    def probe(args: dict) -> dict:
        seen.append(args)
        return answer

    return FakeHost(
        "a",
        probes={"serve_client": probe, "launch": ProbeError("no /metrics")},
        files={"/r/bench-128x4.json": BENCH_JSON},
        commands={r"^mkdir -p -- /r$": ""},
    )


def test_a_bench_cell_runs_under_the_watch_with_the_key_never_on_its_command_line() -> None:
    seen: list = []
    target = dataclasses.replace(TARGET, api_key="sk-secret-key-1234", stall_seconds=9.0)
    host = bench_host({"exit_code": 0, "stdout": "", "stderr": "", "hung": None}, seen)
    cell = matrix.run_cell(host, target, QUICK, matrix.Cell(128, 4), matrix.DRIVER_BENCH, "/r")
    assert cell.output_tok_s == 768.0 and cell.hung is None
    (args,) = seen
    assert args["command"][:3] == ["/opt/venv/bin/vllm", "bench", "serve"]
    assert "sk-secret-key-1234" not in " ".join(args["command"])
    assert args["bearer"] == "sk-secret-key-1234"
    assert args["watch"]["generation"] == "vllm:generation_tokens_total"
    assert args["watch"]["stall"] == 9.0


def test_a_cell_the_server_hung_in_carries_the_figures() -> None:
    host = bench_host({"exit_code": -15, "stdout": "", "stderr": "", "hung": HUNG}, [])
    cell = matrix.run_cell(host, TARGET, QUICK, matrix.Cell(128, 4), matrix.DRIVER_BENCH, "/r")
    assert cell.hung == HUNG and cell.completed == 0
    assert cell.errors == ("the server hung: the cell was ended",)
    client = matrix.cell_from_client(
        {"duration": 17.0, "answers": [{"ok": False, "error": "ended"}], "hung": HUNG},
        matrix.Cell(128, 1),
    )
    assert client.hung == HUNG


def test_no_two_cells_of_a_run_send_the_same_prompts() -> None:
    # Same length, same run: the second cell would be served from the first's prefix cache.
    one, four = matrix.Cell(128, 1), matrix.Cell(128, 4)
    seeds = {matrix.cell_seed(TARGET, c) for c in (one, four)} | {matrix.cell_seed(TARGET, "soak")}
    assert len(seeds) == 3
    assert matrix.cell_seed(TARGET, one) == matrix.cell_seed(TARGET, matrix.Cell(128, 1))
    commands = [matrix.bench_serve_command(TARGET, QUICK, c, "/r", "b.json") for c in (one, four)]
    words = [shlex.split(command) for command in commands]
    assert len({w[w.index("--seed") + 1] for w in words}) == 2
    sent = []

    def client(args: dict) -> dict:
        sent.append([r["prompt"] for r in args["requests"]])
        return {"duration": 1.0, "answers": []}

    host = FakeHost("a", probes={"serve_client": client, "launch": ProbeError("no /metrics")})
    for c in (one, four):
        matrix.run_cell(host, TARGET, QUICK, c, matrix.DRIVER_CLIENT, "/r")
    assert not set(sent[0]) & set(sent[1])
