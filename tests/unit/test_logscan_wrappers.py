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

import pytest

from opsbook.knowledge.logscan import FAILED, READY, diagnose_log

STAMP = "ERROR 04-02 12:35:10 [core.py:380] "
# vLLM 0.10.2-0.34.0 vllm/v1/engine/core.py run_engine_core:
#   logger.exception("EngineCore encountered a fatal error.")
FATAL = STAMP + "EngineCore encountered a fatal error."
# vLLM V1 before 0.8.5 vllm/v1/engine/core.py EngineCoreProc.run_engine_core:
#   logger.error("EngineCore hit an exception: %s", get_exception_traceback())
HIT = STAMP + "EngineCore hit an exception: Traceback (most recent call last):"
FRAMES = [
    STAMP + '  File "/venv/vllm/v1/engine/core.py", line 368, in run_engine_core',
    STAMP + "    engine_core = EngineCoreProc(*args, **kwargs)",
]
# vLLM 0.10.2 vllm/engine/async_llm_engine.py (AsyncEngineDeadError messages).
V0_ASYNC = (
    "vllm.engine.async_llm_engine.AsyncEngineDeadError: Background loop has errored already.",
    "AsyncEngineDeadError: Background loop is not running. If it was running, inspect the output "
    "to find the stacktrace of the error that caused the background loop to stop "
    "(AsyncEngineDeadError).",
    "AsyncEngineDeadError: Background loop is stopped.",
    "AsyncEngineDeadError: Task finished unexpectedly. This should never happen! Please open an "
    "issue on GitHub. See stack trace above for the actual cause.",
)


@pytest.mark.parametrize("wrapper", [FATAL, HIT])
def test_an_engine_cores_death_record_cut_before_its_error_is_engine_dead(wrapper: str) -> None:
    text = "\n".join(["INFO 04-02 12:35:06 [monitor.py:33] torch.compile takes 12.50 s", wrapper])
    text += "\n" + "\n".join(FRAMES)

    diagnosis = diagnose_log(text)

    assert (diagnosis.state, diagnosis.failure) == (FAILED, "engine-dead")
    assert diagnosis.line is not None and diagnosis.line.raw == wrapper


@pytest.mark.parametrize("wrapper", [FATAL, HIT])
def test_the_error_closing_an_engine_cores_death_record_is_the_diagnosis(wrapper: str) -> None:
    # torch c10/cuda/CUDACachingAllocator.cpp (OutOfMemoryError), as the record's last line.
    cause = (
        STAMP + "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB. GPU 0 "
        "has a total capacity of 79.15 GiB of which 1.00 GiB is free. "
    )
    text = "\n".join([wrapper, *FRAMES, cause])

    diagnosis = diagnose_log(text)

    assert diagnosis.failure == "oom"
    assert diagnosis.line is not None and diagnosis.line.raw == cause


@pytest.mark.parametrize("wrapper", V0_ASYNC)
def test_v0s_async_engine_dead_errors_are_engine_dead(wrapper: str) -> None:
    text = "\n".join(["INFO 01-22 18:25:07 engine.py:267] Added request cmpl-1.", wrapper])

    diagnosis = diagnose_log(text)

    assert (diagnosis.state, diagnosis.failure) == (FAILED, "engine-dead")
    assert diagnosis.line is not None and diagnosis.line.raw == wrapper


@pytest.mark.parametrize("wrapper", [FATAL, HIT])
def test_an_uncatalogued_error_closing_the_record_is_reported_verbatim(wrapper: str) -> None:
    cause = STAMP + "TypeError: forward() got an unexpected keyword argument 'inputs_embeds'"
    text = "\n".join([wrapper, *FRAMES, cause])

    diagnosis = diagnose_log(text)

    assert diagnosis.failure == "unrecognised-error"
    assert diagnosis.line is not None and diagnosis.line.raw == cause
    assert diagnosis.wrapper is not None and diagnosis.wrapper.raw == wrapper


def test_a_worker_error_wrapped_as_an_unformatted_tuple_is_the_root_cause() -> None:
    # vLLM V1 of 2025 vllm/v1/executor/multiproc_executor.py collective_rpc: RuntimeError(
    # "Worker failed with error %s, please check the stack trace above for the root cause",
    # result), the message never formatted: str() of the exception is the tuple of both.
    error = RuntimeError(
        "Worker failed with error %s, please check the stack trace above for the root cause",
        "'tuple' object has no attribute 'ndim'",
    )
    wrapper = STAMP + f"RuntimeError: {error}"
    text = "\n".join([*FRAMES, wrapper])

    diagnosis = diagnose_log(text)

    assert diagnosis.failure == "unrecognised-error"
    assert diagnosis.line is not None and diagnosis.line.raw == wrapper


def test_a_node_without_the_device_in_ray_is_ray_resources() -> None:
    # vLLM 0.11.2-0.32.0 vllm/v1/executor/ray_utils.py initialize_ray_cluster, rendered.
    device_str, current_node_resource = "GPU", {"node:10.0.0.2": 1.0, "CPU": 8.0}
    error = (
        f"ValueError: Current node has no {device_str} available. {current_node_resource=}. "
        f"vLLM engine cannot start without {device_str}. Make sure you have at least 1 "
        f"{device_str} available in a node current_node_id='ab12' current_ip='10.0.0.2'."
    )

    diagnosis = diagnose_log("\n".join(["INFO 09-01 10:00:00 ray_utils.py:1] Connecting", error]))

    assert diagnosis.failure == "ray-resources"
    assert diagnosis.line is not None and diagnosis.line.raw == error


# vLLM 0.10.2 vllm/engine/metrics.py (V0 LoggingStatLogger), rendered.
V0_STATS = (
    "INFO 12-16 17:54:21 metrics.py:449] Avg prompt throughput: 7.8 tokens/s, Avg generation "
    "throughput: 0.6 tokens/s, Running: 1 reqs, Swapped: 0 reqs, Pending: 0 reqs, GPU KV cache "
    "usage: 0.0%, CPU KV cache usage: 0.0%."
)
# vLLM 0.6-0.7 vllm/entrypoints/launcher.py (logger.fatal; vllm-project/vllm#10024).
MQ_DEAD = (
    "CRITICAL 12-16 17:54:23 launcher.py:99] MQLLMEngine is already dead, terminating server "
    "process"
)


def test_v0s_server_giving_up_on_its_dead_engine_is_no_ready_server() -> None:
    text = "\n".join([V0_STATS, MQ_DEAD, 'INFO:     10.0.0.1:5182 - "POST /v1/x HTTP/1.1" 500'])

    diagnosis = diagnose_log(text)

    assert (diagnosis.state, diagnosis.failure) == (FAILED, "engine-dead")
    assert diagnosis.line is not None and diagnosis.line.raw == MQ_DEAD


def test_the_request_error_that_killed_a_v0_engine_is_the_root_cause() -> None:
    # A CUDA kernel's failed assertion as glibc's __assert_fail prints it from the device
    # (pytorch aten/src/ATen/native/cuda/IndexKernel.cu CUDA_KERNEL_ASSERT).
    assertion = (
        "../aten/src/ATen/native/cuda/IndexKernel.cu:93: operator(): block: [1,0,0], thread: "
        '[7,0,0] Assertion `-sizes[i] <= index && index < sizes[i] && "index out of bounds"` '
        "failed."
    )
    text = "\n".join([V0_STATS, assertion, MQ_DEAD])

    diagnosis = diagnose_log(text)

    assert (diagnosis.state, diagnosis.failure) == (FAILED, "unrecognised-error")
    assert diagnosis.line is not None and diagnosis.line.raw == assertion


# vLLM 0.10.2 vllm/entrypoints/logger.py RequestLogger.log_inputs, rendered (V0 and V1 alike).
RECEIVED = (
    "INFO 10-01 18:43:27 logger.py:36] Received request cmpl-c52d-0: prompt: 'How to make "
    "pizza', params: SamplingParams(n=1, temperature=0.0), prompt_token_ids: [1, 2], "
    "lora_request: None, prompt_adapter_request: None."
)
# vLLM 0.18.0-0.33.0 request_logger.py, and 0.10.2-0.34.0 vllm/v1/engine/async_llm.py.
RECEIVED_V1 = (
    "(APIServer pid=7) INFO 03-18 17:33:04 [request_logger.py:67] Received request "
    "chatcmpl-9: params: SamplingParams(n=1), lora_request: None."
)
ADDED = "(APIServer pid=7) INFO 03-18 17:33:04 [async_llm.py:415] Added request chatcmpl-9."


@pytest.mark.parametrize("taken", [RECEIVED, RECEIVED_V1, ADDED])
def test_a_server_logging_the_requests_it_takes_is_ready(taken: str) -> None:
    text = "\n".join(["engine args: [...]", taken])

    diagnosis = diagnose_log(text)

    assert diagnosis.state == READY
    assert diagnosis.line is not None and diagnosis.line.raw == taken


def test_an_engine_death_after_a_request_taken_is_still_the_failure() -> None:
    text = "\n".join([ADDED, FATAL, *FRAMES])

    diagnosis = diagnose_log(text)

    assert (diagnosis.state, diagnosis.failure) == (FAILED, "engine-dead")


# vLLM 0.10.2 vllm/worker/model_runner.py and vllm/executor/gpu_executor.py (V0), rendered;
# "Killed" is bash's report of a job that got SIGKILL (bash jobs.c, strsignal(SIGKILL)).
LOADED = "INFO 11-20 10:45:57 model_runner.py:692] Loading model weights took 1.9900 GB"


def test_a_kill_under_which_a_reporter_wrote_is_still_the_kill() -> None:
    text = "\n".join([LOADED, "Killed", "Why was it killed?"])

    diagnosis = diagnose_log(text)

    assert (diagnosis.state, diagnosis.failure) == (FAILED, "host-oom-killer")
    assert diagnosis.line is not None and diagnosis.line.raw == "Killed"


def test_a_kill_the_server_logged_past_is_no_kill_of_the_server() -> None:
    text = "\n".join(["Killed", LOADED])

    assert diagnose_log(text).failure != "host-oom-killer"


def test_the_hubs_404_logged_at_debug_for_an_optional_file_is_no_failure() -> None:
    # vLLM 0.12.0-0.34.0 vllm/transformers_utils/repo_utils.py: logger.debug("File or
    # repository not found in hf_hub_download", e), e a huggingface_hub EntryNotFoundError
    # (huggingface_hub utils/_http.py hf_raise_for_status: "Entry Not Found for url: {url}.").
    prefix = "(APIServer pid=5) DEBUG 03-18 17:33:04 [transformers_utils/repo_utils.py:243] "
    text = "\n".join(
        [
            prefix + "File or repository not found in hf_hub_download: 404 Client Error.",
            prefix,
            prefix + "Entry Not Found for url: https://huggingface.co/org/model/resolve/main/"
            "processor_config.json.",
        ]
    )

    diagnosis = diagnose_log(text)

    assert diagnosis.state != FAILED and diagnosis.failure is None


def test_the_same_404_logged_as_an_error_is_still_the_failure() -> None:
    error = (
        "huggingface_hub.errors.EntryNotFoundError: 404 Client Error. Entry Not Found for url: "
        "https://huggingface.co/org/model/resolve/main/config.json."
    )

    assert diagnose_log(error).state == FAILED


@pytest.mark.parametrize(
    "error",
    [
        # vLLM 0.6-0.8 vllm/transformers_utils/config.py get_config, rendered.
        "ValueError: No supported config format found in /models/missing-model",
        # vLLM 0.10.2-0.34.0 vllm/transformers_utils/config.py, rendered.
        "(APIServer pid=7) ERROR 03-18 17:33:04 [config.py:1] ValueError: Could not detect config "
        "format for no config file found. With config_format 'auto', ensure your model has "
        "either config.json (HF format) or params.json (Mistral format).",
    ],
)
def test_vllms_words_for_a_model_without_a_config_are_model_not_found(error: str) -> None:
    diagnosis = diagnose_log(error)

    assert diagnosis.failure == "model-not-found"
    assert diagnosis.line is not None and diagnosis.line.raw == error


@pytest.mark.parametrize(
    "wrapper",
    [
        # vLLM 0.5-0.6 vllm/entrypoints/launcher.py (vllm-project/vllm#9230).
        "CRITICAL 11-04 12:53:11 launcher.py:72] AsyncLLMEngine has failed, terminating server "
        "process",
        # V1 before 0.9 vllm/v1/engine/core_client.py sigusr1_handler (logger.fatal).
        "CRITICAL 03-26 17:25:01 [core_client.py:269] Got fatal signal from worker processes, "
        "shutting down. See stack trace above for root cause issue.",
        # V1 before 0.9 vllm/v1/executor/multiproc_executor.py sigusr1_handler (its typo).
        "(EngineCore_1 pid=3) CRITICAL 04-22 17:08:49 [multiproc_executor.py:49] "
        "MulitprocExecutor got fatal signal from worker processes, shutting down. See stack "
        "trace above for root cause issue.",
        # vLLM 0.10.2-0.34.0 vllm/v1/engine/async_llm.py output_handler (logger.exception).
        "(APIServer pid=7) ERROR 03-26 17:25:01 [async_llm.py:1] AsyncLLM output_handler failed.",
        # vLLM 0.10.2 vllm/engine/async_llm_engine.py _log_task_completion.
        "ERROR 03-26 17:25:01 async_llm_engine.py:1] Engine background task failed",
    ],
)
def test_other_releases_words_for_a_dead_engine_are_engine_dead(wrapper: str) -> None:
    diagnosis = diagnose_log("\n".join([V0_STATS, wrapper]))

    assert (diagnosis.state, diagnosis.failure) == (FAILED, "engine-dead")
    assert diagnosis.line is not None and diagnosis.line.raw == wrapper


def test_the_error_in_v0s_background_loop_record_is_the_root_cause() -> None:
    prefix = "ERROR 03-26 17:25:01 async_llm_engine.py:64] "
    cause = prefix + "RuntimeError: shape mismatch in paged attention"
    text = "\n".join(
        [
            prefix + "Engine background task failed",
            prefix + "Traceback (most recent call last):",
            prefix + '  File "/x/async_llm_engine.py", line 54, in _log_task_completion',
            prefix + "    return_value = task.result()",
            cause,
            "AsyncEngineDeadError: Task finished unexpectedly. This should never happen! Please "
            "open an issue on GitHub. See stack trace above for the actual cause.",
        ]
    )

    diagnosis = diagnose_log(text)

    assert diagnosis.failure == "unrecognised-error"
    assert diagnosis.line is not None and diagnosis.line.raw == cause


@pytest.mark.parametrize("subject", ["The actor or task with ID cb23ff01", "The lease with ID 9a1"])
def test_rays_infeasible_request_warning_is_ray_resources(subject: str) -> None:
    # ray-project/ray src/ray/raylet/scheduling/cluster_task_manager.cc (the actor or task)
    # and cluster_lease_manager.cc (the lease), rendered as Ray's Python logger prints them.
    warning = (
        f"2025-01-02 10:00:00,687\tWARNING worker.py:1034 -- {subject} cannot be scheduled "
        "right now. It requires {GPU: 1.000000}, {CPU: 1.000000} for placement, however the "
        "cluster currently cannot provide the requested resources. The required resources may "
        "be added as autoscaling takes place or placement groups are scheduled. Otherwise, "
        "consider reducing the resource requirements of the task."
    )

    diagnosis = diagnose_log("\n".join(["INFO 01-02 10:00:00 ray_utils.py:1] Connecting", warning]))

    assert diagnosis.failure == "ray-resources"
    assert diagnosis.line is not None and diagnosis.line.raw == warning


def _worker_record(process: str, message: str, cause: str) -> list[str]:
    prefix = f"({process}) ERROR 08-21 08:26:21 [worker_base.py:620] "
    return [
        prefix + message,
        prefix + "Traceback (most recent call last):",
        prefix + '  File "/venv/vllm/worker/worker_base.py", line 612, in execute_method',
        prefix + "    return run_method(self, method, args, kwargs)",
        prefix + cause,
    ]


# vLLM 0.10.2 vllm/worker/worker_base.py and 0.11.2-0.34.0 vllm/v1/worker/worker_base.py:
# logger.exception(f"Error executing method {method!r}. This might cause deadlock in
# distributed execution."), rendered.
METHOD = "Error executing method 'init_device'. This might cause deadlock in distributed execution."


def test_a_workers_failed_method_record_is_a_wrapper_of_its_own_exception() -> None:
    cause = "RuntimeError: invalid device ordinal"
    text = "\n".join(_worker_record("RayWorkerWrapper pid=2, ip=10.0.0.2", METHOD, cause))

    diagnosis = diagnose_log(text)

    assert diagnosis.failure == "unrecognised-error"
    assert diagnosis.line is not None and diagnosis.line.raw.endswith(cause)


def test_a_workers_failed_method_record_cut_before_its_error_is_engine_dead() -> None:
    text = "\n".join(_worker_record("VllmWorkerProcess pid=2", METHOD, "")[:3])

    diagnosis = diagnose_log(text)

    assert diagnosis.failure == "engine-dead"
    assert diagnosis.line is not None and diagnosis.line.raw.endswith(METHOD)


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


def test_an_error_the_failed_process_went_past_is_not_the_root_cause() -> None:
    # vLLM 0.10.2-0.34.0 vllm/v1/engine/utils.py wait_for_engine_startup, rendered; the
    # engine core's weights line (vllm/model_executor/model_loader/default_loader.py) after its
    # error shows the error did not stop it.
    wrapper = (
        "(APIServer pid=1) ERROR 03-12 10:11:20 [core_client.py:1] RuntimeError: Engine core "
        "initialization failed. See root cause above. Failed core proc(s): {}"
    )
    text = "\n".join(
        [
            "(EngineCore_DP0 pid=7) ERROR 03-12 10:11:10 [plugins.py:1] Failed to load plugin x",
            "(EngineCore_DP0 pid=7) INFO 03-12 10:11:11 [default_loader.py:1] Loading weights "
            "took 3.10 seconds",
            wrapper,
        ]
    )

    diagnosis = diagnose_log(text)

    assert diagnosis.failure == "engine-dead"
    assert diagnosis.line is not None and diagnosis.line.raw == wrapper


def test_an_error_after_the_processs_last_progress_is_still_the_root_cause() -> None:
    error = "(EngineCore_DP0 pid=7) ERROR 03-12 10:11:12 [gpu_worker.py:1] Cannot allocate x"
    text = "\n".join(
        [
            "(EngineCore_DP0 pid=7) INFO 03-12 10:11:11 [default_loader.py:1] Loading weights "
            "took 3.10 seconds",
            error,
            "(APIServer pid=1) ERROR 03-12 10:11:20 [core_client.py:1] RuntimeError: Engine core "
            "initialization failed. See root cause above. Failed core proc(s): {}",
        ]
    )

    diagnosis = diagnose_log(text)

    assert diagnosis.failure == "unrecognised-error"
    assert diagnosis.line is not None and diagnosis.line.raw == error


# uvicorn 0.55.0 uvicorn/protocols/http/h11_impl.py: '%s - "%s %s HTTP/%s" %d', rendered with
# vLLM's API server prefix (vllm/logger.py formats uvicorn's loggers too).
ACCESS = '(APIServer pid=1) INFO:     127.0.0.1:52706 - "GET /health HTTP/1.1" 200 OK'
ADDRESS = "(APIServer pid=1) INFO 05-06 21:00:52 [api_server.py:1] Starting vLLM API server 0 on "


def test_a_server_answering_requests_in_an_error_free_log_is_ready() -> None:
    diagnosis = diagnose_log("\n".join([ADDRESS + "http://0.0.0.0:8000", ACCESS]))

    assert diagnosis.state == READY
    assert diagnosis.line is not None and diagnosis.line.raw == ACCESS


def test_answers_after_the_engine_died_do_not_make_the_server_ready() -> None:
    dead = (
        "(APIServer pid=1) ERROR 03-13 06:55:20 [serving.py:1] vllm.v1.engine.exceptions."
        "EngineDeadError: EngineCore encountered an issue. See stack trace (above) for the root "
        "cause."
    )

    diagnosis = diagnose_log("\n".join([dead, ACCESS]))

    assert (diagnosis.state, diagnosis.failure) == (FAILED, "engine-dead")


@pytest.mark.parametrize(
    "wrapper",
    [
        # vLLM 0.10.2-0.34.0 vllm/v1/executor/multiproc_executor.py, rendered.
        "(VllmWorker rank=0 pid=5) ERROR 01-01 00:00:00 [multiproc_executor.py:1] WorkerProc "
        "failed.",
        "RuntimeError: Executor failed.",
        # vLLM 0.10.2 vllm/engine/multiprocessing/client.py (VLLM_RPC_TIMEOUT 10000), rendered.
        "TimeoutError: RPCServer didn't reply within 10000 ms",
        "TimeoutError: MQLLMEngine didn't reply within 10000ms",
    ],
)
def test_an_executors_or_v0_clients_word_for_a_dead_engine_is_engine_dead(wrapper: str) -> None:
    loaded = "INFO 01-01 00:00:00 [default_loader.py:1] Loading weights took 1.00 seconds"

    diagnosis = diagnose_log("\n".join([loaded, wrapper]))

    assert (diagnosis.state, diagnosis.failure) == (FAILED, "engine-dead")
    assert diagnosis.line is not None and diagnosis.line.raw == wrapper


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


def test_transformers_4_word_for_a_path_that_is_no_hub_id_is_model_not_found() -> None:
    # transformers 4.x src/transformers/utils/hub.py cached_file (HFValidationError), rendered.
    path_or_repo_id = "/models/Qwen2.5-7B-Instruct"
    error = (
        f"OSError: Incorrect path_or_model_id: '{path_or_repo_id}'. Please provide either the "
        "path to a local folder or the repo_id of a model on the Hub."
    )

    diagnosis = diagnose_log(error)

    assert diagnosis.failure == "model-not-found"
    assert diagnosis.line is not None and diagnosis.line.raw == error


@pytest.mark.parametrize(
    "kill",
    [
        # ray-project/ray doc/source/ray-core/scheduling/ray-oom-prevention.rst.
        "ray.exceptions.OutOfMemoryError: Task was killed due to the node running low on memory.",
        # ray-project/ray src/ray/raylet/node_manager.cc, rendered.
        "(raylet) [2025-01-01 00:00:00,000 E 1 1] (raylet) node_manager.cc:3069: 1 Workers (tasks "
        "/ actors) killed due to memory pressure (OOM), 0 Workers crashed due to other reasons "
        "at node (ID: ab12, IP: 10.0.0.2) over the last time period.",
    ],
)
def test_rays_memory_monitor_killing_a_worker_is_host_memory(kill: str) -> None:
    diagnosis = diagnose_log(kill)

    assert diagnosis.failure == "host-oom-killer"
    assert diagnosis.line is not None and diagnosis.line.raw == kill


def test_torchs_out_of_memory_error_is_still_gpu_memory() -> None:
    error = (
        "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB. GPU 0 has a "
        "total capacity of 79.15 GiB of which 1.00 GiB is free."
    )

    assert diagnose_log(error).failure == "oom"


def test_a_crashed_ray_worker_is_ray_node_died() -> None:
    # ray-project/ray python/ray/exceptions.py WorkerCrashedError, rendered.
    error = (
        "ray.exceptions.WorkerCrashedError: The worker died unexpectedly while executing this "
        "task. Check python-core-worker-*.log files for more information."
    )

    diagnosis = diagnose_log(error)

    assert diagnosis.failure == "ray-node-died"
    assert diagnosis.line is not None and diagnosis.line.raw == error


def test_a_data_parallel_process_that_died_with_an_exit_code_is_engine_dead() -> None:
    # vLLM 0.10.2-0.34.0 vllm/v1/utils.py wait_for_completion_or_failure, rendered.
    name, pid, exitcode = "EngineCore_DP1", 4711, -9
    error = f"RuntimeError: Process {name} (PID: {pid}) died with exit code {exitcode}"

    diagnosis = diagnose_log(error)

    assert diagnosis.failure == "engine-dead"
    assert diagnosis.line is not None and diagnosis.line.raw == error


@pytest.mark.parametrize(
    "refusal",
    [
        # python/cpython Lib/argparse.py (error: "%(prog)s: error: %(message)s"), rendered.
        "vllm serve: error: the following arguments are required: model_tag",
        "vllm serve: error: ambiguous option: --max could match --max-model-len, --max-num-seqs",
        "vllm serve: error: argument --dtype: expected one argument",
        "api_server.py: error: argument --port: expected one argument",
    ],
)
def test_argparses_refusals_of_the_command_line_are_unknown_arg(refusal: str) -> None:
    diagnosis = diagnose_log("\n".join(["usage: vllm serve [-h] [model_tag] [options]", refusal]))

    assert diagnosis.failure == "unknown-arg"
    assert diagnosis.line is not None and diagnosis.line.raw == refusal


# vLLM 0.10.2-0.34.0 vllm/logging_utils/dump_input.py _dump_engine_exception logs the failed
# step's inputs at ERROR before vllm/v1/engine/core.py logs "EngineCore encountered a fatal
# error." ("Dumping input data for V1 LLM engine (v%s) with config: %s, ", "Dumping scheduler
# output for model execution: %s", "Dumping scheduler stats: %s").
@pytest.mark.parametrize(
    "dump",
    [
        "Dumping input data for V1 LLM engine (v0.10.2) with config: model='m', ",
        "Dumping scheduler output for model execution: SchedulerOutput(scheduled_new_reqs=[])",
        "Dumping scheduler stats: SchedulerStats(num_running_reqs=3, num_waiting_reqs=21)",
    ],
)
def test_the_engines_state_dump_is_no_root_cause(dump: str) -> None:
    prefix = "(EngineCore_DP0 pid=633) ERROR 09-08 00:45:43"
    wrapper = f"{prefix} [core.py:702] EngineCore encountered a fatal error."
    text = (
        f"{prefix} [dump_input.py:79] {dump}\n{wrapper}\n"
        f"{prefix} [core.py:702] Traceback (most recent call last):\n"
        f'{prefix} [core.py:702]   File "/v/multiproc_executor.py", line 243, in collective_rpc\n'
    )

    diagnosis = diagnose_log(text)

    assert (diagnosis.state, diagnosis.failure) == (FAILED, "engine-dead")
    assert diagnosis.line is not None and diagnosis.line.raw == wrapper
    assert diagnosis.root_cause is None


def test_an_error_before_the_state_dump_is_still_the_root_cause() -> None:
    prefix = "(EngineCore_DP0 pid=633) ERROR 09-08 00:45:43"
    error = f"{prefix} [core.py:1] ValueError: the widget is broken"
    text = (
        f"{error}\n{prefix} [dump_input.py:79] Dumping scheduler stats: SchedulerStats()\n"
        f"{prefix} [core.py:702] EngineCore encountered a fatal error.\n"
    )

    diagnosis = diagnose_log(text)

    assert diagnosis.root_cause is not None and diagnosis.root_cause.raw == error


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


def test_an_engine_dead_error_while_a_signalled_server_shuts_down_is_no_failure() -> None:
    diagnosis = diagnose_log(_UP + _SIGNALLED + _DEAD + _UVICORN_DOWN)

    assert (diagnosis.state, diagnosis.failure) == (READY, None)
    assert "stopped on purpose" in diagnosis.title
    assert diagnosis.line is not None and "Application startup complete." in diagnosis.line.raw


def test_an_engine_dead_error_with_no_stop_requested_is_still_engine_dead() -> None:
    assert diagnose_log(_UP + _DEAD).failure == "engine-dead"


def test_a_stop_requested_before_the_server_was_up_does_not_hide_the_engines_death() -> None:
    starting = (
        "(APIServer pid=31) INFO 08-01 21:00:00 [api_server.py:1] vLLM API server version 0.25.1\n"
    )
    assert diagnose_log(starting + _SIGNALLED + _DEAD).failure == "engine-dead"


def test_uvicorns_shutdown_alone_shows_a_server_that_had_served() -> None:
    # uvicorn server.py Server.serve: "Shutting down" only after startup and the main loop.
    diagnosis = diagnose_log(_UVICORN_DOWN)

    assert diagnosis.state == READY
    assert "stopped on purpose" in diagnosis.title
    assert diagnosis.line is not None and "Shutting down" in diagnosis.line.raw


def test_a_shutdown_after_a_bind_error_is_still_the_bind_error() -> None:
    # uvicorn server.py Server.startup on an OSError: logger.error(exc), the lifespan's
    # shutdown ("Waiting for application shutdown."), sys.exit(1): no "Shutting down".
    bind = (
        "(APIServer pid=31) ERROR:    [Errno 98] error while attempting to bind on address "
        "('0.0.0.0', 8000): address already in use\n"
        "(APIServer pid=31) INFO:     Waiting for application shutdown.\n"
        "(APIServer pid=31) INFO:     Application shutdown complete.\n"
    )
    assert diagnose_log(_UP.split("(APIServer pid=31) INFO 08-01 21:30")[0] + bind).state == FAILED


# PyTorch c10/cuda/CUDACachingAllocator.cpp: "CUDA out of memory. Tried to allocate ",
# format_size(alloc_size), ". GPU ", device, " has a total capacity of ", ... " of which ",
# ... " is free."; vLLM 0.13.0-0.21.0 vllm/v1/worker/gpu_model_runner.py load_model catches it,
# logs f"{msg} (original error: {e})" with msg "Failed to load model - not enough GPU memory.
# Try lowering --gpu-memory-utilization ..." and re-raises it, which the engine core logs.
_TORCH_OOM = (
    "CUDA out of memory. Tried to allocate 260.00 MiB. GPU 0 has a total capacity of 6.00 GiB "
    "of which 0 bytes is free."
)
_LOAD_FAILED = (
    "(EngineCore_DP0 pid=9) ERROR 03-10 07:38:43 [gpu_model_runner.py:4219] Failed to load "
    "model - not enough GPU memory. Try lowering --gpu-memory-utilization to free memory for "
    "weights, increasing --tensor-parallel-size, or using --quantization. See "
    "https://docs.vllm.ai/en/latest/configuration/conserving_memory/ for more tips. "
    f"(original error: {_TORCH_OOM})"
)
_RAISED = (
    f"(EngineCore_DP0 pid=9) ERROR 03-10 07:38:43 [core.py:1006] torch.OutOfMemoryError: "
    f"{_TORCH_OOM}"
)


def test_the_raised_oom_is_reported_rather_than_vllms_message_quoting_it() -> None:
    frame = '(EngineCore_DP0 pid=9) ERROR 03-10 07:38:43 [core.py:1006]   File "/v/x.py", line 1\n'
    diagnosis = diagnose_log(f"{_LOAD_FAILED}\n{frame}{_RAISED}\n")

    assert diagnosis.failure == "oom"
    assert diagnosis.line is not None and "torch.OutOfMemoryError: CUDA" in diagnosis.line.raw


def test_vllms_message_quoting_the_oom_is_reported_when_the_raised_one_is_cut() -> None:
    diagnosis = diagnose_log(_LOAD_FAILED + "\n")

    assert diagnosis.failure == "oom"
    assert diagnosis.line is not None and "Failed to load model" in diagnosis.line.raw


# transformers src/transformers/utils/hub.py (cached_files: OSError("You are trying to access a
# gated repo.\nMake sure to have access to it at https://huggingface.co/{path_or_repo_id}.\n"
# f"{str(e)}")) over huggingface_hub utils/_http.py (hf_raise_for_status: GatedRepoError
# f"{status} Client Error." ... "Cannot access gated repo for url {url}." then "Access to model
# {repo} is restricted. You must have access to it and be authenticated to access it.").
_GATED = (
    "Traceback (most recent call last):\n"
    '  File "/v/transformers/utils/hub.py", line 402, in cached_file\n'
    "OSError: You are trying to access a gated repo.\n"
    "Make sure to have access to it at https://huggingface.co/org/model.\n"
    "401 Client Error. (Request ID: Root=1-abc)\n"
    "\n"
    "Cannot access gated repo for url https://huggingface.co/org/model/resolve/main/config.json.\n"
    "Access to model org/model is restricted. You must have access to it and be authenticated "
    "to access it. Please log in.\n"
)


def test_the_raised_gated_error_is_reported_rather_than_the_lines_its_message_goes_on_with() -> (
    None
):
    diagnosis = diagnose_log(_GATED)

    assert diagnosis.failure == "hub-gated"
    assert diagnosis.line is not None
    assert "OSError: You are trying to access a gated repo." in diagnosis.line.raw


def test_hubs_message_is_reported_under_an_exception_that_states_only_the_status() -> None:
    # huggingface_hub's own GatedRepoError: its first line is the HTTP status alone.
    text = _GATED.replace(
        "OSError: You are trying to access a gated repo.\n"
        "Make sure to have access to it at https://huggingface.co/org/model.\n"
        "401 Client Error.",
        "huggingface_hub.errors.GatedRepoError: 401 Client Error.",
    )
    diagnosis = diagnose_log(text)

    assert diagnosis.failure == "hub-gated"
    assert diagnosis.line is not None and "Cannot access gated repo" in diagnosis.line.raw


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


# ray python/ray/exceptions.py (ray 2.58.0) ActorDiedError: "The actor died because of an error
# raised in its creation task, {cause}", the cause being the RayTaskError's text (the function
# "ray::%s" with its pid, the traceback, the exception the constructor raised).
CREATION_TASK = (
    "ray.exceptions.ActorDiedError: The actor died because of an error raised in its creation "
    "task, ray::EngineActor.__init__() (pid=4021, ip=10.0.0.2, actor_id=ab12, "
    "repr=<EngineActor object at 0x7f00>)"
)
CONSTRUCTOR_FRAMES = (
    '  File "/app/engine.py", line 58, in __init__',
    "    self.llm = vllm.LLM(*args, **kwargs)",
)


def test_under_rays_creation_task_wrapper_the_constructors_error_is_the_failure() -> None:
    # Python's own wording of a keyword the callee does not take (as this venv's CPython prints
    # it for a class's __init__): an integration passing an engine argument the installed vLLM
    # removed is an uncatalogued error, no lost node.
    raised = "TypeError: EngineArgs.__init__() got an unexpected keyword argument 'old_arg'"
    text = "\n".join([CREATION_TASK, *CONSTRUCTOR_FRAMES, raised]) + "\n"

    diagnosis = diagnose_log(text)

    assert (diagnosis.state, diagnosis.failure) == (FAILED, "unrecognised-error")
    assert diagnosis.line is not None and diagnosis.line.text == raised
    assert diagnosis.wrapper is not None and "creation task" in diagnosis.wrapper.text


def test_under_rays_creation_task_wrapper_a_catalogued_error_keeps_its_class() -> None:
    # PyTorch c10/cuda/CUDACachingAllocator.cpp: "CUDA out of memory. Tried to allocate %s."
    raised = "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB. GPU 0"
    text = "\n".join([CREATION_TASK, *CONSTRUCTOR_FRAMES, raised]) + "\n"

    diagnosis = diagnose_log(text)

    assert (diagnosis.failure, diagnosis.line and diagnosis.line.text) == ("oom", raised)


def test_rays_creation_task_wrapper_cut_before_its_cause_stays_ray_node_died() -> None:
    diagnosis = diagnose_log(CREATION_TASK + "\n")

    assert diagnosis.failure == "ray-node-died"


# vLLM 0.10.2 vllm/executor/multiproc_worker_utils.py _run_worker_process: logger.exception(
# "Exception in worker %s while processing method %s.", process_name, method), the worker's
# lines prefixed "(%s pid=%d) " (_add_prefix); the older form logger.error("Exception in worker
# %s while processing method %s: %s, %s", process_name, method, e, tb).
WORKER = "(VllmWorkerProcess pid=311) ERROR 05-02 09:14:07 [multiproc_worker_utils.py:233] "
WORKER_RECORD = (
    WORKER + "Exception in worker VllmWorkerProcess while processing method init_device."
)
OLD_WORKER_RECORD = (
    WORKER + "Exception in worker VllmWorkerProcess while processing method determine_num_"
    "available_blocks: boom, Traceback (most recent call last):"
)


def test_a_workers_method_record_cut_before_its_traceback_is_that_workers_failure() -> None:
    diagnosis = diagnose_log("INFO 05-02 09:14:00 [llm_engine.py:1] Initializing\n" + WORKER_RECORD)

    assert (diagnosis.state, diagnosis.failure) == (FAILED, "unrecognised-error")
    assert diagnosis.error_class == "worker-method-failed"
    assert diagnosis.line is not None and diagnosis.line.raw == WORKER_RECORD
    assert "init_device" in diagnosis.remedy and "VllmWorkerProcess" in diagnosis.remedy
    assert "killed from outside" not in diagnosis.remedy


def test_the_older_worker_record_cut_before_its_traceback_is_reported_itself() -> None:
    diagnosis = diagnose_log(OLD_WORKER_RECORD + "\n")

    assert diagnosis.failure == "unrecognised-error"
    assert diagnosis.line is not None and diagnosis.line.raw == OLD_WORKER_RECORD


def test_under_a_workers_method_record_its_exception_is_the_root_cause() -> None:
    # PyTorch c10/cuda/CUDACachingAllocator.cpp: "CUDA out of memory. Tried to allocate %s."
    raised = "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB."
    text = "\n".join(
        [
            WORKER_RECORD,
            WORKER + "Traceback (most recent call last):",
            WORKER + '  File "/venv/vllm/worker/worker.py", line 176, in init_device',
            WORKER + "    torch.cuda.set_device(self.device)",
            WORKER + raised,
        ]
    )

    diagnosis = diagnose_log(text + "\n")

    assert diagnosis.failure == "oom"
    assert diagnosis.line is not None and diagnosis.line.text == raised


# vLLM 0.10.2 vllm/engine/multiprocessing/engine.py MQLLMEngine.start: logger.exception(repr(e))
# under V0's format "%(levelname)s %(asctime)s [%(filename)s:%(lineno)d] %(message)s", then
# vllm/engine/multiprocessing/__init__.py ENGINE_DEAD_ERROR's MQEngineDeadError for requests.
_V0_SERVING = (
    "INFO:     Started server process [7]\n"
    "INFO:     Application startup complete.\n"
    "INFO 11-29 09:04:25 [engine.py:290] Added request chat-1.\n"
)
_LOOP_ERROR = ValueError("could not broadcast input array from shape (9,) into shape (8,)")
_LOOP_RECORD = f"ERROR 11-29 09:04:28 [engine.py:158] {_LOOP_ERROR!r}"
_LOOP_TRACE = (
    "ERROR 11-29 09:04:28 [engine.py:158] Traceback (most recent call last):\n"
    'ERROR 11-29 09:04:28 [engine.py:158]   File "/x/vllm/engine/multiprocessing/engine.py",'
    " line 156, in start\n"
    "ERROR 11-29 09:04:28 [engine.py:158]     self.run_engine_loop()\n"
)
_MQ_DEAD = (
    "ERROR 11-29 09:04:29 [serving_chat.py:885] vllm.engine.multiprocessing.MQEngineDeadError: "
    "Engine loop is not running. Inspect the stacktrace to find the original error: "
    f"{_LOOP_ERROR!r}."
)


def test_the_v0_engine_loops_error_while_serving_is_a_failure_with_that_line() -> None:
    diagnosis = diagnose_log(_V0_SERVING + _LOOP_RECORD + "\n" + _LOOP_TRACE)
    assert diagnosis.state == FAILED
    assert diagnosis.failure == "unrecognised-error"
    assert diagnosis.line is not None and diagnosis.line.raw == _LOOP_RECORD


def test_under_mq_engine_dead_the_engine_loops_own_record_below_is_the_root() -> None:
    diagnosis = diagnose_log(_V0_SERVING + _MQ_DEAD + "\n" + _LOOP_RECORD + "\n" + _LOOP_TRACE)
    assert diagnosis.state == FAILED
    assert diagnosis.failure == "unrecognised-error"
    assert diagnosis.line is not None and diagnosis.line.raw == _LOOP_RECORD
    assert diagnosis.wrapper is not None and "MQEngineDeadError" in diagnosis.wrapper.raw


def test_a_request_error_of_the_api_server_while_serving_stays_ready() -> None:
    # The API server's own record of a request's error (not the engine loop's): it answers
    # the request with an error and goes on serving.
    request = (
        'INFO:     127.0.0.1:5000 - "POST /v1/chat/completions HTTP/1.1" 400 Bad Request\n'
        f"ERROR 11-29 09:04:28 [serving_chat.py:200] {ValueError('prompt too long')!r}\n"
    )
    assert diagnose_log(_V0_SERVING + request).state == READY


# ray python/ray/exceptions.py (ray 2.60.0): the class named f"RayTaskError({cause.__name__})"
# by as_instanceof_cause, its __str__ f"{proctitle}() (pid={pid}, ip={ip})" then the task's
# traceback and its exception line.
def _ray_task_error(cause: Exception, frames: str) -> str:
    header = "{}() (pid={}, ip={})".format("ray::run_inference", 4153, "10.0.0.7")
    name = f"RayTaskError({type(cause).__name__})"
    return f"ray.exceptions.{name}: {header}\n{frames}{type(cause).__name__}: {cause}\n"


_RAY_FRAMES = (
    '  File "/x/site-packages/vllm/entrypoints/llm.py", line 212, in __init__\n'
    "    engine_args = EngineArgs(\n"
)


def test_under_rays_task_error_header_the_tasks_exception_line_is_reported() -> None:
    cause = TypeError("EngineArgs.__init__() got an unexpected keyword argument 'x'")
    diagnosis = diagnose_log(_ray_task_error(cause, _RAY_FRAMES))
    assert diagnosis.state == FAILED
    assert diagnosis.failure == "unrecognised-error"
    assert diagnosis.line is not None and diagnosis.line.text == f"TypeError: {cause}"


def test_a_ray_task_error_header_with_its_traceback_cut_is_reported_itself() -> None:
    cut = _ray_task_error(TypeError("x"), "").splitlines()[0] + "\n"
    diagnosis = diagnose_log(cut)
    assert diagnosis.line is not None and diagnosis.line.text.startswith("ray.exceptions.")


# vLLM 0.10.2 vllm/lora/worker_manager.py: raise RuntimeError(f"Loading lora {path} failed")
# from e; V0's model runner re-raises it as "Error in model execution: ..."; the engine loop's
# logger.exception(repr(e)) prints the chain, the cause (ValueError) first (CPython).
def test_the_engine_loops_chained_cause_in_its_record_is_reported() -> None:
    root = ValueError("base_model.model.lm_head.weight is unsupported LoRA weight")
    wrapped = RuntimeError("Error in model execution: Loading lora /m/adapter failed")
    at = "ERROR 10-11 16:03:09 [engine.py:157] "
    record = (
        f"{at}{wrapped!r}\n{at}Traceback (most recent call last):\n"
        f'{at}  File "/x/vllm/lora/utils.py", line 113, in parse_fine_tuned_lora_name\n'
        f"{at}ValueError: {root}\n{at}\n"
        f"{at}The above exception was the direct cause of the following exception:\n"
        f"{at}RuntimeError: {wrapped}\n"
    )
    diagnosis = diagnose_log(record)
    assert diagnosis.state == FAILED
    assert diagnosis.line is not None and diagnosis.line.text == f"ValueError: {root}"


# CANN's HCCL error EI0006 ("Getting socket times out. Reason: %s", CANN error code reference,
# HCCL Errors) printed by torch_npu under its operator error ("OPS function error: %s, error
# code is %d"), every line under the rank's prefix.
_NPU_OPS = (
    "[rank1]: RuntimeError: InnerRunOpApi:torch_npu/csrc/framework/OpParamMaker.cpp:281 "
    "OPS function error: {}, error code is {}\n"
)
_CANN_ACL = (
    "[rank1]: [ERROR] 2025-04-08-18:07:20 (PID:12, Device:1, RankID:1) ERR01100 "
    "OPS call acl api failed.\n"
)
_EI0006 = "EI0006: [PID: 12] 2025-04-08-18:07:20.444.436 Getting socket times out. Reason: {}"


def test_under_torch_npus_operator_error_the_hccl_coded_line_is_reported() -> None:
    coded = _EI0006.format("Remote Rank did not send the data in time.")
    log = _NPU_OPS.format("HcclAllreduce", 6) + _CANN_ACL + f"[rank1]: {coded}\n"
    diagnosis = diagnose_log(log)
    assert diagnosis.state == FAILED
    assert diagnosis.failure == "unrecognised-error"
    assert diagnosis.line is not None and diagnosis.line.text == coded


def test_an_operator_error_with_no_coded_line_under_it_is_reported_itself() -> None:
    log = _NPU_OPS.format("HcclAllreduce", 6) + _CANN_ACL
    diagnosis = diagnose_log(log)
    assert diagnosis.line is not None and "OPS function error" in diagnosis.line.text


# vLLM 0.10.2-0.34.0 vllm/v1/engine/core.py run_engine_core: logger.exception("EngineCore
# encountered a fatal error.") once the engine was up; the loop is over, so is the serving.
def test_the_v1_engine_cores_fatal_error_while_serving_is_a_failure() -> None:
    fatal = (
        "(EngineCore_DP0 pid=9) ERROR 05-12 01:48:42 [core.py:710] "
        "EngineCore encountered a fatal error.\n"
        "(EngineCore_DP0 pid=9) ERROR 05-12 01:48:42 [core.py:710] "
        "Traceback (most recent call last):\n"
        "(EngineCore_DP0 pid=9) ERROR 05-12 01:48:42 [core.py:710] "
        "RuntimeError: CUDA error: an illegal instruction was encountered\n"
    )
    diagnosis = diagnose_log(_V0_SERVING + fatal)
    assert diagnosis.state == FAILED
    assert diagnosis.line is not None
    assert diagnosis.line.text == "RuntimeError: CUDA error: an illegal instruction was encountered"


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


def test_plain_text_under_a_death_record_is_not_taken_for_its_traceback() -> None:
    text = FATAL + "\n...\nsee the attached file\nValueError: a later reply's words\n"

    diagnosis = diagnose_log(text)

    assert (diagnosis.state, diagnosis.failure) == (FAILED, "engine-dead")
    assert diagnosis.line is not None and diagnosis.line.raw == FATAL
