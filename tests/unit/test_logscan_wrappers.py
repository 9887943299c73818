"""Unit tests of opsbook.knowledge.logscan on the engine's wrappers of every release: the messages
vLLM logs
or raises when its engine died, rendered from the format strings named at each test (not copied
from logs). With the cause cut out of the excerpt, the wrapper is the diagnosis and its line is
reported; with the cause in the text, the cause is."""

from __future__ import annotations

import io
import logging
import runpy
from pathlib import Path

from opsbook.knowledge.logscan import FAILED, READY, diagnose_log


def _worker_record(process: str, message: str, cause: str) -> list[str]:
    prefix = f"({process}) ERROR 08-21 08:26:21 [worker_base.py:620] "
    return [
        prefix + message,
        prefix + "Traceback (most recent call last):",
        prefix + '  File "/venv/vllm/worker/worker_base.py", line 612, in execute_method',
        prefix + "    return run_method(self, method, args, kwargs)",
        prefix + cause,
    ]


def test_the_exception_of_a_workers_record_is_found_among_other_workers_lines() -> None:
    # vLLM 0.10.2-0.34.0 vllm/v1/executor/multiproc_executor.py: logger.exception("WorkerProc
    # hit an exception."); two workers' records interleave line by line.
    cause = "RuntimeError: shape '[16, 8]' is invalid for input of size 100"
    first = _worker_record("VllmWorker rank=0 pid=5", "WorkerProc hit an exception.", cause)
    second = _worker_record("VllmWorker rank=1 pid=6", "WorkerProc hit an exception.", "")[:4]
    interleaved = [line for pair in zip(second, first[:4], strict=True) for line in pair]
    text = "\n".join([*interleaved, first[4]])

    diagnosis = diagnose_log(text)

    assert diagnosis.failure == "unrecognised-error"
    assert diagnosis.line is not None and diagnosis.line.raw.endswith(cause)


def test_transformers_has_file_words_are_model_not_found_and_hub_gated() -> None:
    # transformers 5.19.0 src/transformers/utils/hub.py has_file, rendered.
    path_or_repo = "org/model"
    missing = (
        f"OSError: {path_or_repo} is not a local folder or a valid repository name on "
        "'https://hf.co'."
    )
    gated = (
        f"OSError: {path_or_repo} is a gated repository. Make sure to request access at "
        f"https://huggingface.co/{path_or_repo} and pass a token having permission to this repo "
        "either by logging in with `hf auth login` or by passing `token=<your_token>`."
    )

    assert diagnose_log(missing).failure == "model-not-found"
    assert diagnose_log(gated).failure == "hub-gated"


# A server that served (uvicorn lifespan/on.py "Application startup complete."; vLLM
# 0.10.2-0.34.0 vllm/v1/metrics/loggers.py "Engine %s: Avg prompt throughput: ..."), then got
# SIGTERM as vLLM 0.23.0-0.34.0 logs it (vllm/v1/engine/core.py "[shutdown] EngineCore: trigger
# received signal=%s"; launcher.py "[shutdown] API server: shutdown triggered"), its output loop
# raising vllm/v1/engine/exceptions.py's EngineDeadError(ENGINE_DEAD_MESSAGE) while torn down,
# then uvicorn's own shutdown (server.py "Shutting down"; lifespan/on.py "Waiting for
# application shutdown.", "Application shutdown complete."; "Finished server process [%d]").
_UP = (
    "(APIServer pid=31) INFO 08-01 21:00:00 [api_server.py:1] vLLM API server version 0.25.1\n"
    "(APIServer pid=31) INFO:     Started server process [31]\n"
    "(APIServer pid=31) INFO:     Waiting for application startup.\n"
    "(APIServer pid=31) INFO:     Application startup complete.\n"
    "(APIServer pid=31) INFO 08-01 21:30:00 [loggers.py:273] Engine 000: Avg prompt throughput: "
    "12.0 tokens/s, Avg generation throughput: 40.0 tokens/s, Running: 1 reqs, Waiting: 0 reqs\n"
)
_SIGNALLED = (
    "(EngineCore pid=32) INFO 08-01 21:34:51 [core.py:1214] [shutdown] EngineCore: trigger "
    "received signal=SIGTERM\n"
    "(APIServer pid=31) INFO 08-01 21:34:51 [launcher.py:100] [shutdown] API server: shutdown "
    "triggered\n"
)
_DEAD = (
    "(APIServer pid=31) ERROR 08-01 21:34:51 [async_llm.py:704] AsyncLLM output_handler "
    "failed.\n"
    "(APIServer pid=31) ERROR 08-01 21:34:51 [async_llm.py:704] Traceback (most recent call "
    "last):\n"
    '(APIServer pid=31) ERROR 08-01 21:34:51 [async_llm.py:704]   File "/v/core_client.py", '
    "line 1061, in get_output_async\n"
    "(APIServer pid=31) ERROR 08-01 21:34:51 [async_llm.py:704]     raise "
    "self._format_exception(outputs) from None\n"
    "(APIServer pid=31) ERROR 08-01 21:34:51 [async_llm.py:704] "
    "vllm.v1.engine.exceptions.EngineDeadError: EngineCore encountered an issue. See stack "
    "trace (above) for the root cause.\n"
)
_UVICORN_DOWN = (
    "(APIServer pid=31) INFO:     Shutting down\n"
    "(APIServer pid=31) INFO:     Waiting for application shutdown.\n"
    "(APIServer pid=31) INFO:     Application shutdown complete.\n"
    "(APIServer pid=31) INFO:     Finished server process [31]\n"
)


def test_a_ctrl_c_echoed_by_the_terminal_after_serving_makes_the_engines_death_the_stops() -> None:
    # The tty echoes Ctrl-C as "^C" (ECHOCTL) before the next record of a pasted session.
    dead = _DEAD.replace("(APIServer pid=31) ", "", 1)

    assert diagnose_log(_UP + "^C" + dead + _UVICORN_DOWN).state == READY
    assert diagnose_log(_UP + dead + _UVICORN_DOWN).failure == "engine-dead"


def test_an_nccl_error_while_a_signalled_server_tears_down_is_the_stops() -> None:
    # PyTorch torch/csrc/cuda/nccl.cpp throw_nccl_error: "NCCL Error " << status << ": " ...
    teardown = (
        "(EngineCore pid=32) ERROR 08-01 21:34:52 [core.py:1] RuntimeError: NCCL Error 5: "
        "invalid usage\n"
    )

    assert diagnose_log(_UP + _SIGNALLED + teardown + _UVICORN_DOWN).state == READY
    assert diagnose_log(_UP + teardown).failure == "nccl"


# vLLM 0.32.0 vllm/v1/core/sched/scheduler.py update_from_output: a bare assert.
SCHEDULER_ASSERT = """
def update_from_output(prompt_logprobs_tensors):
    assert not prompt_logprobs_tensors
"""


def _record_logged_by_a_plain_handler(tmp_path: Path) -> str:
    """The engine core's death record as a harness's own handler writes it (vLLM's handlers off
    with VLLM_CONFIGURE_LOGGING=0, vllm/envs.py): Python's logging.Formatter (CPython
    Lib/logging/__init__.py Formatter.format) puts the prefix on the message only and appends
    the traceback without one. Rendered here by logging itself, from a bare ``assert`` in a
    module of its own (pytest rewrites the asserts of test modules)."""
    source = tmp_path / "scheduler.py"
    source.write_text(SCHEDULER_ASSERT)
    update_from_output = runpy.run_path(str(source))["update_from_output"]
    stream = io.StringIO()
    handler = logging.StreamHandler(stream)
    handler.setFormatter(
        logging.Formatter(
            "(EngineCore_DP0 pid=9182) %(levelname)s %(asctime)s [core.py:720] %(message)s",
            datefmt="%m-%d %H:%M:%S",
        )
    )
    logger = logging.getLogger("opsbook.test.plain-handler")
    logger.propagate = False
    logger.addHandler(handler)
    try:
        try:
            update_from_output({"req-1": 0})
        except AssertionError:
            logger.exception("EngineCore encountered a fatal error.")
    finally:
        logger.removeHandler(handler)
    return stream.getvalue()


def test_a_death_records_traceback_without_prefixes_is_its_own(tmp_path: Path) -> None:
    text = _record_logged_by_a_plain_handler(tmp_path)
    assert "\nTraceback (most recent call last):\n" in text  # the traceback carries no prefix

    diagnosis = diagnose_log(text)

    assert (diagnosis.state, diagnosis.failure) == (FAILED, "unrecognised-error")
    assert diagnosis.line is not None
    assert diagnosis.line.raw.strip() == "assert not prompt_logprobs_tensors"


def test_a_pasted_traceback_with_elisions_under_a_death_record_is_its_own(tmp_path: Path) -> None:
    lines = _record_logged_by_a_plain_handler(tmp_path).splitlines()
    # A reporter's paste keeps the message, elides the traceback's header and some frames.
    header = next(i for i, line in enumerate(lines) if line.startswith("Traceback"))
    text = "\n".join([*lines[:header], "...", *lines[header + 1 :]])

    diagnosis = diagnose_log(text)

    assert diagnosis.line is not None
    assert diagnosis.line.raw.strip() == "assert not prompt_logprobs_tensors"
