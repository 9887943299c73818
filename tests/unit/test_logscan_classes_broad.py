"""Unit tests of opsbook.knowledge.logscan on wordings of whole classes of failure rather than of
one log:
other accelerators' allocators, other releases of torch's NCCL checks, NCCL's own warnings.
Each input is rendered from the format string named above it, with sample values."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from opsbook.knowledge.logscan import FAILED, HUNG, NO_CONCLUSION, diagnose_log

# Ascend/pytorch torch_npu/csrc/core/npu/NPUCachingAllocator.cpp: AT_ERROR("NPU out of memory.
# Tried to allocate ", format_size(alloc_size), " (NPU ", device, "; ", format_size(total),
# " total capacity; ", ... " already allocated; ", ... " current active; ", ... " free; ", ...
NPU_OOM = (
    "RuntimeError: NPU out of memory. Tried to allocate 20.00 MiB (NPU 3; 32.00 GiB total "
    "capacity; 30.10 GiB already allocated; 30.10 GiB current active; 5.25 MiB free; 31.00 GiB "
    "reserved in total by PyTorch)"
)


def test_the_npu_allocators_figures_are_parsed_like_cudas_older_form() -> None:
    numbers = diagnose_log(NPU_OOM + "\n").numbers

    assert numbers["tried_to_allocate"] == "20.00 MiB"
    assert (numbers["gpu"], numbers["capacity"], numbers["free"]) == (3, "32.00 GiB", "5.25 MiB")


# vLLM 0.10.2-0.32.0 vllm/v1/core/kv_cache_utils.py check_enough_kv_cache_memory, rendered, as
# the title of a pasted report whose excerpt is cut before the traceback ends.
KV_TITLE = (
    "# [Bug]: ValueError: To serve at least one request with the models's max seq len (32768), "
    "(4.00 GiB KV cache is needed, which is larger than the available KV cache memory (1.20 GiB)."
)
CUT_TRACEBACK = (
    "Traceback (most recent call last):\n"
    '  File "/usr/lib/python3.12/site-packages/vllm/entrypoints/llm.py", line 243, in __init__\n'
)


def test_a_reports_title_is_a_comment_never_read_as_the_log() -> None:
    diagnosis = diagnose_log(
        f"# source: an issue\n{KV_TITLE}\n\nThe reporter's words.\n{CUT_TRACEBACK}"
    )

    assert diagnosis.failure != "kv-cache-too-small"
    assert diagnosis.line is None or diagnosis.line.raw != KV_TITLE


# vLLM 0.10.2-0.34.0 vllm/v1/engine/utils.py wait_for_engine_startup: logger.debug("Waiting for
# %d local, %d remote core engine proc(s) to start.", ...) every STARTUP_POLL_PERIOD_MS.
WAIT = (
    "(APIServer pid=30) DEBUG 09-02 17:29:{s:02d} [utils.py:777] Waiting for 1 local, 0 remote "
    "core engine proc(s) to start."
)


def test_waits_for_the_engine_core_with_nothing_else_logged_are_a_hang() -> None:
    text = "\n".join(WAIT.format(s=s) for s in (6, 16, 26)) + "\n"
    diagnosis = diagnose_log(text)

    assert (diagnosis.state, diagnosis.failure) == (HUNG, "unrecognised-error")
    assert diagnosis.error_class == "engine-start-wait"


def test_two_waits_or_waits_between_the_engines_progress_are_no_hang() -> None:
    progress = "(EngineCore_DP0 pid=31) INFO 09-02 17:29:20 [gpu_model_runner.py:1] Loading model"
    short = [WAIT.format(s=6), WAIT.format(s=16)]
    mixed = [WAIT.format(s=6), WAIT.format(s=16), progress, WAIT.format(s=26)]

    for lines, prose in ((short, "\nIt stays here.\n"), (mixed, "\n")):
        diagnosis = diagnose_log("\n".join(lines) + prose)
        assert diagnosis.state == NO_CONCLUSION
        # Where it stopped: the last wait, not the first.
        assert diagnosis.line is not None and diagnosis.line.raw == lines[-1]


def test_words_in_prose_or_an_info_line_are_no_error() -> None:
    for text in (
        "The server ran out of memory last time, so I lowered the limit.",
        "INFO 01-01 00:00:00 [x.py:1] NCCL_P2P_DISABLE set; not gated",
    ):
        assert diagnose_log(text + "\n").state != FAILED, text


# vLLM's logger (vllm/logger.py's format "%(levelname)s %(asctime)s [%(filename)s:%(lineno)d]")
# of a handled exception, then the same process's startup going on to load weights.
HANDLED = [
    "(APIServer pid=9) INFO 05-01 10:00:00 [api_server.py:1] vLLM API server version 0.11.0",
    "(EngineCore_DP0 pid=7) ERROR 05-01 10:00:01 [registry.py:1] RuntimeError: optional "
    "kernels unavailable",
    "(EngineCore_DP0 pid=7) INFO 05-01 10:00:02 [cuda.py:1] Using FLASH_ATTN backend.",
    "(EngineCore_DP0 pid=7) INFO 05-01 10:00:03 [default_loader.py:1] Loading weights took 2 s",
]


def test_another_processs_progress_does_not_excuse_the_error() -> None:
    other = [
        line.replace("EngineCore_DP0 pid=7) INFO", "Worker_TP1 pid=8) INFO") for line in HANDLED
    ]

    assert diagnose_log("\n".join(other) + "\n").state == FAILED


def test_v0s_rpc_server_wrapper_walks_back_to_the_root_cause() -> None:
    # vLLM 0.5.5-0.6.x api_server.py's wrapper below the RPC server's own traceback.
    cause = "ValueError: Chunked prefill is not supported with multi-step"
    wrapper = (
        "ERROR 09-08 13:11:00 api_server.py:186] RPCServer process died before responding to "
        "readiness probe"
    )
    alone = diagnose_log(wrapper + "\n")
    under = diagnose_log(f"{cause}\n{wrapper}\n")

    assert alone.failure == "engine-dead"
    assert under.failure == "unrecognised-error"
    assert under.line is not None and under.line.raw == cause
    assert under.wrapper is not None and under.wrapper.raw == wrapper


# A server that came up and served, as vLLM's API server logs it through uvicorn (uvicorn
# server.py "Started server process [%d]", lifespan/on.py "Application startup complete.",
# h11_impl.py's access line '%s - "%s %s HTTP/%s" %d'), after vLLM's "non-default args: %s"
# (vllm/entrypoints/utils.py log_non_default_args).
SERVED = (
    "(APIServer pid=4242) INFO 09-26 23:38:10 [utils.py:326] non-default args: {'model_tag': "
    "'Qwen/Qwen3-8B', 'model': 'Qwen/Qwen3-8B', 'max_model_len': 4096, "
    "'gpu_memory_utilization': 0.5}\n"
    "(APIServer pid=4242) INFO 09-26 23:39:00 [launcher.py:44] Route: /metrics, Methods: GET\n"
    "(APIServer pid=4242) INFO:     Started server process [4242]\n"
    "(APIServer pid=4242) INFO:     Waiting for application startup.\n"
    "(APIServer pid=4242) INFO:     Application startup complete.\n"
    '(APIServer pid=4242) INFO:     127.0.0.1:60538 - "GET /health HTTP/1.1" 200 OK\n'
)


# The wordings above, as the shells and the interpreter installed here print them: a start
# script run by each shell (with a PATH that holds no vllm), and a job killed with SIGKILL.
INSTALLED_SHELLS = [shell for shell in ("bash", "dash", "zsh") if shutil.which(shell)]


def _printed(argv: list[str], tmp_path: Path, script: str) -> str:
    start = tmp_path / "serve.sh"
    start.write_text(script)
    env = {"PATH": str(tmp_path / "empty"), "HOME": str(tmp_path), "LANG": "C"}
    done = subprocess.run([*argv, str(start)], capture_output=True, text=True, env=env)
    return done.stdout + done.stderr


@pytest.mark.parametrize("shell", INSTALLED_SHELLS)
def test_an_installed_shell_that_finds_no_vllm_is_vllm_not_installed(
    shell: str, tmp_path: Path
) -> None:
    printed = _printed([shutil.which(shell) or shell], tmp_path, "vllm serve Qwen/Qwen3-8B\n")
    diagnosis = diagnose_log(f"{printed}")

    assert "vllm" in printed and diagnosis.error_class == "vllm-not-installed", printed
    assert diagnosis.line is not None and diagnosis.line.raw == printed.strip()


def test_the_installed_python_finding_no_vllm_is_vllm_not_installed(tmp_path: Path) -> None:
    done = subprocess.run(
        [sys.executable, "-I", "-m", "vllm.entrypoints.openai.api_server"],
        capture_output=True,
        text=True,
        cwd=tmp_path,
        env={"PYTHONPATH": str(tmp_path)},
    )
    if "No module named" not in done.stderr:
        pytest.skip("this interpreter has vllm")
    assert diagnose_log(done.stderr).error_class == "vllm-not-installed", done.stderr


@pytest.mark.skipif(not shutil.which("bash"), reason="no bash here")
def test_bashs_own_line_for_a_server_killed_after_it_served_is_not_ready(tmp_path: Path) -> None:
    # A stand-in for the server (sleep), killed with SIGKILL as the OOM killer would.
    printed = _printed(
        [shutil.which("bash") or "bash"], tmp_path, "/bin/sleep 30 &\nkill -9 $!\nwait\n"
    )
    diagnosis = diagnose_log(f"{SERVED}{printed}")

    assert "Killed" in printed and diagnosis.failure == "host-oom-killer", printed
    assert diagnosis.line is not None and "Killed" in diagnosis.line.raw


def _pydantic_validation_error(field_value: object | None) -> str:
    """The text of a ValidationError as the installed pydantic renders it, for a config class
    built as vLLM builds its own (pydantic dataclasses from vLLM 0.10 on)."""
    from pydantic import ValidationError, model_validator
    from pydantic.dataclasses import dataclass

    @dataclass
    class ModelConfig:
        max_model_len: int = 1

        @model_validator(mode="after")
        def refuse(self) -> ModelConfig:
            raise ValueError("No model architectures are specified")

    try:
        ModelConfig() if field_value is None else ModelConfig(max_model_len=field_value)  # type: ignore[arg-type]
    except ValidationError as error:
        return f"pydantic_core._pydantic_core.ValidationError: {error}"
    raise AssertionError("pydantic accepted the config")


@pytest.mark.parametrize(
    ("field_value", "detail"),
    [(None, "Value error, No model architectures"), ("abc", "Input should be a valid integer")],
    ids=["model-validator", "field"],
)
def test_pydantics_validation_error_reports_its_detail_line(
    field_value: object | None, detail: str
) -> None:
    rendered = _pydantic_validation_error(field_value)
    prefix = "(APIServer pid=835) "
    text = "\n".join(
        [
            prefix + "Traceback (most recent call last):",
            prefix + '  File "/venv/vllm/engine/arg_utils.py", line 1360, in create_model_config',
            prefix + "    return ModelConfig(",
            *(prefix + line for line in rendered.splitlines()),
        ]
    )

    diagnosis = diagnose_log(text + "\n")

    assert (diagnosis.state, diagnosis.failure) == (FAILED, "unrecognised-error")
    assert diagnosis.line is not None and detail in diagnosis.line.text
    assert "[type=" in diagnosis.line.text


# vLLM 0.34.0 vllm/distributed/device_communicators/shm_broadcast.py LONG_WAIT_TIME_LOG_MSG,
# logged at INFO every VLLM_RINGBUFFER_WARNING_INTERVAL (60) seconds while a side waits.
BROADCAST_WAIT = (
    "(EngineCore_DP0 pid=4100) INFO 07-01 10:00:{s:02d} [shm_broadcast.py:466] No available "
    "shared memory broadcast block found in 60 seconds. This typically happens when some "
    "processes are hanging or doing some time-consuming work (e.g. compilation, weight/kv cache "
    "quantization)."
)


def test_the_broadcast_queues_wait_at_the_end_is_a_hang_not_a_small_dev_shm() -> None:
    text = "\n".join(BROADCAST_WAIT.format(s=s) for s in (1, 2, 3, 4)) + "\n"

    diagnosis = diagnose_log(text)

    assert (diagnosis.state, diagnosis.failure) == (HUNG, "shm")
    assert "hung" in diagnosis.remedy and "--shm-size" not in diagnosis.remedy
