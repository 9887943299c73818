"""Unit tests of opsbook.knowledge.logscan on wordings of whole classes of failure rather than of
one log:
other accelerators' allocators, other releases of torch's NCCL checks, NCCL's own warnings.
Each input is rendered from the format string named above it, with sample values."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from opsbook.knowledge.logscan import FAILED, HUNG, LOADING, NO_CONCLUSION, READY, diagnose_log

# Ascend/pytorch torch_npu/csrc/core/npu/NPUCachingAllocator.cpp: AT_ERROR("NPU out of memory.
# Tried to allocate ", format_size(alloc_size), " (NPU ", device, "; ", format_size(total),
# " total capacity; ", ... " already allocated; ", ... " current active; ", ... " free; ", ...
NPU_OOM = (
    "RuntimeError: NPU out of memory. Tried to allocate 20.00 MiB (NPU 3; 32.00 GiB total "
    "capacity; 30.10 GiB already allocated; 30.10 GiB current active; 5.25 MiB free; 31.00 GiB "
    "reserved in total by PyTorch)"
)
# PyTorch c10/xpu/XPUCachingAllocator.cpp: "XPU out of memory. Tried to allocate ",
# format_size(alloc_size), ". GPU ", device, " has a total capacity of ", ...
XPU_OOM = (
    "torch.OutOfMemoryError: XPU out of memory. Tried to allocate 1.00 GiB. GPU 0 has a total "
    "capacity of 15.11 GiB of which 200.00 MiB is free."
)
# PyTorch aten/src/ATen/mps/MPSAllocator.mm: "MPS backend out of memory (MPS allocated: ",
# format_size(...), ", other allocations: ", ..., ", max allowed: ", ...
MPS_OOM = (
    "RuntimeError: MPS backend out of memory (MPS allocated: 17.00 GiB, other allocations: "
    "1.20 GiB, max allowed: 18.13 GiB). Tried to allocate 256.00 MiB on private pool."
)
# PyTorch torch/csrc/cuda/nccl.cpp throw_nccl_error: "NCCL Error " << status << ": " <<
# ncclGetErrorString(status) (ncclGetErrorString of ncclSystemError is "unhandled system error").
TORCH_NCCL_ERROR = "RuntimeError: NCCL Error 5: invalid usage"


@pytest.mark.parametrize("rendered", [NPU_OOM, XPU_OOM, MPS_OOM], ids=["npu", "xpu", "mps"])
def test_another_accelerators_allocator_running_out_is_oom(rendered: str) -> None:
    diagnosis = diagnose_log(f"INFO 03-05 07:15:30 worker.py:1] Loading model\n{rendered}\n")

    assert (diagnosis.state, diagnosis.failure) == (FAILED, "oom")
    assert diagnosis.line is not None and rendered in diagnosis.line.raw


def test_the_npu_allocators_figures_are_parsed_like_cudas_older_form() -> None:
    numbers = diagnose_log(NPU_OOM + "\n").numbers

    assert numbers["tried_to_allocate"] == "20.00 MiB"
    assert (numbers["gpu"], numbers["capacity"], numbers["free"]) == (3, "32.00 GiB", "5.25 MiB")


def test_torchs_numbered_nccl_error_is_nccl() -> None:
    diagnosis = diagnose_log(TORCH_NCCL_ERROR + "\n")

    assert diagnosis.failure == "nccl"
    assert diagnosis.numbers.get("nccl_error") == "invalid usage"


# NVIDIA/nccl src/ras/client_support.cc: WARN("Call to bind failed: %s", strerror(errno)), with
# the WARN prefix of src/include/debug.h ("%s:%d:%d [%d] %s:%d NCCL WARN ").
NCCL_RAS_BIND = (
    "host1:2528104:2528104 [1] ras/client_support.cc:160 NCCL WARN Call to bind failed: "
    "Address already in use"
)


def test_ncclss_own_bind_warning_is_nccl_not_a_taken_server_port() -> None:
    diagnosis = diagnose_log(NCCL_RAS_BIND + "\nhost1:2528104:2528104 [1] NCCL INFO Init done\n")

    assert diagnosis.failure == "nccl"
    assert diagnosis.line is not None and "NCCL WARN Call to bind failed" in diagnosis.line.raw


def test_a_taken_server_port_is_still_port_in_use() -> None:
    # python/cpython Lib/asyncio/base_events.py create_server, as uvicorn logs it.
    text = (
        "ERROR:    [Errno 98] error while attempting to bind on address ('0.0.0.0', 8000): "
        "address already in use\n"
    )
    assert diagnose_log(text).failure == "port-in-use"


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


def test_the_body_is_diagnosed_under_a_title() -> None:
    # vLLM 0.10.2-0.33.0 vllm/config/device.py: "Failed to infer device type".
    body = "RuntimeError: Failed to infer device type\n"
    diagnosis = diagnose_log(f"{KV_TITLE}\n{body}")

    assert diagnosis.failure == "no-device"
    assert diagnosis.line is not None and diagnosis.line.raw == body.strip()


# vLLM 0.11.2 vllm/entrypoints/launcher.py serve_http: logger.info("Available routes are:"),
# then logger.info("Route: %s, Methods: %s", path, ", ".join(methods)) per route, then uvicorn.
ROUTES = [
    "(APIServer pid=9) INFO 10-24 13:23:36 [launcher.py:46] Route: /v1/models, Methods: GET",
    "(APIServer pid=9) INFO 10-24 13:23:36 [launcher.py:46] Route: /health, Methods: GET",
]


def test_an_excerpt_of_the_route_list_alone_is_ready() -> None:
    cut = "(APIServer pid=9) INFO 10-24 13:23:36 [launcher.py:46] Route: /"
    diagnosis = diagnose_log("\n".join([*ROUTES, cut]) + "\n")

    assert diagnosis.state == READY
    # The line the excerpt cut names no route: the last whole one is reported.
    assert diagnosis.line is not None and diagnosis.line.raw == ROUTES[-1]


def test_a_route_list_followed_by_an_error_is_not_ready() -> None:
    text = "\n".join([*ROUTES, "ERROR 10-24 13:23:37 [api_server.py:1] RuntimeError: boom"])

    assert diagnose_log(text + "\n").state == FAILED


def test_vllm_0_1s_own_head_size_check_is_head_size_unsupported() -> None:
    # vLLM 0.1.x vllm/model_executor/layers/attention.py PagedAttention.__init__, rendered.
    text = (
        "ValueError: head_size (100) is not supported. Supported head sizes: [64, 80, 96, 128].\n"
    )
    diagnosis = diagnose_log(text)

    assert diagnosis.failure == "head-size-unsupported"
    assert diagnosis.numbers.get("head_size") == 100


# vLLM 0.10.2-0.34.0 vllm/v1/engine/async_llm.py output_handler: logger.exception("AsyncLLM
# output_handler failed.") of the EngineDeadError (vllm/v1/engine/exceptions.py) that
# core_client.py raises: one record, every line with the same level, time and process.
DEAD_RECORD = [
    "ERROR 08-15 17:38:13 [async_llm.py:416] AsyncLLM output_handler failed.",
    "ERROR 08-15 17:38:13 [async_llm.py:416] Traceback (most recent call last):",
    'ERROR 08-15 17:38:13 [async_llm.py:416]   File "/x/vllm/v1/engine/async_llm.py", line 375, in '
    "output_handler",
    "ERROR 08-15 17:38:13 [async_llm.py:416]     outputs = await engine_core.get_output_async()",
    "ERROR 08-15 17:38:13 [async_llm.py:416] vllm.v1.engine.exceptions.EngineDeadError: EngineCore "
    "encountered an issue. See stack trace (above) for the root cause.",
]


def test_the_handlers_message_above_a_dead_engines_traceback_is_not_its_root_cause() -> None:
    diagnosis = diagnose_log("\n".join(DEAD_RECORD) + "\n")

    assert diagnosis.failure == "engine-dead"
    assert diagnosis.line is not None and "EngineDeadError" in diagnosis.line.raw


def test_an_error_of_the_engine_above_that_record_is_still_the_root_cause() -> None:
    engine = "(EngineCore_DP0 pid=7) ERROR 08-15 17:38:12 [core.py:1] RuntimeError: boom"
    diagnosis = diagnose_log("\n".join([engine, *DEAD_RECORD]) + "\n")

    assert diagnosis.failure == "unrecognised-error"
    assert diagnosis.line is not None and diagnosis.line.raw == engine


# A launcher that logs its own error, then starts vLLM (vLLM's first lines: vllm/platforms
# __init__.py "Automatically detected platform %s.", api_server.py "vLLM API server version").
# transformers 4.x configuration_auto.py: "The checkpoint you are trying to load has model type
# `%s` but Transformers does not recognize this architecture."
LAUNCHER_ERROR = (
    "2025-11-01 17:35:57.955760+08:00 - launcher.backends - ERROR - Failed to derive the "
    "context length: The checkpoint you are trying to load has model type `x_vl` but "
    "Transformers does not recognize this architecture."
)
VLLM_START = [
    "INFO 11-01 17:36:01 [__init__.py:216] Automatically detected platform cuda.",
    "(APIServer pid=1951) INFO 11-01 17:36:05 [api_server.py:1839] vLLM API server version 0.11.0",
    "(APIServer pid=1951) INFO 11-01 17:36:05 [utils.py:233] non-default args: {'model': 'm'}",
]


def test_a_launchers_error_before_vllm_starts_did_not_stop_the_launch() -> None:
    diagnosis = diagnose_log("\n".join([LAUNCHER_ERROR, *VLLM_START]) + "\n")

    assert diagnosis.state != FAILED
    assert diagnosis.line is not None and "non-default args" in diagnosis.line.raw


def test_the_same_error_with_no_vllm_start_after_it_is_the_failure() -> None:
    diagnosis = diagnose_log(LAUNCHER_ERROR + "\n")

    assert diagnosis.state == FAILED
    assert diagnosis.line is not None and diagnosis.line.raw == LAUNCHER_ERROR


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


# vLLM 0.10.2 vllm/distributed/device_communicators/pynccl.py: logger.info("vLLM is using
# nccl==%s", ...) as the communicator is made, then its warm-up all-reduce.
NCCL_SETUP = [
    "INFO 07-22 07:59:47 [parallel_state.py:1] world_size=2 rank=0 backend=nccl",
    "(Worker_TP0 pid=5) INFO 07-22 07:59:48 [pynccl.py:69] vLLM is using nccl==2.21.5",
    "(Worker_TP1 pid=6) INFO 07-22 07:59:48 [pynccl.py:69] vLLM is using nccl==2.21.5",
]


def test_a_log_that_stops_in_ncclss_set_up_is_a_hang_in_nccl() -> None:
    diagnosis = diagnose_log("\n".join(NCCL_SETUP) + "\n")

    assert (diagnosis.state, diagnosis.failure) == (HUNG, "nccl")
    assert diagnosis.line is not None and diagnosis.line.raw == NCCL_SETUP[-1]


def test_a_process_known_alive_in_ncclss_set_up_is_still_loading() -> None:
    assert diagnose_log("\n".join(NCCL_SETUP) + "\n", running=True).state == LOADING


# The fallbacks by the error's words: exception lines in wordings no specific entry knows,
# each rendered from the format string or error text named beside it.
@pytest.mark.parametrize(
    ("rendered", "failure", "error_class"),
    [
        # ROCm HIP hipGetErrorString(hipErrorOutOfMemory), as torch.cuda raises it on ROCm.
        ("RuntimeError: HIP error: out of memory", "oom", None),
        # A plugin's own sentence around the runtime's words (any "<Name>Error: ... out of
        # memory" form).
        ("RuntimeError: allocate KV blocks failed: device out of memory", "oom", "oom-worded"),
        # PyTorch torch/csrc/distributed/c10d/ProcessGroupNCCL.cpp, a communicator error.
        (
            "torch.distributed.DistBackendError: [1] is setting up NCCL communicator and "
            "retrieving ncclUniqueId from [0] via c10d key-value store by key '0', but store->"
            "get('0') got error: Connection reset by peer",
            "nccl",
            "nccl-worded",
        ),
        # requests' HTTPError ("%s Client Error: %s for url: %s") with RFC 9110's phrase.
        (
            "requests.exceptions.HTTPError: 403 Client Error: Forbidden for url: "
            "https://huggingface.co/org/model/resolve/main/config.json",
            "hub-gated",
            None,
        ),
        (
            "OSError: org/model is gated: visit https://huggingface.co/org/model to ask for "
            "access.",
            "hub-gated",
            "hub-auth-worded",
        ),
    ],
)
def test_an_error_worded_as_no_entry_is_classed_by_its_words(
    rendered: str, failure: str, error_class: str | None
) -> None:
    diagnosis = diagnose_log(rendered + "\n")

    assert (diagnosis.failure, diagnosis.error_class) == (failure, error_class), str(diagnosis)
    assert diagnosis.line is not None and diagnosis.line.raw == rendered


def test_words_in_prose_or_an_info_line_are_no_error() -> None:
    for text in (
        "The server ran out of memory last time, so I lowered the limit.",
        "INFO 01-01 00:00:00 [x.py:1] NCCL_P2P_DISABLE set; not gated",
    ):
        assert diagnose_log(text + "\n").state != FAILED, text


def test_a_specific_entry_wins_over_the_words_on_another_line() -> None:
    # vLLM 0.10.2 vllm/v1/core/kv_cache_utils.py, then an OOM in a wrapper's own words.
    kv = "ValueError: No available memory for the cache blocks. Try increasing memory."
    oom = "RuntimeError: worker 1 failed: device out of memory"

    assert diagnose_log(f"{oom}\n{kv}\n").failure == "kv-cache-too-small"


def test_a_bare_assertion_error_reports_the_failed_assert_statement() -> None:
    # CPython prints an assert without a message as the bare name under its traceback.
    text = (
        "Traceback (most recent call last):\n"
        '  File "/x/vllm/model_executor/layers/vocab_parallel_embedding.py", line 375, in w\n'
        "    assert loaded_weight.shape[output_dim] == self.org_vocab_size\n"
        "AssertionError\n"
    )
    diagnosis = diagnose_log(text)

    assert diagnosis.failure == "unrecognised-error"
    assert diagnosis.line is not None
    assert (
        diagnosis.line.raw.strip()
        == "assert loaded_weight.shape[output_dim] == self.org_vocab_size"
    )


def test_ncclss_last_error_detail_is_the_line_reported() -> None:
    # vLLM 0.34.0 pynccl_wrapper.py NCCL_CHECK: f"NCCL error: {error_str}\nLast error:\n{last}",
    # with ncclGetErrorString(ncclRemoteError) and a proxy's connect failure as ncclGetLastError.
    detail = "Proxy Call to rank 3 failed (Connect)"
    error = "RuntimeError: NCCL error: remote process exited or there was a network error"
    text = f"{error}\nLast error:\n{detail}\n"
    diagnosis = diagnose_log(text)

    assert diagnosis.failure == "nccl"
    assert diagnosis.line is not None and diagnosis.line.raw == detail


@pytest.mark.parametrize(
    "rendered",
    [
        # vLLM 0.10.2 vllm/executor/multiproc_worker_utils.py ProcessWatchdog.
        "ERROR 03-31 15:45:01 multiproc_worker_utils.py:120] Worker VllmWorkerProcess pid "
        "1867860 died, exit code: -9",
        # vLLM 0.34.0 vllm/v1/executor/multiproc_executor.py.
        "(EngineCore_DP0 pid=7) ERROR 05-01 10:00:00 [multiproc_executor.py:1] Worker proc "
        "VllmWorker-1 died unexpectedly (exit code: -9), shutting down executor.",
    ],
    ids=["v0", "v1"],
)
def test_a_worker_killed_with_sigkill_points_at_the_oom_killer(rendered: str) -> None:
    # The API server's wrapper below it (vLLM 0.10.2-0.34.0 vllm/v1/engine/exceptions.py).
    wrapper = "vllm.v1.engine.exceptions.EngineDeadError: EngineCore encountered an issue."
    diagnosis = diagnose_log(f"{rendered}\n{wrapper}\n")

    assert (diagnosis.failure, diagnosis.error_class) == ("host-oom-killer", "worker-sigkilled")
    assert diagnosis.line is not None and diagnosis.line.raw == rendered


def test_a_worker_that_exited_with_an_error_code_is_not_the_oom_killers() -> None:
    text = "ERROR 03-31 15:45:01 multiproc_worker_utils.py:120] Worker X pid 5 died, exit code: 1\n"

    assert diagnose_log(text).failure != "host-oom-killer"


def test_an_ascend_cann_error_code_line_is_an_error_line() -> None:
    # The CANN error code form (E, the module, four digits) with its message, as torch_npu
    # prints it; the rank prefix is torchrun's.
    code = "[rank1]: EZ9999: Inner Error!"
    text = f"INFO 09-24 20:59:40 [worker.py:1] Loading weights\n{code}\n"
    diagnosis = diagnose_log(text)

    assert diagnosis.failure == "unrecognised-error"
    assert diagnosis.line is not None and diagnosis.line.raw == code


def test_a_journald_prefix_with_a_localised_month_is_read() -> None:
    # journalctl's short format: strftime("%b %d %H:%M:%S") in the host's LC_TIME, the host,
    # the unit and its PID; vLLM 0.10.2-0.34.0 vllm/v1/engine/core.py's own line behind it.
    line = (
        "авг 18 14:15:04 llm python3[28059]: (EngineCore pid=28059) WARNING 08-18 14:15:04 "
        "[model.py:1508] Default sampling parameters have been overridden"
    )
    diagnosis = diagnose_log(f"{line}\n")

    assert diagnosis.state == NO_CONCLUSION
    assert diagnosis.line is not None and diagnosis.line.raw == line
    assert diagnosis.line.level == "WARNING" and diagnosis.line.process == "EngineCore pid=28059"


# vLLM's logger (vllm/logger.py's format "%(levelname)s %(asctime)s [%(filename)s:%(lineno)d]")
# of a handled exception, then the same process's startup going on to load weights.
HANDLED = [
    "(APIServer pid=9) INFO 05-01 10:00:00 [api_server.py:1] vLLM API server version 0.11.0",
    "(EngineCore_DP0 pid=7) ERROR 05-01 10:00:01 [registry.py:1] RuntimeError: optional "
    "kernels unavailable",
    "(EngineCore_DP0 pid=7) INFO 05-01 10:00:02 [cuda.py:1] Using FLASH_ATTN backend.",
    "(EngineCore_DP0 pid=7) INFO 05-01 10:00:03 [default_loader.py:1] Loading weights took 2 s",
]


def test_an_uncatalogued_error_the_same_process_went_past_was_not_fatal() -> None:
    diagnosis = diagnose_log("\n".join(HANDLED) + "\n")

    assert diagnosis.state == NO_CONCLUSION
    assert diagnosis.line is not None and "Loading weights took" in diagnosis.line.raw


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


@pytest.mark.parametrize(
    "rendered",
    [
        # Habana's PyTorch bridge (Gaudi), as HabanaAI's READMEs quote it.
        "RuntimeError: [Rank:0] FATAL ERROR :: MODULE:PT_DEVMEM Allocation failed for "
        "size::939524096 (896)MB",
        # oneAPI Unified Runtime's result name, as SYCL's exception message carries it.
        "RuntimeError: level_zero backend failed with error: 39 "
        "(UR_RESULT_ERROR_OUT_OF_DEVICE_MEMORY)",
    ],
    ids=["hpu", "xpu-ur"],
)
def test_gaudis_and_level_zeros_allocation_failures_are_oom(rendered: str) -> None:
    diagnosis = diagnose_log(rendered + "\n")

    assert (diagnosis.failure, diagnosis.error_class) == ("oom", None)


# vLLM 0.10.2-0.34.0 vllm/v1/engine/core.py run_engine_core: logger.exception("EngineCore
# encountered a fatal error."), every traceback line in the same record; the API server's
# EngineDeadError (vllm/v1/engine/exceptions.py) below it.
FATAL_RECORD = [
    "(EngineCore_DP0 pid=7) ERROR 08-15 17:38:10 [core.py:700] EngineCore encountered a fatal "
    "error.",
    "(EngineCore_DP0 pid=7) ERROR 08-15 17:38:10 [core.py:700] Traceback (most recent call last):",
    '(EngineCore_DP0 pid=7) ERROR 08-15 17:38:10 [core.py:700]   File "/x/core.py", line 1, in run',
    "(EngineCore_DP0 pid=7) ERROR 08-15 17:38:10 [core.py:700]     self.step()",
    "(EngineCore_DP0 pid=7) ERROR 08-15 17:38:10 [core.py:700] RuntimeError: frobnication failed",
    "(APIServer pid=9) ERROR 08-15 17:38:13 [async_llm.py:416] vllm.v1.engine.exceptions."
    "EngineDeadError: EngineCore encountered an issue. See stack trace (above) for the root cause.",
]


def test_the_root_cause_under_a_handlers_fatal_error_message_is_its_exception() -> None:
    diagnosis = diagnose_log("\n".join(FATAL_RECORD) + "\n")

    assert diagnosis.failure == "unrecognised-error"
    assert diagnosis.line is not None and diagnosis.line.raw == FATAL_RECORD[4]
    assert diagnosis.wrapper is not None and diagnosis.wrapper.raw == FATAL_RECORD[5]


def test_a_log_that_stops_in_ncclss_own_info_lines_is_a_hang_in_nccl() -> None:
    # NVIDIA/nccl src/include/debug.h INFO prefix ("%s:%d:%d [%d] NCCL INFO "), with
    # NCCL_DEBUG=INFO: the channels being connected, then nothing.
    lines = [
        "INFO 06-05 10:45:10 [parallel_state.py:1] world_size=2 rank=1 backend=nccl",
        "host1:2528104:2528104 [1] NCCL INFO Channel 00 : 1[1] -> 0[0] via SHM/direct/direct",
        "host1:2528104:2528104 [1] NCCL INFO Connected all rings",
    ]
    diagnosis = diagnose_log("\n".join(lines) + "\n")

    assert (diagnosis.state, diagnosis.failure) == (HUNG, "nccl")
    assert diagnosis.line is not None and diagnosis.line.raw == lines[-1]


def test_a_lone_engine_wrapper_under_a_title_is_the_wrapper() -> None:
    # vLLM 0.10.2-0.34.0 vllm/v1/engine/utils.py wait_for_engine_startup's wrapper, alone.
    wrapper = (
        "RuntimeError: Engine core initialization failed. See root cause above. Failed core "
        "proc(s): {}"
    )
    diagnosis = diagnose_log(f"{KV_TITLE}\n{wrapper}\n")

    assert diagnosis.failure == "engine-dead"
    assert diagnosis.line is not None and diagnosis.line.raw == wrapper


def test_a_refused_fetch_of_another_address_is_not_the_hub() -> None:
    text = (
        "requests.exceptions.HTTPError: 403 Client Error: Forbidden for url: "
        "https://example.com/cat.png\n"
    )
    assert diagnose_log(text).failure != "hub-gated"


@pytest.mark.parametrize(
    ("text", "key"),
    [
        # libstdc++ vterminate.cc: the C++ exception's type, then its what() message.
        (
            "terminate called after throwing an instance of 'c10::Error'\n"
            "  what():  CUDA error: unspecified launch failure\n",
            "what():  CUDA error: unspecified launch failure",
        ),
        # CPython pylifecycle.c / faulthandler.c.
        ("Fatal Python error: Segmentation fault\n", "Fatal Python error: Segmentation fault"),
        # bash's report of the child's signal.
        (
            "INFO 01-01 00:00:00 [gpu_model_runner.py:1] Loading model\n"
            "Segmentation fault (core dumped)\n",
            "Segmentation fault (core dumped)",
        ),
    ],
    ids=["terminate", "fatal-python", "shell-segfault"],
)
def test_a_crash_below_python_is_an_error_with_its_statement(text: str, key: str) -> None:
    diagnosis = diagnose_log(text)

    assert (diagnosis.state, diagnosis.failure) == (FAILED, "unrecognised-error")
    assert diagnosis.line is not None and key in diagnosis.line.raw


def test_words_that_only_begin_like_a_signal_report_are_no_error() -> None:
    assert diagnose_log("Aborted by the user, restarting later\n").state != FAILED


# PyTorch aten/src/ATen/cuda/Exceptions.h TORCH_CUDABLAS_CHECK / TORCH_CUSOLVER_CHECK /
# TORCH_CUSPARSE_CHECK: "CUDA error: ", the status name, " when calling `" #EXPR "`"; cuDNN's and
# hipBLAS's status names of the same failure.
LIBRARY_ALLOC_FAILED = (
    "RuntimeError: CUDA error: CUBLAS_STATUS_ALLOC_FAILED when calling `cublasCreate(handle)`",
    "RuntimeError: CUDA error: CUSOLVER_STATUS_ALLOC_FAILED when calling "
    "`cusolverDnCreate(handle)`",
    "RuntimeError: CUDA error: CUSPARSE_STATUS_ALLOC_FAILED when calling `cusparseCreate(handle)`",
    "RuntimeError: cuDNN error: CUDNN_STATUS_ALLOC_FAILED",
    "RuntimeError: HIP error: HIPBLAS_STATUS_ALLOC_FAILED when calling `hipblasCreate(handle)`",
)


@pytest.mark.parametrize("rendered", LIBRARY_ALLOC_FAILED)
def test_a_math_librarys_allocation_failure_is_oom(rendered: str) -> None:
    diagnosis = diagnose_log(f"INFO 03-05 07:15:30 worker.py:1] Loading model\n{rendered}\n")

    assert (diagnosis.state, diagnosis.failure) == (FAILED, "oom")
    assert diagnosis.line is not None and diagnosis.line.text == rendered


# openxla/xla absl::ResourceExhaustedError of the TPU runtime and PJRT, as torch_xla raises it
# ("Bad StatusOr access: " + the status): "Attempting to reserve %s at the bottom of memory.
# That was not possible.", "Error allocating device buffer: Attempting to allocate %s. That was
# not possible.", the compiler's "Ran out of memory in memory space hbm".
XLA_EXHAUSTED = (
    "RuntimeError: Bad StatusOr access: RESOURCE_EXHAUSTED: Error loading program: Attempting "
    "to reserve 2.10G at the bottom of memory. That was not possible. There are 1.00G free.",
    "RuntimeError: RESOURCE_EXHAUSTED: Error allocating device buffer: Attempting to allocate "
    "512.00M. That was not possible. There are 100.00M free.",
    "RuntimeError: Bad StatusOr access: RESOURCE_EXHAUSTED: XLA:TPU compile permanent error. "
    "Ran out of memory in memory space hbm. Used 17.50G of 15.75G hbm.",
)


@pytest.mark.parametrize("rendered", XLA_EXHAUSTED)
def test_xlas_exhausted_device_memory_is_oom(rendered: str) -> None:
    diagnosis = diagnose_log(f"{rendered}\nTraceback (most recent call last):\n")

    assert (diagnosis.state, diagnosis.failure) == (FAILED, "oom")
    assert diagnosis.line is not None and diagnosis.line.text == rendered


def test_an_exhausted_resource_other_than_memory_is_no_oom() -> None:
    # gRPC's RESOURCE_EXHAUSTED for a message over the size limit (Ray's object transfers).
    text = "RuntimeError: RESOURCE_EXHAUSTED: Received message larger than max (5000 vs. 4194304)\n"

    assert diagnose_log(text).failure != "oom"


# vLLM 0.10.2-0.13.0 vllm/v1/worker/gpu_worker.py: "Available KV cache memory: %.2f GiB";
# 0.14.1-0.34.0 "Available KV cache memory: %s GiB" (format_gib).
@pytest.mark.parametrize("value", ["-0.53", "-12.0", "-3"])
def test_a_negative_kv_cache_budget_under_a_failed_start_is_kv_cache_too_small(value: str) -> None:
    prefix = "(EngineCore_DP0 pid=7)"
    budget = (
        f"{prefix} INFO 01-02 03:04:05 [gpu_worker.py:1] Available KV cache memory: {value} GiB"
    )
    text = f"{budget}\n{prefix} ERROR 01-02 03:04:05 [core.py:1] EngineCore failed to start.\n"

    diagnosis = diagnose_log(text)

    assert (diagnosis.state, diagnosis.failure) == (FAILED, "kv-cache-too-small")
    assert diagnosis.line is not None and diagnosis.line.raw == budget


def test_a_positive_kv_cache_budget_is_no_failure() -> None:
    text = (
        "(EngineCore_DP0 pid=7) INFO 01-02 03:04:05 [gpu_worker.py:1] Available KV cache memory: "
        "20.53 GiB\n(APIServer pid=1) INFO 01-02 03:04:09 [launcher.py:1] Application startup "
        "complete.\n"
    )

    assert diagnose_log(text).failure is None


# PyTorch torch/csrc/distributed/c10d/ProcessGroupNCCL.cpp HeartbeatMonitor: logPrefix() "[PG %s
# Rank %d] ", "Heartbeat monitor timed out! Process will be terminated after dumping debug
# info. workMetaList_.size()=%d", then "ProcessGroupNCCL's watchdog got stuck for %d seconds
# without making progress in monitoring enqueued collectives. ..." (XCCL and the other
# backends built on it with their own name).
@pytest.mark.parametrize("backend", ["NCCL", "XCCL"])
def test_a_stuck_watchdog_is_an_nccl_timeout_of_its_rank(backend: str) -> None:
    stuck = (
        f"[rank3]:[F ProcessGroup{backend}.cpp:1] [PG 0 Rank 3] ProcessGroup{backend}'s watchdog "
        "got stuck for 480 seconds without making progress in monitoring enqueued collectives."
    )
    text = (
        "[rank3]:[E ProcessGroupNCCL.cpp:1] [PG 0 Rank 3] Heartbeat monitor timed out! Process "
        "will be terminated after dumping debug info. workMetaList_.size()=4\n" + stuck + "\n"
    )

    diagnosis = diagnose_log(text)

    assert (diagnosis.state, diagnosis.failure) == (FAILED, "nccl-timeout")
    assert diagnosis.line is not None and diagnosis.line.raw == stuck
    assert diagnosis.numbers.get("rank") == 3


# ray-project/ray python/ray/serve/_private/deployment_state.py: f"Deployment '{name}' in
# application '{app}' {n} replicas that have taken more than {SLOW_STARTUP_WARNING_S}s to be
# scheduled. ... Resources required for each replica: {required}, total resources available:
# {available}. Use `ray status` for more details." (later: f"Deployment '{name}'{app_msg} has
# {n} replicas ..."), logged as text or as Ray Serve's JSON records.
SERVE_UNSCHEDULED = (
    "Deployment 'LLMServer:m' in application 'llms' 2 replicas that have taken more than 30s to "
    "be scheduled. This may be due to waiting for the cluster to auto-scale or for a runtime "
    'environment to be installed. Resources required for each replica: [{"CPU": 1.0, "GPU": '
    "1.0}], total resources available: {}. Use `ray status` for more details.",
    "Deployment 'LLMServer:m' in application 'llms' has 1 replicas that have taken more than "
    "30s to be scheduled. This may be due to waiting for the cluster to auto-scale or for a "
    'runtime environment to be installed. Resources required for each replica: [{"GPU": 4.0}], '
    "total resources available: {}. Use `ray status` for more details.",
)


@pytest.mark.parametrize("message", SERVE_UNSCHEDULED)
@pytest.mark.parametrize("form", ["text", "json"])
def test_a_serve_replica_left_unscheduled_is_a_hang_in_ray_resources(
    message: str, form: str
) -> None:
    if form == "json":
        line = json.dumps(
            {"levelname": "WARNING", "component_name": "controller", "message": message}
        )
    else:
        line = f"WARNING 2024-03-24 03:17:59,398 controller 1684 deployment_state.py:1 - {message}"

    diagnosis = diagnose_log(f"{line}\n")

    assert (diagnosis.state, diagnosis.failure) == (HUNG, "ray-resources")


def test_a_serve_replica_scheduled_after_the_warning_is_no_hang() -> None:
    text = (
        f"{SERVE_UNSCHEDULED[0]}\n"
        "(APIServer pid=1) INFO 01-02 03:04:09 [launcher.py:1] Application startup complete.\n"
    )

    assert diagnose_log(text).state == READY


# vLLM 0.10.2 vllm/_custom_ops.py and 0.10.2-0.34.0 vllm/platforms/rocm.py: logger.warning(
# "Failed to import from vllm._C with %r", e); 0.11.2-0.24.0 vllm/platforms/interface.py and
# cpu.py: "Failed to import from vllm._C: %r". vLLM goes on without it (a platform plugin has
# no vllm._C).
@pytest.mark.parametrize("joint", [" with ", ": "])
def test_vllms_warning_of_a_missing_optional_extension_is_no_broken_install(joint: str) -> None:
    warning = (
        f"Failed to import from vllm._C{joint}ModuleNotFoundError(\"No module named 'vllm._C'\")"
    )
    error = "ray.exceptions.RayTaskError(KeyError): ray::RayWorkerWrapper.execute_method()"
    text = f"WARNING 01-02 03:04:05 [_custom_ops.py:1] {warning}\n{error}\n"

    diagnosis = diagnose_log(text)

    assert diagnosis.error_class != "broken-install"
    assert diagnosis.line is not None and diagnosis.line.text == error


def test_the_missing_extensions_own_exception_is_still_broken_install() -> None:
    diagnosis = diagnose_log("ModuleNotFoundError: No module named 'vllm._C'\n")

    assert (diagnosis.failure, diagnosis.error_class) == ("unrecognised-error", "broken-install")


# Ascend CANN's inner error (ReportInnerErrMsg): the code's header "E<module><4 digits>: Inner
# Error!", then its message indented on the next line with "[FUNC:%s][FILE:%s][LINE:%d]".
@pytest.mark.parametrize("code", ["EZ9999", "EH9999", "EE1001"])
def test_the_message_under_a_canns_inner_error_header_is_the_line(code: str) -> None:
    detail = (
        "        aclrtSynchronizeDevice execute failed, reason=[aicore exception]"
        "[FUNC:F][FILE:f.cc][LINE:9]"
    )
    text = f"{code}: Inner Error!\n{detail}\n        TraceBack (most recent call last):\n"

    diagnosis = diagnose_log(text)

    assert diagnosis.failure == "unrecognised-error"
    assert diagnosis.line is not None and diagnosis.line.raw == detail


# NVIDIA CUDA cuda.h CUresult, driver_types.h cudaError_t and ROCm hip_runtime_api.h hipError_t
# names of an allocation failure, as libraries print the enum rather than its text.
@pytest.mark.parametrize(
    "rendered",
    [
        "RuntimeError: CUDA driver call failed: CUDA_ERROR_OUT_OF_MEMORY",
        "RuntimeError: cudaMalloc failed with cudaErrorMemoryAllocation",
        "RuntimeError: hipMalloc returned hipErrorOutOfMemory",
    ],
)
def test_an_out_of_memory_error_enum_is_oom(rendered: str) -> None:
    diagnosis = diagnose_log(f"{rendered}\n")

    assert (diagnosis.state, diagnosis.failure) == (FAILED, "oom")


# PyTorch ProcessGroupNCCL.cpp watchdogHandler: logPrefix() + "Timeout at NCCL work: %d, last
# enqueued NCCL work: %d, last completed NCCL work: %d."; logPrefix in its later releases'
# forms "[PG 0 (default_pg) Rank %d] " and "[PG ID %d PG GUID %s Rank %d] ".
@pytest.mark.parametrize(
    "prefix", ["PG 0 Rank 5", "PG 0 (default_pg) Rank 5", "PG ID 2 PG GUID 3 Rank 5"]
)
def test_the_watchdogs_timeout_at_nccl_work_is_an_nccl_timeout(prefix: str) -> None:
    line = (
        f"[rank5]:[E1003 18:37:01.833621509 ProcessGroupNCCL.cpp:1709] [{prefix}] Timeout at NCCL "
        "work: 6463, last enqueued NCCL work: 6463, last completed NCCL work: 6462."
    )

    diagnosis = diagnose_log(f"{line}\n")

    assert (diagnosis.state, diagnosis.failure) == (FAILED, "nccl-timeout")
    assert diagnosis.numbers.get("rank") == 5


# transformers 4.x: "Loading {name} requires you to execute the configuration file in that repo
# on your local machine. ..." (configuration_auto.py), "... the tokenizer file ..."
# (tokenization_auto.py), "... the modeling file ..."; excerpts often cut the line.
@pytest.mark.parametrize(
    "rendered",
    [
        "ValueError: Loading /models/chatglm3 requires you to execute the configuration file in "
        "that repo on your local machine. Make sure you have read the code there",
        "ValueError: Loading THUDM/chatglm3-6b requires you to execute the tokenizer file in that "
        "repo on your local machine.",
        "ValueError: Loading /models/m requires you to execute the conf",
        # vLLM 0.12.0-0.34.0 vllm/tokenizers/hf.py, 0.10.2-0.11.2 transformers_utils/tokenizer.py
        "RuntimeError: Failed to load the tokenizer. If the tokenizer is a custom tokenizer not "
        "yet available in the HuggingFace transformers library, consider setting "
        "`trust_remote_code=True` in LLM or using the `--trust-remote-code` flag in the CLI.",
    ],
)
def test_transformers_and_vllms_refusals_of_custom_code_are_trust_remote_code(
    rendered: str,
) -> None:
    diagnosis = diagnose_log(f"{rendered}\n")

    assert (diagnosis.state, diagnosis.failure) == (FAILED, "trust-remote-code")


# Ascend CANN runtime's error map: RT_ERROR_DRV_OUT_MEMORY -> "driver error:out of memory", in
# its "rtMalloc execute failed, reason=[%s]" and the driver's "halMemCreate failed ...
# ErrCode=207001, desc=[%s]" lines.
@pytest.mark.parametrize(
    "rendered",
    [
        "        rtMalloc execute failed, reason=[driver error:out of memory]"
        "[FUNC:FuncErrorReason][FILE:error_message_manage.cc][LINE:50]",
        "[ERROR] RUNTIME(4176881,python3):2025-01-02-03:04:05.000.000 [npu_driver.cc:1]1 "
        "MallocPhysical:[drv api]halMemCreate failed drvRetCode=6, size=20971520(bytes), "
        "ErrCode=207001, desc=[driver error:out of memory], InnerCode=0x7020016",
    ],
)
def test_ascends_device_allocation_failure_is_oom(rendered: str) -> None:
    diagnosis = diagnose_log(f"{rendered}\n")

    assert (diagnosis.state, diagnosis.failure) == (FAILED, "oom")


def test_ascends_pinned_host_allocation_failure_is_no_device_oom() -> None:
    text = "rtsMallocHost execution failed, reason=driver error:out of memory\n"

    assert diagnose_log(text).failure != "oom"


# Ray Serve's records (ray python/ray/serve/_private/logging_utils.py): ServeFormatter's
# "%(levelname)s %(asctime)s {component_name} {component_id} " [request id, route] then
# MESSAGE_FMT "%(filename)s:%(lineno)d - %(message)s"; ServeJSONFormatter's "message" is
# MESSAGE_FMT. A vLLM engine inside a Serve replica logs its errors through them.
@pytest.mark.parametrize(
    "record",
    [
        "(ServeReplica:llm:VLLMDeployment pid=123) ERROR 2024-03-24 03:17:59,398 "
        "llm_VLLMDeployment x1y2z3 replica.py:1 - {error}",
        "ERROR 2024-03-24 03:17:59,398 llm_VLLMDeployment x1y2z3 7f00-ab /v1/chat/completions "
        "replica.py:373 - {error}",
        '{{"levelname": "ERROR", "asctime": "2024-03-24 03:17:59,398", "message": '
        '"replica.py:1 - {error}"}}',
    ],
    ids=["text", "text-in-request", "json"],
)
def test_ray_serves_records_are_read_as_their_message(record: str) -> None:
    error = "ValueError: the frobnicator 42 is not frobbable"

    diagnosis = diagnose_log(record.format(error=error) + "\n")

    assert (diagnosis.state, diagnosis.failure) == (FAILED, "unrecognised-error")
    assert diagnosis.line is not None and diagnosis.line.text == error
    assert diagnosis.line.level == "ERROR"


# Each shell's wording when the start finds no vllm, rendered from its format string: GNU bash
# execute_cmd.c (internal_error "%s: command not found", after "NAME: line N: " in a script;
# shell_execve's "%s: No such file or directory"), zsh Src/exec.c (zerr "command not found:
# %s", after "zsh: "), dash src/exec.c ("%s: %d: " then "%s: %s" with "not found"), busybox ash
# ("sh: %s: not found"), fish ("Unknown command: %ls"), Go os/exec through docker/runc
# ('exec: "%s": executable file not found in $PATH'), CPython Lib/runpy.py ("%s: %s" with
# sys.executable and "No module named %s"; a dotted module's parent import error), and the
# handlers named in the list.
VLLM_MISSING = [
    "bash: vllm: command not found",
    "./serve.sh: line 12: vllm: command not found",
    "zsh: command not found: vllm",
    "/bin/sh: 1: vllm: not found",
    "sh: vllm: not found",
    "fish: Unknown command: vllm",
    "bash: /opt/venv/bin/vllm: No such file or directory",
    "docker: Error response from daemon: failed to create task for container: OCI runtime "
    'create failed: runc create failed: unable to start container process: exec: "vllm": '
    "executable file not found in $PATH: unknown.",
    "/usr/bin/python3: No module named vllm",
    "/usr/bin/python3: Error while finding module specification for "
    "'vllm.entrypoints.openai.api_server' (ModuleNotFoundError: No module named 'vllm')",
    "ModuleNotFoundError: No module named 'vllm'",
    # Ubuntu's command-not-found ("Command '%(command)s' not found, did you mean:"), Windows'
    # cmd.exe and PowerShell's CommandNotFoundException, in its current and older wording.
    "Command 'vllm' not found, did you mean:",
    "Command 'vllm' not found, but can be installed with:",
    "'vllm' is not recognized as an internal or external command,",
    "vllm : The term 'vllm' is not recognized as a name of a cmdlet, function, script file, "
    "or executable program.",
    "vllm : The term 'vllm' is not recognized as the name of a cmdlet, function, script "
    "file, or operable program.",
]


@pytest.mark.parametrize("rendered", VLLM_MISSING)
def test_a_shell_or_python_finding_no_vllm_is_vllm_not_installed(rendered: str) -> None:
    diagnosis = diagnose_log(f"$ nohup ./serve.sh > vllm.log 2>&1\n{rendered}\n")

    assert (diagnosis.state, diagnosis.failure) == (FAILED, "unrecognised-error")
    assert diagnosis.error_class == "vllm-not-installed"
    assert diagnosis.line is not None and rendered in diagnosis.line.raw


@pytest.mark.parametrize(
    "rendered",
    [
        "bash: vllm-bench: command not found",
        "zsh: command not found: vllmctl",
        "ModuleNotFoundError: No module named 'vllm_ascend'",
        "ModuleNotFoundError: No module named 'vllm._C'",
    ],
)
def test_another_command_or_module_missing_is_not_vllm_not_installed(rendered: str) -> None:
    assert diagnose_log(rendered + "\n").error_class != "vllm-not-installed"


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
# Each producer's line for a process that got SIGKILL: GNU bash jobs.c (a script's
# "NAME: line N: " and pretty_print_job's "PID Killed  cmd"; an interactive job "[N]+ Killed"),
# zsh Src/jobs.c ("zsh: killed  cmd"), a BSD shell ("Killed: 9"), docker compose ("exited with
# code 137"), systemd unit.c/service.c.
KILL_LINES = [
    "./serve.sh: line 193: 4242 Killed                  vllm serve Qwen/Qwen3-8B --port 8000",
    "[1]+  Killed                  vllm serve Qwen/Qwen3-8B",
    "zsh: killed     vllm serve Qwen/Qwen3-8B",
    "Killed: 9",
    "vllm-1 exited with code 137",
    "vllm.service: A process of this unit has been killed by the OOM killer.",
    "vllm.service: Failed with result 'oom-kill'.",
]
# torch ProcessGroupNCCL.cpp's warning at exit, as another rank's process writes it as it goes.
EXIT_WARNING = (
    "[rank0]:[W927 00:32:19.446476778 ProcessGroupNCCL.cpp:1479] Warning: WARNING: "
    "destroy_process_group() was not called before program exit, which can leak resources."
)


@pytest.mark.parametrize("kill", KILL_LINES)
@pytest.mark.parametrize("after", ["", EXIT_WARNING + "\n"], ids=["last", "then-exit-warning"])
def test_a_server_killed_after_it_served_is_not_ready(kill: str, after: str) -> None:
    diagnosis = diagnose_log(f"{SERVED}{kill}\n{after}")

    assert (diagnosis.state, diagnosis.failure) == (FAILED, "host-oom-killer")
    assert diagnosis.line is not None and kill in diagnosis.line.raw


def test_a_kill_the_server_outlived_leaves_it_ready() -> None:
    # The shell's job line for another command, then the server goes on serving.
    more = (
        '(APIServer pid=4242) INFO:     127.0.0.1:60540 - "POST /v1/completions HTTP/1.1" 200 OK\n'
    )
    text = f"{SERVED}./bench.sh: line 9: 5151 Killed   python load.py\n{more * 5}"

    assert diagnose_log(text).state == READY


def test_a_kill_of_a_process_known_to_run_is_not_reported() -> None:
    assert diagnose_log(SERVED + KILL_LINES[0] + "\n", running=True).state == READY


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


# ROCm/clr hipamd/src/hip_error.cpp ihipGetErrorString: hipErrorInvalidDeviceFunction "invalid
# device function", hipErrorNoBinaryForGpu "no kernel image is available for execution on the
# device"; PyTorch's hipified C10_CUDA_CHECK raises them as "HIP error: %s". The loader's own
# record: "hipErrorNoBinaryForGpu: Unable to find code object for all current devices!".
HIP_ARCH_ERRORS = (
    "RuntimeError: HIP error: invalid device function",
    "torch.AcceleratorError: HIP error: no kernel image is available for execution on the device",
    '"hipErrorNoBinaryForGpu: Unable to find code object for all current devices!"',
)


@pytest.mark.parametrize("rendered", HIP_ARCH_ERRORS, ids=["invalid-function", "no-image", "co"])
def test_rocms_wording_of_a_missing_gpu_kernel_is_cuda_arch_unsupported(rendered: str) -> None:
    text = (
        "INFO 03-05 07:15:30 [worker.py:1] Loading model\n"
        f"{rendered}\n"
        "HIP kernel errors might be asynchronously reported at some other API call, so the "
        "stacktrace below might be incorrect.\n"
    )

    diagnosis = diagnose_log(text)

    assert (diagnosis.state, diagnosis.failure) == (FAILED, "cuda-arch-unsupported")
    assert diagnosis.line is not None and rendered in diagnosis.line.raw


def test_another_hip_error_is_not_taken_for_a_missing_kernel() -> None:
    diagnosis = diagnose_log("RuntimeError: HIP error: invalid argument\n")

    assert diagnosis.failure != "cuda-arch-unsupported"


# Native crash reports, rendered from their producers' format strings: openucx/ucx
# src/ucs/debug/debug.c "Caught signal %d (%s: %s%s)" after UCX's "[host:pid:thread]" tag;
# glibc debug/fortify_fail.c "*** %s ***: terminated" and malloc/malloc.c malloc_printerr (both
# as glibc 2.36 prints them here); bash's "%s: line %d: %d %s" for a script's child.
NATIVE_CRASHES = (
    "[node-1:285  :0:285] Caught signal 11 (Segmentation fault: address not mapped to object at "
    "address (nil))",
    "[gpu7:40112:0:40190] Caught signal 7 (Bus error: nonexistent physical address)",
    "*** stack smashing detected ***: terminated",
    "*** buffer overflow detected ***: python3 terminated",
    "free(): double free detected in tcache 2",
    "double free or corruption (!prev)",
    "corrupted size vs. prev_size",
    "serve.sh: line 12: 15527 Segmentation fault      (core dumped) vllm serve /models/m",
)


@pytest.mark.parametrize("rendered", NATIVE_CRASHES)
def test_a_native_librarys_crash_report_is_an_unrecognised_error(rendered: str) -> None:
    text = (
        "INFO 03-05 07:15:30 [worker.py:1] Loading model\n"
        f"{rendered}\n"
        "==== backtrace (tid:    285) ====\n"
        " 0  /opt/hpcx/ucx/lib/libucs.so.0(ucs_handle_error+0x2e4) [0x7f3234ef8654]\n"
    )

    diagnosis = diagnose_log(text)

    assert (diagnosis.state, diagnosis.failure) == (FAILED, "unrecognised-error")
    assert diagnosis.line is not None and rendered in diagnosis.line.raw


def test_a_ucx_signal_line_without_its_cause_is_not_a_crash_report() -> None:
    diagnosis = diagnose_log("INFO 03-05 07:15:30 [worker.py:1] Caught signal 15, stopping\n")

    assert diagnosis.state != FAILED


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


def test_a_validation_header_without_its_detail_is_reported_itself() -> None:
    header = "pydantic_core._pydantic_core.ValidationError: 1 validation error for ModelConfig"

    diagnosis = diagnose_log(header + "\n")

    assert diagnosis.line is not None and diagnosis.line.text == header


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


def test_modelscopes_404_for_a_model_is_model_not_found() -> None:
    # modelscope/modelscope modelscope/hub/errors.py raise_for_http_status, for a 404:
    # 'The request model: %s does not exist!' % (model_id), logged by modelscope's logger.
    line = "2025-08-03 19:16:47,111 - modelscope - ERROR - The request model: org/m does not exist!"

    diagnosis = diagnose_log(line + "\n")

    assert diagnosis.failure == "model-not-found"
    assert diagnosis.numbers.get("repository") == "org/m"


# FlashInfer flashinfer/mla.py MLA plan: f"MLA kv_data_type {kv_data_type} is not supported. "
# f"Supported dtypes: {list(supported_kv_dtypes)}." and the per-backend form
# f"MLA kv_data_type {kv_data_type} is not supported by the {backend} backend. Supported "
# "dtypes: ..."
FLASHINFER_MLA_KV = (
    "ValueError: MLA kv_data_type torch.uint8 is not supported. Supported dtypes: "
    "[torch.float16, torch.bfloat16, torch.float8_e4m3fn].",
    "ValueError: MLA kv_data_type torch.uint8 is not supported by the fa2 backend. Supported "
    "dtypes: [torch.float16, torch.bfloat16].",
)


@pytest.mark.parametrize("rendered", FLASHINFER_MLA_KV, ids=["plain", "backend"])
def test_flashinfers_mla_refusing_the_kv_dtype_is_kv_dtype_kernel_mismatch(rendered: str) -> None:
    diagnosis = diagnose_log(rendered + "\n")

    assert diagnosis.failure == "kv-dtype-kernel-mismatch"
    assert diagnosis.numbers.get("kv_data_type") == "torch.uint8"


# LLVM llvm/lib/Support/ErrorHandling.cpp report_fatal_error: errs() << "LLVM ERROR: " << reason
# << "\n", then the process ends: rendered with a sample reason.
_LLVM_FATAL = "LLVM ERROR: {reason}".format(reason="Cannot select: intrinsic %llvm.example")
_SERVING = (
    "INFO:     Started server process [7]\n"
    "INFO:     Waiting for application startup.\n"
    "INFO:     Application startup complete.\n"
    "INFO 05-31 09:09:41 [engine.py:310] Added request cmpl-1.\n"
)


def test_an_llvm_fatal_error_while_serving_is_a_failure_not_ready() -> None:
    diagnosis = diagnose_log(_SERVING + _LLVM_FATAL + "\n")
    assert diagnosis.state == FAILED
    assert diagnosis.failure == "unrecognised-error"
    assert diagnosis.error_class == "llvm-fatal-error"
    assert diagnosis.line is not None and diagnosis.line.text == _LLVM_FATAL


def test_a_request_refused_while_serving_stays_ready() -> None:
    refused = (
        'INFO:     127.0.0.1:5000 - "POST /v1/chat/completions HTTP/1.1" 400 Bad Request\n'
        "ERROR 05-31 09:09:42 [serving_chat.py:200] Error in preprocessing prompt inputs\n"
    )
    diagnosis = diagnose_log(_SERVING + refused)
    assert diagnosis.state == READY


def test_llvm_error_wording_only_at_the_start_of_a_line() -> None:
    # A message that quotes LLVM's words mid-line is not LLVM's own record.
    quoted = "INFO 05-31 09:09:42 [x.py:1] retry after LLVM ERROR: earlier was cleared\n"
    assert diagnose_log(_SERVING + quoted).state == READY


# vLLM 0.10.2-0.34.0 vllm/v1/core/sched/scheduler.py: logger.debug("%s is still in
# WAITING_FOR_REMOTE_KVS state.", request_id), at each step the request waits.
def _remote_kv_wait(request_id: str) -> str:
    message = "%s is still in WAITING_FOR_REMOTE_KVS state." % request_id  # noqa: UP031 (logging renders the %-format)
    return f"DEBUG 10-09 19:47:51 [scheduler.py:345] {message}\n"


def test_requests_waiting_for_remote_kv_to_the_logs_end_are_a_hang() -> None:
    log = _SERVING + _remote_kv_wait("cmpl-1-0") * 3
    diagnosis = diagnose_log(log)
    assert diagnosis.state == HUNG
    assert diagnosis.failure == "unrecognised-error"
    assert diagnosis.error_class == "remote-kv-wait"
    assert diagnosis.line is not None and "WAITING_FOR_REMOTE_KVS" in diagnosis.line.text


def test_a_remote_kv_wait_that_ends_with_the_request_served_is_no_hang() -> None:
    served = 'INFO:     127.0.0.1:5000 - "POST /v1/completions HTTP/1.1" 200 OK\n'
    log = _SERVING + _remote_kv_wait("cmpl-1-0") * 3 + served
    assert diagnose_log(log).state == READY
