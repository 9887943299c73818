"""The failure classes added for current releases and multi-node serving, each on a small log
made from the real format string (the ``# source:`` line names it), and the root cause found
under a wrapper error."""

from __future__ import annotations

from pathlib import Path

import pytest

from opsbook.knowledge.logscan import FAILED, diagnose_log, load_catalogue

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
    assert "--max-model-len 512 " in remedy("max-model-len-too-large-1.log")
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


def test_a_wrapper_with_no_earlier_error_says_where_to_look() -> None:
    text = (Path(__file__).resolve().parents[1] / "data" / "logs" / "engine-dead-1.log").read_text()

    diagnosis = diagnose_log(text)

    assert diagnosis.failure == "engine-dead"
    assert diagnosis.root_cause is None
    assert "dmesg" in diagnosis.remedy and "killed" in diagnosis.remedy


def test_ensure_divisibility_numbers_are_tp_not_divisible_but_named_sizes_are_not() -> None:
    sharded = (
        "(VllmWorker TP2 pid=4) ERROR 08-31 04:18:45 [x.py:1] "
        "AssertionError: 12 is not divisible by 8"
    )
    block = "ValueError: attn_chunk_size 100 is not divisible by block_size 16"

    assert diagnose_log(sharded).failure == "tp-not-divisible"
    assert diagnose_log(block).failure == "unrecognised-error"
