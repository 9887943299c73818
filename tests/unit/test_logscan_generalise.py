"""Unit tests of opsbook.knowledge.logscan's mechanisms for logs nobody has seen: inputs rendered
from the
format strings in vLLM's and its libraries' source (named at each test), not copied from logs."""

from __future__ import annotations

from opsbook.knowledge.logscan import READY, diagnose_log

# vLLM 0.10.2-0.34.0 vllm/v1/metrics/loggers.py LoggingStatLogger.log, rendered.
V1_STATS = (
    "(APIServer pid=9) INFO 05-19 10:13:11 [loggers.py:271] Engine 000: Avg prompt throughput: "
    "12.5 tokens/s, Avg generation throughput: 80.0 tokens/s, Running: 3 reqs, Waiting: 0 reqs, "
    "GPU KV cache usage: 4.0%, Prefix cache hit rate: 0.0%"
)
# vLLM 0.10.2 vllm/engine/metrics.py (V0 LoggingStatLogger), rendered.
V0_STATS = (
    "INFO 01-22 18:25:09 metrics.py:449] Avg prompt throughput: 0.0 tokens/s, Avg generation "
    "throughput: 61.0 tokens/s, Running: 2 reqs, Swapped: 0 reqs, Pending: 0 reqs, GPU KV "
    "cache usage: 7.4%, CPU KV cache usage: 0.0%."
)


def test_an_engine_logging_its_throughput_stats_is_serving() -> None:
    for stats in (V1_STATS, V0_STATS):
        text = "\n".join(["INFO 01-22 18:25:07 engine.py:267] Added request cmpl-1.", stats, stats])

        diagnosis = diagnose_log(text)

        assert diagnosis.state == READY
        assert diagnosis.line is not None and diagnosis.line.raw == stats


# vLLM 0.10.2 vllm/v1/worker/gpu_worker.py (later releases name the device), rendered, then
# wrapped or cut.
FREE_MEMORY_HEAD = (
    "ValueError: Free memory on device cuda:0 (10.00/80.00 GiB) on startup is less than"
)


def test_an_exception_cut_after_its_fixed_words_matches_its_stem() -> None:
    assert diagnose_log(FREE_MEMORY_HEAD).failure == "free-memory"
    assert diagnose_log(FREE_MEMORY_HEAD.replace("cuda:0 ", "")).failure == "free-memory"


def test_v0s_negative_kv_cache_profile_is_kv_cache_too_small() -> None:
    # vLLM 0.10.2 vllm/worker/worker.py Worker.determine_num_available_blocks, rendered.
    profile = (
        "INFO 02-26 09:54:05 worker.py:267] model weights take 5.20GiB; non_torch_memory takes "
        "0.03GiB; PyTorch activation peak memory takes 1.42GiB; the rest of the memory reserved "
        "for KV Cache is -1.05GiB."
    )
    positive = profile.replace("-1.05GiB", "1.05GiB")

    assert diagnose_log(profile).failure == "kv-cache-too-small"
    assert diagnose_log(positive).failure != "kv-cache-too-small"


def test_ptxas_not_knowing_the_gpu_is_cuda_arch_unsupported() -> None:
    # triton 3.9.0 triton/backends/nvidia/compiler.py make_cubin: PTXASError quotes ptxas'
    # stderr, whose message is ptxas' own "Value '%s' is not defined for option '%s'".
    ptxas = "ptxas fatal   : Value 'sm_121a' is not defined for option 'gpu-name'"
    text = "\n".join(
        [
            "(EngineCore_DP0 pid=7) triton.runtime.errors.PTXASError: Internal Triton PTX "
            "codegen error",
            "(EngineCore_DP0 pid=7) `ptxas` stderr:",
            "(EngineCore_DP0 pid=7) " + ptxas,
        ]
    )

    diagnosis = diagnose_log(text)

    assert diagnosis.failure == "cuda-arch-unsupported"
    assert diagnosis.line is not None and diagnosis.line.raw.endswith(ptxas)
    assert diagnose_log(ptxas).failure == "cuda-arch-unsupported"


def test_a_device_side_assertion_is_the_error_reported() -> None:
    # The GPU's device-side assert: glibc's "%s:%u: %s: Assertion `%s' failed." with the block
    # and thread added (triton 3.9.0 triton/language/core.py device_assert compiles to it).
    assertion = (
        "/tmp/torchinductor/ab/kernel.py:45: <module>: block: [3,0,0], thread: [12,0,0] "
        "Assertion `index out of bounds: 0 <= tmp1 < 4096` failed."
    )
    text = "\n".join(
        ["INFO 05-06 21:00:41 [core.py:1] Starting to load model org/model...", assertion]
    )

    diagnosis = diagnose_log(text)

    assert diagnosis.failure == "unrecognised-error"
    assert diagnosis.line is not None and diagnosis.line.raw == assertion
    host = "python3: src/a.c:12: main: Assertion `n > 0' failed."
    assert diagnose_log(host.replace("python3: ", "")).failure == "unrecognised-error"


def test_throughput_stats_of_a_process_known_dead_are_not_ready() -> None:
    assert diagnose_log(V1_STATS, running=False).state != READY
    assert diagnose_log(V1_STATS, running=True).state == READY
