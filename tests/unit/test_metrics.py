"""/metrics parsing: samples summed over labels, histogram quantiles as Prometheus computes them."""

from __future__ import annotations

import pytest

from opsbook.core.exceptions import ProbeError
from opsbook.remote.testing import FakeHost
from opsbook.steps import metrics

# The shape vLLM 0.32.0's PrometheusStatLogger exports (vllm/v1/metrics/loggers.py): two
# engines under data parallelism, one counter, one gauge, one histogram.
TEXT = """\
# HELP vllm:num_requests_running Number of requests in model execution batches.
# TYPE vllm:num_requests_running gauge
vllm:num_requests_running{engine="0",model_name="m"} 3.0
vllm:num_requests_running{engine="1",model_name="m"} 2.0
# HELP vllm:generation_tokens_total Number of generation tokens processed.
# TYPE vllm:generation_tokens_total counter
vllm:generation_tokens_total{engine="0",model_name="m"} 100.0
vllm:generation_tokens_total{engine="1",model_name="m"} 50.0
# HELP vllm:time_to_first_token_seconds Histogram of time to first token in seconds.
# TYPE vllm:time_to_first_token_seconds histogram
vllm:time_to_first_token_seconds_bucket{engine="0",le="0.1",model_name="m"} 2.0
vllm:time_to_first_token_seconds_bucket{engine="0",le="1.0",model_name="m"} 8.0
vllm:time_to_first_token_seconds_bucket{engine="0",le="+Inf",model_name="m"} 10.0
vllm:time_to_first_token_seconds_count{engine="0",model_name="m"} 10.0
vllm:time_to_first_token_seconds_sum{engine="0",model_name="m"} 4.5
"""


def test_samples_are_summed_over_engines() -> None:
    snapshot = metrics.parse_metrics(TEXT, taken_at=1.0)
    assert snapshot.running == 5.0
    assert snapshot.generation_tokens == 150.0
    assert snapshot.waiting is None
    assert not snapshot.idle


def test_a_server_with_no_requests_is_idle() -> None:
    text = TEXT.replace("} 3.0", "} 0.0").replace("} 2.0", "} 0.0")
    assert metrics.parse_metrics(text).idle


def test_histogram_quantile_interpolates_inside_the_bucket() -> None:
    ttft = metrics.parse_metrics(TEXT).histograms["vllm:time_to_first_token_seconds"]
    assert ttft.count == 10.0 and ttft.total == 4.5
    # rank 5 of 10 falls in (0.1, 1.0] holding observations 3..8: 0.1 + 0.9 * (3 / 6)
    assert ttft.quantile(0.5) == pytest.approx(0.55)
    # past the last finite bound Prometheus answers the highest finite bound
    assert ttft.quantile(0.99) == pytest.approx(1.0)


def test_histogram_minus_keeps_only_the_later_observations() -> None:
    later = metrics.parse_metrics(TEXT).histograms["vllm:time_to_first_token_seconds"]
    earlier = metrics.Histogram(((0.1, 2.0), (1.0, 2.0), (float("inf"), 2.0)), 0.1, 2.0)
    since = later.minus(earlier)
    assert since.count == 8.0
    assert since.quantile(1.0) == pytest.approx(1.0)
    assert metrics.Histogram(()).quantile(0.5) is None


def test_text_that_is_not_prometheus_is_refused() -> None:
    with pytest.raises(ValueError):
        metrics.parse_metrics("<html>not metrics</html>\n")


def test_read_metrics_names_the_port_when_nothing_answers() -> None:
    host = FakeHost("gpu1", probes={"launch": {"status": None, "error": "connection refused"}})
    with pytest.raises(ProbeError, match="port 8000 did not answer: connection refused"):
        metrics.read_metrics(host, 8000)


def test_read_metrics_parses_what_the_host_answers() -> None:
    host = FakeHost("gpu1", probes={"launch": {"status": 200, "body": TEXT, "seconds": 0.01}})
    snapshot = metrics.read_metrics(host, 8000)
    assert snapshot.generation_tokens == 150.0
    assert host.probe_args[-1][1]["path"] == "/metrics"


def text_with(running: float, waiting: float, tokens: float, prompt: float = 10.0) -> str:
    return (
        "# TYPE vllm:num_requests_running gauge\n"
        f'vllm:num_requests_running{{engine="0"}} {running}\n'
        "# TYPE vllm:num_requests_waiting gauge\n"
        f'vllm:num_requests_waiting{{engine="0"}} {waiting}\n'
        "# TYPE vllm:generation_tokens counter\n"
        f'vllm:generation_tokens_total{{engine="0"}} {tokens}\n'
        "# TYPE vllm:prompt_tokens counter\n"
        f'vllm:prompt_tokens_total{{engine="0"}} {prompt}\n'
    )


class Clock:
    """A clock the watch's sleeps move, and the /metrics answers it gives in turn."""

    def __init__(self, *texts: str):
        self.now = 0.0
        self.texts = list(texts)

    def sleep(self, seconds: float) -> None:
        self.now += seconds

    def answer(self, args: dict[str, object]) -> dict[str, object]:
        text = self.texts.pop(0) if len(self.texts) > 1 else self.texts[0]
        return {"status": 200, "body": text, "seconds": 0.01}

    def watch(self, **more: float) -> metrics.GenerationWatch:
        host = FakeHost("gpu1", probes={"launch": self.answer})
        return metrics.watch_generation(
            host, 8000, sleep=self.sleep, clock=lambda: self.now, **more
        )


def test_requests_in_flight_without_a_token_for_the_stall_time_are_hung() -> None:
    clock = Clock(text_with(3, 1, 120))
    watch = clock.watch(stall_seconds=15.0, interval=1.0)
    assert watch.verdict == metrics.HUNG
    assert watch.seconds == 15.0
    assert watch.message.startswith(
        "3 request(s) running and 1 waiting, but vllm:generation_tokens_total stayed at 120 "
        "for 15 s"
    )


def test_a_server_without_requests_is_idle_at_once_not_hung() -> None:
    clock = Clock(text_with(0, 0, 120))
    watch = clock.watch()
    assert watch.verdict == metrics.IDLE and watch.seconds == 0.0


def test_a_token_produced_during_the_watch_is_generating() -> None:
    clock = Clock(text_with(2, 0, 120), text_with(2, 0, 120), text_with(2, 0, 121))
    watch = clock.watch()
    assert watch.verdict == metrics.GENERATING
    assert watch.message == "generating: 1 token(s) in 2 s"


def test_a_long_prefill_moves_the_prompt_counter_and_is_not_hung() -> None:
    clock = Clock(text_with(0, 1, 120, prompt=10), text_with(1, 0, 120, prompt=2058))
    assert clock.watch().verdict == metrics.GENERATING


def test_requests_that_finish_during_the_watch_leave_it_idle() -> None:
    clock = Clock(text_with(1, 0, 120), text_with(0, 0, 120))
    assert clock.watch().verdict == metrics.IDLE


def test_the_summary_gives_the_figures_and_the_latency_percentiles() -> None:
    summary = metrics.summarize(metrics.parse_metrics(TEXT))
    assert summary["running"] == 5.0 and summary["generation_tokens"] == 150.0
    assert summary["waiting"] is None and summary["kv_cache_usage"] is None
    assert summary["ttft_p50_s"] == pytest.approx(0.55)
    assert summary["ttft_p99_s"] == pytest.approx(1.0)
    assert summary["tpot_p50_s"] is None
    shown = metrics.summary_of("ready", metrics.parse_metrics(TEXT))
    assert shown.moment == "ready" and ["running", 5.0] in shown.rows


def test_names_of_an_unknown_or_too_old_release_are_0_32_0_s() -> None:
    assert metrics.names_for(None) == metrics.MetricNames()
    assert metrics.names_for("0.1.0") == metrics.MetricNames()
    assert metrics.names_for("0.10.2").release == "0.10.2"
