"""The soak of 06_qualify: its shape from the deployment and the KV cache, and what a round
finds (failed requests, a hang, preemptions, memory at capacity)."""

from opsbook.core.deployment import parse_deployment
from opsbook.remote.testing import FakeHost
from opsbook.steps import qualify_gate as gate
from opsbook.steps import qualify_matrix as matrix
from opsbook.steps import qualify_soak as soak

PROFILE = matrix.Profile("t", (128, 1024, 4096), (1, 4), 64, 8, 2, soak_minutes=0.0005)
TARGET = matrix.Target(8000, "tiny", "/m", "/p", 2048, 20_000)


def deployment(**args):
    return parse_deployment({"hosts": ["a"], "model": {"path": "/m"}, "server": {"args": args}})


def test_the_soak_runs_max_num_seqs_at_the_longest_prompt_that_fits_the_kv_cache() -> None:
    # 1024 + 64 tokens a request: 20,000 KV tokens hold 18 of them, fewer than 32 asked.
    assert soak.soak_shape(PROFILE, TARGET, deployment(**{"max-num-seqs": 32})) == (18, 1024)
    assert soak.soak_shape(PROFILE, TARGET, deployment(**{"max-num-seqs": 8})) == (8, 1024)
    roomy = matrix.Target(8000, "tiny", "/m", "/p", 0, None)
    assert soak.soak_shape(PROFILE, roomy, deployment()) == (soak.DEFAULT_MAX_NUM_SEQS, 4096)


def metrics_text(running: int, generated: int) -> str:
    return (
        "# TYPE vllm:num_requests_running gauge\n"
        f'vllm:num_requests_running{{engine="0"}} {running}\n'
        "# TYPE vllm:generation_tokens_total counter\n"
        f'vllm:generation_tokens_total{{engine="0"}} {generated}\n'
    )


def soaked(running: int, tokens_a_round: int, answers: list[dict], memory: str):
    """A soak of rounds until its deadline: each read of /metrics after the first shows
    ``running`` requests and ``tokens_a_round`` more tokens made."""
    reads = []

    def http(args):
        reads.append(args)
        made = 100 + tokens_a_round * (len(reads) // 2)
        return {"status": 200, "body": metrics_text(running, made), "seconds": 0.01}

    host = FakeHost(
        "a",
        probes={"launch": http, "serve_client": {"duration": 1.0, "answers": answers}},
        commands={r"^nvidia-smi": memory},
    )
    return soak.soak(host, TARGET, PROFILE, deployment(**{"max-num-seqs": 2}))


def test_a_clean_round_passes_and_samples_the_gpu_memory() -> None:
    seen = soaked(0, 128, [{"ok": True}, {"ok": True}], "1000, 97887\n50000, 97887\n")
    assert seen.rounds >= 1 and (seen.requests, seen.failed) == (2 * seen.rounds, 0)
    assert (seen.memory_high_mib, seen.memory_total_mib) == (50000, 97887)
    assert seen.findings == []


def test_failures_a_hang_and_memory_at_capacity_are_each_a_finding() -> None:
    seen = soaked(2, 0, [{"ok": False, "error": "timeout"}, {"ok": True}], "97500, 97887\n")
    assert [f.code for f in seen.findings] == [
        gate.CODE_HUNG,
        soak.CODE_SOAK_FAILED,
        soak.CODE_SOAK_MEMORY,
    ]
    assert "1 of 2 request(s) failed in 1 round(s)" in seen.findings[1].message


def test_a_round_the_watch_found_hung_is_a_hang_with_its_figures() -> None:
    hung = {"running": 2.0, "waiting": 0.0, "generation": 100.0, "prompt": 50.0,
            "seconds": 15.0, "after": 16.0}  # fmt: skip
    host = FakeHost(
        "a",
        probes={
            "launch": {"status": 200, "body": metrics_text(2, 100), "seconds": 0.01},
            "serve_client": {"duration": 16.0, "answers": [{"ok": False}] * 2, "hung": hung},
        },
        commands={r"^nvidia-smi": "1000, 97887\n"},
    )
    seen = soak.soak(host, TARGET, PROFILE, deployment(**{"max-num-seqs": 2}))
    (found,) = seen.findings
    assert found.code == gate.CODE_HUNG and found.subject == "soak 2 x 1024"
    assert "for 15 s, 16 s into it" in found.message and seen.failed == 0
