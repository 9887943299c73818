"""The typed format between a notebook's kernel and the runner: both directions, live."""

import pytest

from opsbook.core import channel
from opsbook.core.results import Finding, HostResult, Result, State


def test_a_result_survives_the_trip_through_the_file(tmp_path, monkeypatch) -> None:
    path = tmp_path / "out.jsonl"
    monkeypatch.setenv(channel.OUTCOME_ENV, str(path))
    sent = HostResult(
        "ops@gpu-01",
        "launch",
        State.FAILED,
        "crashed: FP8 KV cache",
        failure_id="fp8kv-mla",
        findings=(
            Finding("error", "log", "no backend", "patch the config", "vllm#34597"),
            Finding("warning", "vLLM", "hosts differ", code="hosts-differ"),
        ),
        duration=2.5,
        script_sha256="0" * 64,
    )
    channel.record_host(sent)
    assert channel.read(path) == [sent]


def test_nothing_is_written_outside_a_run(tmp_path, monkeypatch) -> None:
    monkeypatch.delenv(channel.OUTCOME_ENV, raising=False)
    r = channel.record(Result(True, "fine"), stage="preflight", host="h")
    assert r.ok and not any(tmp_path.iterdir())


def test_the_follower_sees_each_line_once_and_waits_for_half_written_ones(tmp_path) -> None:
    path = tmp_path / "out.jsonl"
    follower = channel.Follower(path)
    assert follower.new() == []
    first = HostResult("a", "preflight", State.OK, "ok")
    second = HostResult("b", "preflight", State.UNREACHABLE, "refused")
    line = channel.encode(second)
    path.write_text(channel.encode(first) + "\n" + line[:10])
    assert follower.new() == [first]
    with path.open("a") as f:
        f.write(line[10:] + "\n")
    assert follower.new() == [second]
    assert follower.new() == []


def test_a_line_that_is_not_a_result_is_refused() -> None:
    with pytest.raises((ValueError, KeyError)):
        channel.decode('{"host": "a"}')
    with pytest.raises(ValueError):
        channel.decode('{"host": "a", "stage": "s", "state": "fine", "message": ""}')


def test_progress_lines_are_followed_live_but_are_not_results(tmp_path, monkeypatch) -> None:
    path = tmp_path / "out.jsonl"
    monkeypatch.setenv(channel.OUTCOME_ENV, str(path))
    step = channel.StageProgress("a", "launch", 12.0, "loading: weights")
    done = HostResult("a", "launch", State.CHANGED, "smoke test passed")
    channel.record_progress(step)
    channel.record_host(done)
    assert channel.Follower(path).new() == [step, done]
    assert channel.read(path) == [done]
    assert "loading: weights" in step.line() and "12 s" in step.line()


def test_an_amended_result_takes_the_place_of_the_one_recorded_before(
    tmp_path, monkeypatch
) -> None:
    path = tmp_path / "out.jsonl"
    monkeypatch.setenv(channel.OUTCOME_ENV, str(path))
    first = HostResult("ops@a", "preflight", State.OK, "checked")
    other = HostResult("ops@b", "preflight", State.OK, "checked")
    channel.record_host(first)
    channel.record_host(other)
    later = HostResult("ops@a", "preflight", State.OK, "checked; hosts differ: vLLM 0.15.1")
    follower = channel.Follower(path)
    follower.new()
    channel.record_amended(later)
    [seen] = follower.new()
    assert isinstance(seen, channel.Amended) and seen.result == later
    assert channel.read(path) == [later, other]
    assert not channel.same_line(first, later) and channel.same_line(later, later)


def test_a_metrics_summary_is_kept_in_the_file_but_is_no_result(tmp_path, monkeypatch) -> None:
    path = tmp_path / "out.jsonl"
    monkeypatch.setenv(channel.OUTCOME_ENV, str(path))
    sent = channel.StageMetrics("ops@gpu-01", "diagnose", "end", {"running": 2.0, "ttft": None})
    channel.record_metrics(sent)
    channel.record_host(HostResult("ops@gpu-01", "diagnose", State.OK, "ready"))
    assert channel.read_metrics(path) == [sent]
    assert [r.message for r in channel.read(path)] == ["ready"]
    assert channel.Follower(path).new()[0] == sent
    with pytest.raises(ValueError, match="not a host result"):
        channel.decode(path.read_text().splitlines()[0])
