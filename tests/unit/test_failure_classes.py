"""The failure classes added for current releases and multi-node serving, each on a small log
made from the real format string (the ``# source:`` line names it), and the root cause found
under a wrapper error."""

from __future__ import annotations

from pathlib import Path

import pytest

from opsbook.knowledge.logscan import FAILED, NO_CONCLUSION, diagnose_log, load_catalogue

CLASSES = Path(__file__).resolve().parents[1] / "data" / "logs" / "classes"
LOGS = sorted(CLASSES.glob("*.log"))
IDS = {entry.id for entry in load_catalogue()}


def expected_id(path: Path) -> str:
    return path.stem.rsplit("-", 1)[0]


def key_of(text: str) -> str:
    return next(line[len("# key: ") :] for line in text.splitlines() if line.startswith("# key: "))


@pytest.mark.parametrize("path", LOGS, ids=[p.stem for p in LOGS])
def test_each_class_is_diagnosed_on_its_real_text(path: Path) -> None:
    text = path.read_text(encoding="utf-8")
    assert text.startswith("# source: ")

    diagnosis = diagnose_log(text)

    assert (diagnosis.state, diagnosis.failure) == (FAILED, expected_id(path)), str(diagnosis)
    assert diagnosis.line is not None and key_of(text) in diagnosis.line.raw
    assert diagnosis.remedy.strip() and diagnosis.source.strip()


def test_every_new_class_of_the_brief_has_a_log_and_an_entry() -> None:
    brief = {
        "not-enough-devices", "no-device", "tp-not-divisible", "max-model-len-too-large",
        "no-weights", "weights-missing", "invalid-kv-cache-dtype", "unknown-attention-backend",
        "backend-invalid", "tool-call-parser-missing", "hub-gated", "ray-version-mismatch",
        "ray-resources", "ray-node-died", "nccl-timeout", "cuda-arch-unsupported",
        "head-size-unsupported", "kv-dtype-kernel-mismatch", "shm-space", "free-memory",
        "model-not-found",
    }  # fmt: skip
    assert brief <= IDS
    assert brief <= {expected_id(path) for path in LOGS}


def test_remedies_name_the_parsed_values() -> None:
    def remedy(name: str) -> str:
        return diagnose_log((CLASSES / name).read_text(encoding="utf-8")).remedy

    assert "needs 4 GPUs and this host has 2" in remedy("not-enough-devices-1.log")
    assert "4 attention heads" in remedy("tp-not-divisible-1.log")
    assert "--max-model-len 512.0" in remedy("max-model-len-too-large-1.log")
    assert "Rank 1 timed out in ALLREDUCE" in remedy("nccl-timeout-1.log")
    assert "--shm-size" in remedy("shm-space-1.log") and "NCCL_P2P" not in remedy("shm-space-1.log")
    assert "fp7" in remedy("invalid-kv-cache-dtype-1.log")


def test_the_shm_segment_error_is_shm_space_not_nccl() -> None:
    diagnosis = diagnose_log((CLASSES / "shm-space-1.log").read_text(encoding="utf-8"))

    assert diagnosis.failure == "shm-space"
    assert diagnosis.numbers["bytes"] == 9637892


def test_a_missing_local_path_is_model_not_found_not_hub_gated() -> None:
    diagnosis = diagnose_log((CLASSES / "model-not-found-1.log").read_text(encoding="utf-8"))

    assert diagnosis.failure == "model-not-found"
    assert diagnosis.numbers["repository"] == "/models/no-such-dir"


# --- the root cause under the wrapper ------------------------------------------------------

API = "(APIServer pid=10) "
ENGINE = "(EngineCore_DP0 pid=20) ERROR 03-12 10:00:05 [core.py:700] "
WRAPPED = [
    API + "INFO 03-12 10:00:00 [api_server.py:1] vLLM API server version 0.33.0",
    ENGINE + "EngineCore failed to start.",
    ENGINE + "Traceback (most recent call last):",
    ENGINE + '  File "/x/vllm/v1/engine/core.py", line 690, in run_engine_core',
    ENGINE + "    engine_core = EngineCoreProc(*args, **kwargs)",
    ENGINE + "{root}",
    ENGINE + "",
    ENGINE + "During handling of the above exception, another exception occurred:",
    ENGINE + "RuntimeError: cleanup failed",
    API + "Traceback (most recent call last):",
    API + '  File "/x/bin/vllm", line 8, in <module>',
    API + "RuntimeError: Engine core initialization failed. See root cause above. "
    "Failed core proc(s): {{'EngineCore_DP0': 1}}",
]


def test_an_uncatalogued_root_cause_is_reported_verbatim_with_line_and_process() -> None:
    root = "KeyError: 'model.layers.0.mlp.gate_proj.weight_scale'"
    text = "\n".join(WRAPPED).format(root=root)

    diagnosis = diagnose_log(text)

    # The log shows the root error: the class is the root's (engine-dead is the wrapper alone).
    assert diagnosis.failure == "unrecognised-error"
    assert diagnosis.line is not None and diagnosis.line.number == 6
    assert diagnosis.root_cause is diagnosis.line
    assert diagnosis.line.process == "EngineCore_DP0 pid=20"
    assert root in diagnosis.title and root in diagnosis.remedy
    assert "root cause above" not in diagnosis.title
    assert diagnosis.wrapper is not None and "Engine core initialization" in diagnosis.wrapper.text
    data = diagnosis.to_dict()["root_cause"]
    assert data["number"] == 6 and data["process"] == "EngineCore_DP0 pid=20"


def test_an_excerpt_cut_inside_the_final_wrapper_still_finds_the_root_below_the_first() -> None:
    # vLLM logs "EngineCore failed to start." above the traceback that ends in the cause;
    # the API server's "Engine core initialization failed. See root cause above." comes last.
    root = "RuntimeError: DeepGEMM backend is not available or outdated."
    lines = "\n".join(WRAPPED[:6]).format(root=root).split("\n")
    cut = API + "RuntimeError: Engine core initialization failed. S"

    diagnosis = diagnose_log("\n".join([*lines, cut]))

    assert diagnosis.failure == "unrecognised-error"
    assert diagnosis.line is not None and diagnosis.line.text == root
    assert diagnosis.wrapper is not None and diagnosis.wrapper.raw == cut


def test_a_wrapper_quoting_the_workers_error_is_the_root_when_nothing_precedes_it() -> None:
    # vLLM 0.10.2-0.34.0 vllm/v1/executor/multiproc_executor.py (collective_rpc's FAILURE)
    quoted = (
        "RuntimeError: Worker failed with error 'rotary dim mismatch', please check the "
        "stack trace above for the root cause"
    )

    alone = diagnose_log(ENGINE + quoted)
    below_root = diagnose_log("\n".join([ENGINE + "AssertionError: rotary dim mismatch", quoted]))

    assert alone.failure == "unrecognised-error"
    assert alone.line is not None and alone.line.text == quoted
    assert below_root.line is not None and below_root.line.number == 1


def test_a_catalogued_root_cause_above_a_ray_actor_death_is_classified() -> None:
    lines = [
        "(RayWorkerWrapper pid=31, ip=10.0.0.2) ERROR 03-12 10:00:04 [worker_base.py:1] "
        "ValueError: Cannot find any model weights with `/models/m`",
        "ray.exceptions.RayActorError: The actor died unexpectedly before finishing this task.",
    ]

    diagnosis = diagnose_log("\n".join(lines))

    assert diagnosis.failure == "no-weights"
    assert diagnosis.line is not None and diagnosis.line.number == 1


def test_an_uncatalogued_error_of_a_ray_worker_is_the_root_of_its_actor_death() -> None:
    lines = [
        "(RayWorkerWrapper pid=31, ip=10.0.0.2) ERROR 03-12 10:00:04 [worker_base.py:1] "
        "AssertionError: rotary dim mismatch",
        "ray.exceptions.ActorDiedError: The actor died unexpectedly before finishing this task.",
    ]

    diagnosis = diagnose_log("\n".join(lines))

    assert diagnosis.failure == "ray-node-died"
    assert diagnosis.line is not None and diagnosis.line.number == 1
    assert "AssertionError: rotary dim mismatch" in diagnosis.title


def test_a_wrapper_with_no_earlier_error_says_where_to_look() -> None:
    text = (Path(__file__).resolve().parents[1] / "data" / "logs" / "engine-dead-1.log").read_text()

    diagnosis = diagnose_log(text)

    assert diagnosis.failure == "engine-dead"
    assert diagnosis.root_cause is None
    assert "dmesg" in diagnosis.remedy and "killed" in diagnosis.remedy


def test_a_log_that_stops_mid_phase_names_the_oom_killer_as_the_suspect() -> None:
    text = "\n".join(
        [
            "INFO 03-12 10:00:00 [api_server.py:1] vLLM API server version 0.33.0",
            "(EngineCore_DP0 pid=20) INFO 03-12 10:00:09 [default_loader.py:1] "
            "Loading weights took 12.5 seconds",
        ]
    )

    diagnosis = diagnose_log(text)

    assert diagnosis.state == NO_CONCLUSION
    assert diagnosis.suspect == "host-oom-killer"
    assert "stops during phase weights without an error" in diagnosis.title
    assert "dmesg" in diagnosis.remedy


# vLLM's CPU MLA decode kernel (csrc/cpu/mla_decode.cpp) and the GPU paged-attention kernels
# raise the same text; only the frame above it tells which kernel spoke.
_BLOCK_SIZE_TAIL = (
    "(EngineCore pid=7) ERROR 12-02 19:11:55 [core.py:1] EngineCore encountered a fatal error.\n"
    "(EngineCore pid=7) ERROR 12-02 19:11:55 [core.py:1] Traceback (most recent call last):\n"
    '(EngineCore pid=7) ERROR 12-02 19:11:55 [core.py:1]   File "{file}", line 158, in {fn}\n'
    "(EngineCore pid=7) ERROR 12-02 19:11:55 [core.py:1]     {call}\n"
    "(EngineCore pid=7) ERROR 12-02 19:11:55 [core.py:1] RuntimeError: Unsupported block size: 16\n"
)


def test_the_cpu_mla_kernels_block_size_text_is_a_head_size_problem() -> None:
    cpu = _BLOCK_SIZE_TAIL.format(
        file="vllm/_custom_ops.py",
        fn="mla_decode_kvcache_cpu",
        call="torch.ops._C.mla_decode_kvcache(out, query, kv_cache, scale, block_tables, seq_lens)",
    )
    diagnosis = diagnose_log(cpu)
    assert diagnosis.failure == "head-size-unsupported"
    assert "only for an MLA head of 576" in diagnosis.remedy
    assert "Unsupported block size: 16" in diagnosis.remedy


def test_the_same_text_from_another_kernel_is_not_called_a_head_size_problem() -> None:
    gpu = _BLOCK_SIZE_TAIL.format(
        file="vllm/_custom_ops.py",
        fn="paged_attention_v1",
        call="torch.ops._C.paged_attention_v1(out, query, key_cache, value_cache, num_kv_heads)",
    )
    diagnosis = diagnose_log(gpu)
    assert diagnosis.failure != "head-size-unsupported"
    assert diagnosis.line is not None and "Unsupported block size: 16" in diagnosis.line.raw


# Format strings added from their sources, rendered with sample values.
@pytest.mark.parametrize(
    ("rendered", "expected"),
    [
        # vLLM 0.34.0 vllm/v1/executor/multiproc_executor.py (WorkerProc.wait_for_ready)
        (
            "Exception: WorkerProc initialization failed due to an exception in a "
            "background process. See stack trace for root cause.",
            "engine-dead",
        ),
        # vLLM 0.10.2-0.34.0 vllm/v1/executor/multiproc_executor.py (collective_rpc): the
        # wrapper quotes the worker's error, and with no earlier line that error is the root.
        (
            "RuntimeError: Worker failed with error 'boom', please check the stack trace "
            "above for the root cause",
            "unrecognised-error",
        ),
        # transformers 4.x dynamic_module_utils.resolve_trust_remote_code
        (
            "ValueError: Loading org/model requires you to execute the configuration file in "
            "that repo on your local machine. Make sure you have read the code there to avoid "
            "malicious use, then set the option `trust_remote_code=True` to remove this error.",
            "trust-remote-code",
        ),
    ],
)
def test_a_rendered_format_string_gets_its_class(rendered: str, expected: str) -> None:
    assert diagnose_log(rendered + "\n").failure == expected


def test_a_bare_assertion_error_is_classified_by_the_failed_assert_line_above_it() -> None:
    text = "\n".join(
        [
            "Traceback (most recent call last):",
            '  File "/opt/vllm/vllm/model_executor/models/qwen2.py", line 120, in __init__',
            "    assert self.total_num_kv_heads % tp_size == 0",
            "AssertionError",
        ]
    )

    diagnosis = diagnose_log(text)

    assert (diagnosis.state, diagnosis.failure) == (FAILED, "tp-not-divisible")
    assert diagnosis.line is not None and diagnosis.line.number == 3


def test_an_assert_line_that_did_not_fail_is_still_code() -> None:
    # The same assertion with its own message: the message is the exception line.
    text = "\n".join(
        [
            "Traceback (most recent call last):",
            '  File "/opt/vllm/vllm/x.py", line 1, in f',
            "    assert self.total_num_kv_heads % tp_size == 0",
            '  File "/opt/vllm/vllm/y.py", line 2, in g',
            "    raise RuntimeError('boom')",
            "RuntimeError: boom",
        ]
    )

    assert diagnose_log(text).failure == "unrecognised-error"


def test_ensure_divisibility_numbers_are_tp_not_divisible_but_named_sizes_are_not() -> None:
    sharded = (
        "(VllmWorker TP2 pid=4) ERROR 08-31 04:18:45 [x.py:1] "
        "AssertionError: 12 is not divisible by 8"
    )
    block = "ValueError: attn_chunk_size 100 is not divisible by block_size 16"

    assert diagnose_log(sharded).failure == "tp-not-divisible"
    assert diagnose_log(block).failure == "unrecognised-error"
