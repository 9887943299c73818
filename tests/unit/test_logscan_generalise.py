"""Unit tests of opsbook.knowledge.logscan's mechanisms for logs nobody has seen: inputs rendered
from the
format strings in vLLM's and its libraries' source (named at each test), not copied from logs."""

from __future__ import annotations

from opsbook.knowledge.logscan import FAILED, HUNG, READY, diagnose_log

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


def test_an_error_after_throughput_stats_is_still_the_failure() -> None:
    text = "\n".join(
        [V1_STATS, "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB"]
    )

    assert diagnose_log(text).state == FAILED


# uvicorn 0.55.0 uvicorn/lifespan/on.py and uvicorn/server.py (Server.startup logs the OSError of
# asyncio base_events.py create_server after the lifespan startup, then shuts the lifespan down).
BIND_ERROR = (
    "ERROR:    [Errno 99] error while attempting to bind on address ('::1', 8000, 0, 0): "
    "cannot assign requested address"
)


def test_a_bind_error_after_application_startup_complete_is_not_ready() -> None:
    text = "\n".join(
        [
            "INFO:     Started server process [3820]",
            "INFO:     Waiting for application startup.",
            "INFO:     Application startup complete.",
            BIND_ERROR,
            "INFO:     Waiting for application shutdown.",
            "INFO:     Application shutdown complete.",
        ]
    )

    diagnosis = diagnose_log(text)

    assert diagnosis.state == FAILED
    assert diagnosis.line is not None and diagnosis.line.raw == BIND_ERROR


def test_a_request_error_of_a_serving_server_leaves_it_ready() -> None:
    text = "\n".join(
        [
            "INFO:     Application startup complete.",
            "ERROR 05-06 21:00:42 [serving_chat.py:1] Error in preprocessing prompt inputs",
            'INFO:     127.0.0.1:5 - "POST /v1/chat/completions HTTP/1.1" 400 Bad Request',
        ]
    )

    assert diagnose_log(text).state == READY


# vLLM 0.10.2 vllm/v1/worker/gpu_worker.py (later releases name the device), rendered, then
# wrapped or cut.
FREE_MEMORY_HEAD = (
    "ValueError: Free memory on device cuda:0 (10.00/80.00 GiB) on startup is less than"
)
FREE_MEMORY_TAIL = (
    "desired GPU memory utilization (0.9, 72.00 GiB). Decrease GPU memory utilization"
)


def test_an_exception_wrapped_over_two_lines_matches_as_one() -> None:
    diagnosis = diagnose_log("\n".join(["```", FREE_MEMORY_HEAD, FREE_MEMORY_TAIL, "```"]))

    assert diagnosis.failure == "free-memory"
    assert diagnosis.line is not None and diagnosis.line.raw == FREE_MEMORY_HEAD


def test_an_exception_cut_after_its_fixed_words_matches_its_stem() -> None:
    assert diagnose_log(FREE_MEMORY_HEAD).failure == "free-memory"
    assert diagnose_log(FREE_MEMORY_HEAD.replace("cuda:0 ", "")).failure == "free-memory"


def test_an_indented_detail_line_is_not_joined_to_the_exception() -> None:
    # pydantic's ValidationError prints each error indented under its own line (vLLM 0.10.2
    # vllm/config ModelConfig validation): the detail is the message, not the header.
    detail = (
        "  Value error, User-specified max_model_len (513) is greater than the derived "
        "max_model_len (max_position_embeddings=512 or model_max_length=None in model's "
        "config.json)."
    )
    text = "\n".join(
        ["pydantic_core._pydantic_core.ValidationError: 1 validation error for ModelConfig", detail]
    )

    diagnosis = diagnose_log(text)

    assert diagnosis.line is not None and diagnosis.line.raw == detail


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


def test_transformers_4_cached_file_wording_is_model_not_found() -> None:
    # transformers 4.31 src/transformers/utils/hub.py cached_file (LocalEntryNotFoundError).
    text = (
        "OSError: We couldn't connect to 'https://huggingface.co' to load this file, couldn't "
        "find it in the cached files and it looks like org/model is not the path to a directory "
        "containing a file named config.json."
    )

    assert diagnose_log(text).failure == "model-not-found"


def test_the_tail_of_a_quoted_worker_error_is_not_the_root_cause() -> None:
    # vLLM 0.10.2-0.34.0 vllm/v1/executor/multiproc_executor.py: "Worker failed with error
    # '{result}', please check the stack trace above for the root cause", its quoted error
    # running over lines; then "Worker proc %s died unexpectedly, shutting down executor."
    prefix = "(EngineCore_DP0 pid=7) ERROR 02-27 10:31:15 [core.py:1] "
    died = (
        "(EngineCore_DP0 pid=7) ERROR 02-27 10:31:24 [multiproc_executor.py:1] Worker proc "
        "VllmWorker-0 died unexpectedly, shutting down executor."
    )
    text = "\n".join([prefix + "', please check the stack trace above for the root cause", died])

    diagnosis = diagnose_log(text)

    assert diagnosis.failure == "engine-dead"
    assert diagnosis.line is not None and diagnosis.line.raw == died


def test_an_actor_that_died_in_its_creation_task_is_ray_node_died() -> None:
    # ray 2.58.0 python/ray/exceptions.py ActorDiedError, rendered (its cause cut off).
    line = (
        "(LLMRayActor pid=7) Exception raised in creation task: The actor died because of an "
        "error raised in its creation task, ray::LLMRayActor.__init__() (pid=7, ip=10.0.0.1, "
    )

    assert diagnose_log(line).failure == "ray-node-died"


def test_a_cause_under_an_actor_creation_error_is_the_diagnosis() -> None:
    text = "\n".join(
        [
            "(LLMRayActor pid=7) Exception raised in creation task: The actor died because of an "
            "error raised in its creation task, ray::LLMRayActor.__init__() (pid=7, ip=10.0.0.1)",
            "(LLMRayActor pid=7) torch.OutOfMemoryError: CUDA out of memory. Tried to allocate "
            "2.00 GiB. GPU 0 has a total capacity of 79.15 GiB of which 1.00 GiB is free.",
        ]
    )

    assert diagnose_log(text).failure == "oom"


# vLLM 0.10.2-0.34.0 vllm/distributed/device_communicators/shm_broadcast.py, rendered.
SHM_STALL = (
    "No available shared memory broadcast block found in 60 seconds. This typically happens "
    "when some processes are hanging or doing some time-consuming work (e.g. compilation)."
)


def test_a_stall_quoted_alone_in_prose_is_a_hang() -> None:
    text = "\n".join(["Sometimes the server stops and logs:", "", SHM_STALL, "", "Any idea?"])

    diagnosis = diagnose_log(text)

    assert diagnosis.state == HUNG
    assert diagnosis.failure == "shm"
    assert diagnosis.line is not None and diagnosis.line.raw == SHM_STALL


def test_a_stall_among_progress_lines_is_a_note_only() -> None:
    text = "\n".join(
        [
            "INFO 05-06 21:00:41 [gpu_model_runner.py:1] Starting to load model org/model...",
            "WARNING 05-06 21:01:41 [shm_broadcast.py:1] " + SHM_STALL,
            "INFO 05-06 21:01:50 [gpu_model_runner.py:1] Model loading took 10.00 GiB",
            "INFO:     Application startup complete.",
        ]
    )

    assert diagnose_log(text).state == READY


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


def test_kserves_logger_prefix_carries_the_level_of_its_error() -> None:
    # kserve python/kserve/kserve/logging.py KSERVE_LOGGER_FORMAT, rendered.
    error = (
        "2024-07-01 07:28:04.488 1 kserve ERROR [__main__.py:<module>():254] Failed to start "
        "model server: division by zero"
    )
    text = "\n".join(
        [
            "2024-07-01 07:27:58.101 1 kserve INFO [model_server.py:register_model():1] "
            "Registering model: m",
            error,
        ]
    )

    diagnosis = diagnose_log(text)

    assert diagnosis.failure == "unrecognised-error"
    assert diagnosis.line is not None and diagnosis.line.raw == error
    assert diagnosis.line.level == "ERROR"


# instructlab src/instructlab/model/backends/vllm.py Server._ensure_server (ServerException).
SPAWNER_WRAPPER = (
    "vLLM failed to start.  Retry with --enable-serving-output to learn more about the failure."
)


def test_a_spawners_vllm_failed_to_start_is_engine_dead() -> None:
    diagnosis = diagnose_log("\n".join(["Starting a temporary vLLM server", SPAWNER_WRAPPER]))

    assert diagnosis.failure == "engine-dead"
    assert diagnosis.line is not None and diagnosis.line.raw == SPAWNER_WRAPPER


def test_the_cause_above_a_spawners_wrapper_is_the_diagnosis() -> None:
    text = "\n".join(
        [
            "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB. GPU 0 has a "
            "total capacity of 79.15 GiB of which 1.00 GiB is free.",
            SPAWNER_WRAPPER,
        ]
    )

    assert diagnose_log(text).failure == "oom"


def test_the_container_runtimes_refusal_is_reported_verbatim() -> None:
    # containerd pkg/process/init.go Init.Create: runtimeError(err, "OCI runtime create failed"),
    # relayed by the docker CLI's "docker: Error response from daemon: ...".
    refusal = (
        "docker: Error response from daemon: failed to create task for container: failed to "
        "create shim task: OCI runtime create failed: runc create failed: unable to start "
        "container process: error during container init"
    )

    diagnosis = diagnose_log(
        "\n".join(["Status: Image is up to date for vllm/vllm-openai", refusal])
    )

    assert diagnosis.failure == "unrecognised-error"
    assert diagnosis.line is not None and diagnosis.line.raw == refusal


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


def test_a_peer_attaching_to_a_short_nccl_segment_is_shm_space() -> None:
    # NVIDIA/nccl src/misc/shmutils.cc ncclShmOpen: "Error while %s shared memory segment %s
    # (size %ld), error: %s (%d)", %s "attaching to" on the peer's side.
    line = (
        "host:1:1 [0] misc/shmutils.cc:129 NCCL WARN Error while attaching to shared memory "
        "segment /dev/shm/nccl-AbCdEf (size 9637888), error: No such file or directory (2)"
    )

    assert diagnose_log(line).failure == "shm-space"


def test_the_message_of_a_logged_record_is_reported_over_its_exception() -> None:
    # vLLM 0.6 vllm/model_executor/models/registry.py: logger.error("Error in inspecting model
    # architecture '%s'", model_arch) with the traceback, every line under the same prefix.
    prefix = "ERROR 10-26 11:35:32 registry.py:267] "
    message = prefix + "Error in inspecting model architecture 'LlamaForCausalLM'"
    text = "\n".join(
        [
            message,
            prefix + "Traceback (most recent call last):",
            prefix + '  File "/x/registry.py", line 1, in _run',
            prefix + "    subprocess.run(cmd, check=True)",
            prefix + "subprocess.CalledProcessError: Command '['python']' returned non-zero "
            "exit status 1.",
        ]
    )

    diagnosis = diagnose_log(text)

    assert diagnosis.failure == "unrecognised-error"
    assert diagnosis.line is not None and diagnosis.line.raw == message


def test_an_exception_of_another_record_keeps_its_own_line() -> None:
    error = "RuntimeError: something broke"
    text = "\n".join(
        [
            "ERROR 10-26 11:35:30 x.py:1] Earlier unrelated message",
            "Traceback (most recent call last):",
            '  File "/x/y.py", line 1, in f',
            error,
        ]
    )

    diagnosis = diagnose_log(text)

    assert diagnosis.line is not None and diagnosis.line.raw == error


def test_a_handlers_constant_message_leaves_the_exception_reported() -> None:
    # vLLM 0.10.2-0.34.0 vllm/v1/engine/core.py: logger.exception("EngineCore encountered a
    # fatal error.") says only that the loop died; the exception says why.
    prefix = "(EngineCore pid=7) ERROR 12-02 19:11:55 [core.py:1] "
    error = prefix + "RuntimeError: Unsupported block size: 16"
    text = "\n".join(
        [
            prefix + "EngineCore encountered a fatal error.",
            prefix + "Traceback (most recent call last):",
            prefix + '  File "/x/core.py", line 1, in run_busy_loop',
            error,
        ]
    )

    diagnosis = diagnose_log(text)

    assert diagnosis.line is not None and diagnosis.line.raw == error


def test_xinferences_logger_prefix_carries_the_level_of_its_error() -> None:
    # xinference/deploy/cmdline.py "%(asctime)s %(name)-12s %(process)d %(levelname)-8s
    # %(message)s", rendered; the message is what the traceback under it is about.
    error = (
        "2024-10-25 12:21:14,974 xinference.api.restful_api 37502 ERROR    [address=10.0.0.1:1, "
        "pid=4] Timed out after 600 seconds waiting for clients. 1/2 clients joined."
    )
    text = "\n".join([error, "Traceback (most recent call last):", '  File "/x/a.py", line 1'])

    diagnosis = diagnose_log(text)

    assert diagnosis.failure == "unrecognised-error"
    assert diagnosis.line is not None and diagnosis.line.raw == error


def test_throughput_stats_of_a_process_known_dead_are_not_ready() -> None:
    assert diagnose_log(V1_STATS, running=False).state != READY
    assert diagnose_log(V1_STATS, running=True).state == READY


def test_a_request_error_after_throughput_stats_leaves_the_engine_serving() -> None:
    text = "\n".join(
        [
            V1_STATS,
            "Traceback (most recent call last):",
            '  File "/x/serving_chat.py", line 1, in create_chat_completion',
            "ValueError: This model's maximum context length is 4096 tokens.",
            V1_STATS,
        ]
    )

    assert diagnose_log(text).state == READY
