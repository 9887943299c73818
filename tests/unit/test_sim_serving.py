"""The simulated vLLM's serving: deterministic greedy tokens, pacing, and the serving faults."""

import time

import pytest

from opsbook.rehearsal.sim.vllm import _simconfig
from opsbook.rehearsal.sim.vllm._simserving import NATURAL_LENGTH, Serving, token_ids

WORDS = ("alpha", "bravo", "charlie")


def serving(crashes: list[int] | None = None, **settings) -> Serving:
    return Serving(settings, WORDS, lambda: (crashes if crashes is not None else []).append(1))


def test_a_reply_is_the_prompts_own_and_stops_naturally_unless_eos_is_ignored() -> None:
    reply = serving().reply("hello", 64, False, 1)
    assert reply.count == NATURAL_LENGTH and reply.finish == "stop"
    assert reply.token_ids == token_ids("hello", NATURAL_LENGTH)
    long = serving().reply("hello", 100, True, 1)
    assert long.count == 100 and long.finish == "length"
    assert long.token_ids[:NATURAL_LENGTH] == reply.token_ids
    assert long.text == "".join(" " + WORDS[i % 3] for i in long.token_ids)


def test_tokens_are_paced_by_their_seconds_times_the_slowdown() -> None:
    reply = serving(token_seconds=0.01, slowdown=2.0).reply("x", 5, True, 1)
    started = time.monotonic()
    assert list(reply.paced()) == list(reply.pieces)
    assert time.monotonic() - started >= 0.1


def test_the_bang_fault_answers_one_token_over_and_over() -> None:
    reply = serving(serving_fault="bang").reply("x", 20, True, 1)
    assert set(reply.token_ids) == {0} and reply.text == "!" * 20


def test_batch_dependent_output_changes_only_with_others_in_flight() -> None:
    faulty = serving(serving_fault="batch-dependent")
    assert faulty.reply("x", 8, True, 1).token_ids == token_ids("x", 8)
    assert faulty.reply("x", 8, True, 3).token_ids != token_ids("x", 8)


@pytest.mark.parametrize(
    ("fault", "in_flight", "crashes_at"), [("crash-after:2", 1, 3), ("crash-under:3", 3, 1)]
)
def test_crash_faults_end_the_engine_at_their_request(fault, in_flight, crashes_at) -> None:
    crashes: list[int] = []
    faulty = serving(crashes, serving_fault=fault)
    for n in range(1, 4):
        faulty.reply("x", 4, True, in_flight)
        assert len(crashes) == (n - crashes_at + 1 if n >= crashes_at else 0)


def test_serving_settings_come_from_the_file_and_the_environment(tmp_path, monkeypatch) -> None:
    (tmp_path / _simconfig.CONFIG_NAME).write_text('{"token_seconds": 0.02, "slowdown": "x"}')
    monkeypatch.setenv(_simconfig.ENV_SERVING_FAULT, "bang")
    settings = _simconfig.load(str(tmp_path))
    assert settings["token_seconds"] == 0.02 and settings["slowdown"] == 1.0
    assert settings["serving_fault"] == "bang"
    monkeypatch.setenv(_simconfig.ENV_SLOWDOWN, "1.25")
    assert _simconfig.load(str(tmp_path))["slowdown"] == 1.25
