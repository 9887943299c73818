"""Unit tests of opsbook.knowledge.logscan on the real vLLM logs of tests/data/logs and on mangled
copies.

Real logs are checked against tests/data/logs/INDEX.md (category and key line), parsed here.
Key-line comparison: the key must be an exact substring of the reported line's ``raw`` text
(the original text as in the file, so ``grep -F`` finds it), and ``normalise_line(key)`` must
be a substring of the reported line's normalised ``text`` (prefixes, ANSI codes, quote
markers removed and terminal-wrapped pieces joined).

A case that is only "this text is diagnosed so" is a labelled file of tests/data/logs/cases
(checked by test_logscan_cases.py); the tests here check the mechanisms: reading mangled
lines, phases, versions, the kernel log, presentation.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path

import pytest

from opsbook.core.results import SEVERITIES, Result
from opsbook.knowledge.logscan import (
    FAILED,
    HUNG,
    LOADING,
    NO_CONCLUSION,
    PHASE_NAMES,
    READY,
    LogDiagnosis,
    classify_kernel_log,
    diagnose_log,
    find_version,
    load_catalogue,
    normalise_line,
    parse_backend_reasons,
    phases,
    read_log_lines,
)

LOGS = Path(__file__).resolve().parents[1] / "data" / "logs"
# INDEX.md names two categories with a note in parentheses: a benign look-alike, and a
# sub-class that opsbook's catalogue keeps apart from its parent.
SUBCLASSES = {"custom all-reduce": "custom-allreduce"}


@dataclass(frozen=True)
class IndexRow:
    file: str
    category: str
    key: str
    source: str
    version: str

    @property
    def benign(self) -> bool:
        return "BENIGN" in self.category

    @property
    def expected_class(self) -> str:
        base, _, note = self.category.partition(" (")
        return SUBCLASSES.get(note.rstrip(")"), base)


def index_rows() -> list[IndexRow]:
    rows = []
    for line in (LOGS / "INDEX.md").read_text(encoding="utf-8").splitlines():
        if not re.match(r"^[\w.-]+\.log \| ", line):
            continue
        parts = line.split(" | ")
        rows.append(IndexRow(parts[0], parts[1], " | ".join(parts[2:-2]), parts[-2], parts[-1]))
    return rows


ROWS = index_rows()


def read_log(name: str) -> str:
    return (LOGS / name).read_text(encoding="utf-8")


def key_is_on(key: str, diagnosis: LogDiagnosis) -> bool:
    line = diagnosis.line
    return line is not None and key in line.raw and normalise_line(key) in line.text


# --- every real log of INDEX.md ---------------------------------------------------------


def test_index_lists_every_log_file() -> None:
    listed = {row.file for row in ROWS}
    assert listed == {path.name for path in LOGS.glob("*.log")} - {
        "vllm-startup-8x-rtxpro6000-glm51-nvfp4.log"
    }


@pytest.mark.parametrize("row", ROWS, ids=[row.file for row in ROWS])
def test_real_log_is_classified_as_indexed(row: IndexRow) -> None:
    diagnosis = diagnose_log(read_log(row.file))

    if row.category == "ready":
        assert diagnosis.state == READY
        assert diagnosis.failure is None
    elif row.benign:
        assert diagnosis.state not in (FAILED, HUNG)
        assert diagnosis.failure is None
        assert all(note.entry.severity == "info" for note in diagnosis.notes)
    else:
        assert diagnosis.state in (FAILED, HUNG)
        assert diagnosis.failure == row.expected_class
    assert key_is_on(row.key, diagnosis), (row.key, diagnosis.line)
    assert diagnosis.remedy.strip()
    assert diagnosis.source.strip()


@pytest.mark.parametrize("row", ROWS, ids=[row.file for row in ROWS])
def test_real_log_version_only_when_the_log_states_it(row: IndexRow) -> None:
    text = read_log(row.file)
    body = text.split("\n", 1)[1]  # the first line is provenance, not log
    stated = re.match(r"\d+\.\d+[\w.]*", row.version)

    version = diagnose_log(text).version

    if stated and stated.group(0) in body:
        assert version == stated.group(0)
    else:
        assert version is None


def test_full_tp8_startup_is_ready_with_its_dev_version() -> None:
    diagnosis = diagnose_log(read_log("vllm-startup-8x-rtxpro6000-glm51-nvfp4.log"))

    assert diagnosis.state == READY
    assert diagnosis.version == "0.20.2rc1.dev249+glmkimirebase20260514"
    assert {p.name for p in diagnosis.phases} == set(PHASE_NAMES)
    # The shared-memory stalls during its torch.compile are pointed out, not a hang.
    assert "shm" in {note.entry.id for note in diagnosis.notes}


def test_log_fragment_that_stops_early_is_no_conclusion() -> None:
    text = read_log("vllm-serve-log-fragment-8x-rtxpro6000-v0.13.0.txt")

    diagnosis = diagnose_log(text)

    assert diagnosis.state == NO_CONCLUSION
    assert diagnosis.phase == "args"
    assert diagnosis.version == "0.13.0"
    assert diagnosis.suspect == "host-oom-killer"


@pytest.mark.parametrize(
    ("name", "expected"),
    [
        (
            "oom-2.log",
            {
                "tried_to_allocate": "896.00 MiB",
                "gpu": 4,
                "capacity": "79.25 GiB",
                "free": "768.00 KiB",
                "tried_to_allocate_gib": 0.875,
            },
        ),
        (
            "oom-4.log",
            {
                "tried_to_allocate": "224.00 MiB",
                "gpu": 0,
                "capacity": "10.73 GiB",
                "allocated": "9.85 GiB",
                "free": "46.44 MiB",
            },
        ),
        (
            "free-memory-1.log",
            {
                "free_gib": 31.44,
                "total_gib": 47.38,
                "gpu_memory_utilization": 0.95,
                "desired_gib": 45.01,
            },
        ),
        (
            "kv-cache-too-small-4.log",
            {
                "max_seq_len": 100000,
                "kv_cache_needed": "4.26 GiB",
                "kv_cache_available": "4.25 GiB",
            },
        ),
        ("port-in-use-1.log", {"address": "0.0.0.0", "port": 8000}),
        (
            "quant-capability-1.log",
            {"method": "fp8", "min_capability": 90, "current_capability": 86},
        ),
        ("nccl-4.log", {"source_line": 164, "cuda_error": "invalid argument"}),
        ("unknown-arg-2.log", {"arguments": "--disable-log-requests"}),
        ("model-not-found-2.log", {"repository": "xcodec_tps25_0215"}),
        ("trust-remote-code-2.log", {"repository": "/workspace/amd/MiniMax-M2.1-MXFP4"}),
        ("shm-1.log", {"seconds": 60}),
    ],
)
def test_numbers_parsed_from_real_logs(name: str, expected: dict[str, object]) -> None:
    numbers = diagnose_log(read_log(name)).numbers

    assert {key: numbers.get(key) for key in expected} == expected


def test_backend_reasons_parsed_per_backend() -> None:
    numbers = diagnose_log(read_log("no-backend-1.log")).numbers

    assert numbers["reasons"]["TRITON_MLA"] == ["sparse not supported"]
    assert numbers["reasons"]["FLASHMLA_SPARSE"] == ["compute capability not supported"]
    assert len(numbers["reasons"]["FLASH_ATTN_MLA"]) == 3
    assert numbers["use_mla"] == "True" and numbers["head_size"] == 576


def test_remedies_use_parsed_numbers() -> None:
    assert "--disable-log-requests" in diagnose_log(read_log("unknown-arg-2.log")).remedy
    assert "sport = :8000" in diagnose_log(read_log("port-in-use-1.log")).remedy
    assert (
        "fp8 needs compute capability 90" in diagnose_log(read_log("quant-capability-1.log")).remedy
    )
    assert "--disable-custom-all-reduce" in diagnose_log(read_log("nccl-4.log")).remedy
    assert "opsbook run 02_config_patch" in diagnose_log(read_log("fp8kv-mla-1.log")).remedy


# --- mangling -----------------------------------------------------------------------------

V1_KV_ERROR = (
    "(EngineCore_DP0 pid=412) ERROR 03-12 10:11:12 [core.py:708] ValueError: To serve at "
    "least one request with the model's max seq len (262144), (17.16 GiB KV cache is needed, "
    "which is larger than the available KV cache memory (9.72 GiB). Based on the available "
    "memory, the estimated maximum model length is 148464. Try increasing "
    "`gpu_memory_utilization` or decreasing `max_model_len` when initializing the engine."
)


def test_ansi_codes_with_and_without_escape_are_removed() -> None:
    escaped = (
        "\x1b[1;36m(EngineCore_DP0 pid=412)\x1b[0;0m \x1b[31mERROR\x1b[0m 03-12 10:11:12 "
        "[core.py:708] ValueError: x"
    )
    pasted = "[1;36m(EngineCore_DP0 pid=412)[0;0m ERROR 03-12 10:11:12 [core.py:708] ValueError: x"

    assert normalise_line(escaped) == "ValueError: x"
    assert normalise_line(pasted) == "ValueError: x"


@pytest.mark.parametrize("name", ["kv-cache-too-small-1.log", "nccl-2.log", "ready-4.log"])
def test_markdown_quoted_log_reads_like_the_original(name: str) -> None:
    text = read_log(name)
    quoted = "\n".join("> " + line for line in text.split("\n"))

    original, pasted = diagnose_log(text), diagnose_log(quoted)

    assert (pasted.state, pasted.failure, pasted.phase) == (
        original.state,
        original.failure,
        original.phase,
    )
    assert pasted.line is not None and original.line is not None
    assert pasted.line.text == original.line.text
    assert pasted.line.raw == "> " + original.line.raw


# The ways a whole log arrives quoted: every physical line gets the same decoration.
QUOTINGS = {
    "markdown list": lambda line: "  " + line,
    "bullet": lambda line: "- " + line if line.strip() else line,
    "quote and indent": lambda line: ">    " + line,
    "docker -t": lambda line: "2025-03-12T10:11:12.123456789Z " + line,
    "journalctl": lambda line: "Mar 12 10:11:12 gpu-node-1 vllm[4242]: " + line,
    "kubectl --prefix": lambda line: "[pod/vllm-0/vllm] " + line,
    "ansi": lambda line: "\x1b[0m" + line + "\x1b[0m",
    "colour codes without ESC": lambda line: "[0;36m" + line + "[0m",
    "table row": lambda line: "| " + line + " |" if line.strip() else line,
    "compose with time": lambda line: "vllm-1  | 2025-03-12T10:11:12.123Z " + line,
    "docker json-file": lambda line: json.dumps({"log": line + "\n", "stream": "stdout"}),
}


@pytest.mark.parametrize("quoting", sorted(QUOTINGS))
@pytest.mark.parametrize(
    "name", ["kv-cache-too-small-1.log", "nccl-2.log", "ready-4.log", "engine-dead-1.log"]
)
def test_a_log_quoted_line_by_line_reads_like_the_original(name: str, quoting: str) -> None:
    text = read_log(name)
    # The provenance line is opsbook's, not the log's: it stays as it is.
    quoted = "\n".join(
        line if line.startswith("# ") else QUOTINGS[quoting](line) for line in text.split("\n")
    )

    original, pasted = diagnose_log(text), diagnose_log(quoted)

    assert (pasted.state, pasted.failure, pasted.phase) == (
        original.state,
        original.failure,
        original.phase,
    )
    assert pasted.line is not None and original.line is not None
    assert (pasted.line.number, pasted.line.text) == (original.line.number, original.line.text)


def test_prefixes_of_every_vllm_generation_are_removed() -> None:
    cases = {
        "INFO 10-12 00:26:58 launcher.py:27] Route: /docs": "Route: /docs",
        "(VllmWorker rank=0 pid=12409) INFO 07-09 14:34:25 [cuda.py:221] Using x": "Using x",
        "(RayWorkerWrapper pid=301, ip=172.2.1.7) ERROR 04-18 01:30:29 [w.py:620] E: x": "E: x",
        "[rank0]: NotImplementedError: y": "NotImplementedError: y",
        "vllm-1  | ERROR 11-18 18:07:28 engine.py:366] ValueError: z": "ValueError: z",
        "(APIServer pid=1) INFO:     Application startup complete.": "Application startup "
        "complete.",
        "(Worker pid=350) (Worker pid=357) WARNING 05-15 05:34:08 [s.py:66] w": "w",
        "2025-07-09 14:34:19,913 - INFO - flashinfer.jit: Prebuilt": "flashinfer.jit: Prebuilt",
        "**(Worker_TP4 pid=25) ERROR 12-29 15:21:11 [m.py:751] ValueError: v**": "ValueError: v",
        "[multiproc_executor.py:492] ValueError: w": "ValueError: w",
    }
    for line, message in cases.items():
        assert normalise_line(line) == message, line


@pytest.mark.parametrize(
    ("line", "message"),
    [
        # A container runtime's RFC 3339 time (docker logs -t, kubectl logs --timestamps);
        # the line's own indentation stays.
        ("2024-07-30T07:27:23.496792960Z ValueError: x", "ValueError: x"),
        ('2024-07-30T07:27:23Z   File "/a.py", line 1, in f', 'File "/a.py", line 1, in f'),
        ("2025-01-02T03:04:05.123+02:00 INFO 01-02 03:04:05 [core.py:1] y", "y"),
        # A vLLM prefix with a year (NVIDIA NIM's build).
        ("ERROR 2025-07-21 14:34:24.934 factory.py:62] Bfloat16 is only", "Bfloat16 is only"),
        # A terminal log viewer's box around each line.
        ("│ ERROR 09-27 06:46:46 engine.py:157] RuntimeError: z      │", "RuntimeError: z"),
        ("┃ INFO 09-27 06:46:46 engine.py:157] w ┃", "w"),
        # A line pasted as Markdown inline code.
        ("`/x/ops.so: undefined symbol: _ZN3c10`", "/x/ops.so: undefined symbol: _ZN3c10"),
    ],
)
def test_prefixes_of_container_runtimes_viewers_and_markdown_are_removed(
    line: str, message: str
) -> None:
    assert normalise_line(line) == message


@pytest.mark.parametrize(
    ("line", "message"),
    [
        # A space typed before the process prefix; a log indented in a Markdown list.
        (" (EngineCore_DP0 pid=32) ERROR 09-17 01:05:51 [core.py:720] KeyError: x", "KeyError: x"),
        ("    (Worker_TP0 pid=6) ERROR 05-06 06:47:41 [m.py:852] KeyError: x", "KeyError: x"),
        # Markdown bold after indentation, quote marks, bullets, a table cell, inline code.
        ("  **ValueError: Bfloat16 is only supported**", "ValueError: Bfloat16 is only supported"),
        ("> - `ValueError: x`", "ValueError: x"),
        ("* (APIServer pid=1) ERROR 01-02 03:04:05 [a.py:1] KeyError: x", "KeyError: x"),
        ("1. RuntimeError: y", "RuntimeError: y"),
        ("| RuntimeError: y |", "RuntimeError: y"),
        ("> > **RuntimeError: y**", "RuntimeError: y"),
        # A colour code whose ESC a paste dropped, before vLLM's worker prefix.
        (
            "[1;36m(VllmWorker rank=0 pid=5)[0;0m ERROR 01-02 03:04:05 [a.py:1] KeyError: x",
            "KeyError: x",
        ),
        # Ray's prefixes: an actor's, a daemon's (no pid), its Python and C++ (glog) lines.
        ("(RayWorkerWrapper pid=301, ip=172.2.1.7) KeyError: x", "KeyError: x"),
        ("(raylet, ip=10.0.0.2) [2024-05-01 10:11:12,345 E 1 2] node.cc:3: y", "y"),
        ("2024-05-01 10:11:12,345\tINFO worker.py:1 -- Connecting to Ray", "Connecting to Ray"),
        ("E0501 10:11:12.345678 123 core_worker.cc:1] z", "z"),
        # PyTorch's C++ log line behind a rank prefix.
        ("[rank1]:[E1203 10:11:12.345678 12 ProcessGroupNCCL.cpp:616] [Rank 1] w", "[Rank 1] w"),
        # journalctl, kubectl --prefix, loguru, a bracketed date.
        (
            "Dec 03 10:11:12 gpu1 vllm[1234]: ERROR 12-03 10:11:12 [core.py:1] KeyError: z",
            "KeyError: z",
        ),
        ("[pod/vllm-0/vllm] INFO 12-03 10:11:12 [a.py:1] Route: /health", "Route: /health"),
        (
            "glm-78f968cf54-6c78t modelserver (EngineCore pid=11) ERROR 09-19 19:20:03 "
            "[core.py:1378] RuntimeError: w",
            "RuntimeError: w",
        ),
        (
            "2024-05-01 10:11:12.345 | ERROR    | xinference.core:load:12 - RuntimeError: w",
            "RuntimeError: w",
        ),
        ("[2024-05-01 10:11:12] RuntimeError: w", "RuntimeError: w"),
        # Structured records: docker's json-file driver, a JSON logger.
        (
            '{"log":"ValueError: x\\n","stream":"stderr","time":"2025-01-01T00:00:00Z"}',
            "ValueError: x",
        ),
        ('{"level": "error", "message": "RuntimeError: y"}', "RuntimeError: y"),
        # A web page's HTML entities, an issue title's tag, pytest's failure marker.
        (
            "Cannot find any model weights with &#39;/m&#39;",
            "Cannot find any model weights with '/m'",
        ),
        ("[Bug]: ValueError: z", "ValueError: z"),
        ("KeyError: ‘rope_type’", "KeyError: 'rope_type'"),
        ("E       RuntimeError: CUDA error: w", "RuntimeError: CUDA error: w"),
    ],
)
def test_the_ways_an_issue_quotes_a_log_line_are_removed(line: str, message: str) -> None:
    assert normalise_line(line) == message


def test_indentation_of_a_traceback_s_source_lines_is_kept_apart_from_prefixes() -> None:
    text = "\n".join(
        [
            "  Traceback (most recent call last):",
            '    File "/v/a.py", line 1, in f',
            "      raise Unsupported(msg)",
            "  Unsupported: Observed exception",
        ]
    )

    lines = read_log_lines(text)

    assert [line.is_code for line in lines] == [False, True, True, False]
    assert lines[3].exception
    assert diagnose_log(text).line == lines[3]


@pytest.mark.parametrize(
    ("sentence", "text"),
    [
        (
            "and error occur: ValueError: Bfloat16 is only supported",
            "ValueError: Bfloat16 is only supported",
        ),
        ("I get `KeyError: 'rope_type'` when loading the model", "KeyError: 'rope_type'"),
        ("报错信息如下：RuntimeError: CUDA error: x", "RuntimeError: CUDA error: x"),
    ],
)
def test_an_exception_quoted_in_a_sentence_reads_as_the_exception(sentence: str, text: str) -> None:
    (line,) = read_log_lines(sentence)

    assert (line.text, line.exception) == (text, True)


@pytest.mark.parametrize(
    "line",
    [
        "I keep getting the following ValueError:",
        "(APIServer pid=1) ERROR 01-02 03:04:05 [a.py:1] Error in preprocessing: ValueError: x",
        "RuntimeError: Worker failed with error 'ValueError: x', please check the stack trace",
    ],
)
def test_a_logged_line_or_a_bare_name_keeps_its_text(line: str) -> None:
    assert read_log_lines(line)[0].text == normalise_line(line)


def test_the_prefix_year_and_a_runtime_time_stamp_the_line() -> None:
    nim, runtime = read_log_lines(
        "ERROR 2025-07-21 14:34:24.934 factory.py:62] x\n2024-07-30T07:27:23.4965Z y"
    )

    assert (nim.level, nim.timestamp) == ("ERROR", datetime(2025, 7, 21, 14, 34, 24))
    assert runtime.timestamp == datetime(2024, 7, 30, 7, 27, 23)


@pytest.mark.parametrize(
    ("shown", "text"),
    [
        ('ValueError("type fp8e4nv not supported")', "ValueError: type fp8e4nv not supported"),
        ("triton.CompilationError('bad')", "triton.CompilationError: bad"),
        ('ValueError("cut by the excerpt', "ValueError: cut by the excerpt"),
    ],
)
def test_an_exception_shown_as_its_repr_reads_as_its_message(shown: str, text: str) -> None:
    (line,) = read_log_lines(f"(Worker_TP1 pid=77) ERROR 10-08 09:19:30 [m.py:671] {shown}")

    assert line.text == text
    assert diagnose_log(line.raw).failure == "unrecognised-error"


def test_a_compose_prefix_before_a_process_prefix_is_removed() -> None:
    line = "vllm  | (Worker_TP1 pid=77) ERROR 10-08 09:19:30 [m.py:671] KeyError: 'x'"

    (read,) = read_log_lines(line)

    assert (read.text, read.process, read.level) == ("KeyError: 'x'", "Worker_TP1 pid=77", "ERROR")


def test_a_line_broken_after_its_prefix_is_joined_but_a_frame_is_not() -> None:
    text = "\n".join(
        [
            "(EngineCore_DP0 pid=559) ERROR 10-20 03:20:46 [multiproc_executor.py:149]",
            "  Worker proc VllmWorker-7 died unexpectedly, shutting down executor.",
            "(EngineCore_DP0 pid=559) ERROR 10-20 03:20:46 [core.py:1]",
            '  File "/v/core.py", line 1, in run',
        ]
    )

    lines = read_log_lines(text)

    assert [line.number for line in lines] == [1, 3, 4]
    assert lines[0].text == "Worker proc VllmWorker-7 died unexpectedly, shutting down executor."
    assert lines[0].process == "EngineCore_DP0 pid=559"


def test_the_message_logged_above_a_traceback_is_the_reported_line() -> None:
    # logger.exception(msg): the message, then the traceback, which ends in a frame here.
    text = "\n".join(
        [
            "ERROR 2025-07-21 14:34:24.934 factory.py:62] The engine factory could not build "
            "the engine for this profile.",
            "Traceback (most recent call last):",
            '  File "/opt/nim/factory.py", line 51, in run',
            "    engine = build()",
        ]
    )
    other_process = text.replace("ERROR 2025", "(Worker pid=3) ERROR 2025", 1)

    diagnosis = diagnose_log(text)

    assert (diagnosis.failure, diagnosis.line and diagnosis.line.number) == (
        "unrecognised-error",
        1,
    )
    assert (line := diagnose_log(other_process).line) is not None and line.number == 2


def test_an_error_typed_into_a_markdown_heading_is_read_but_a_comment_is_not() -> None:
    # Issue templates put "### ..." above each answer; reporters type the error on that line.
    error = "CUDA error: no kernel image is available for execution on the device"
    heading = f"### I get this during model loading: torch.AcceleratorError: {error}"
    comment = f"# e.g. {error}"

    diagnosis = diagnose_log(heading)

    assert diagnosis.failure == "cuda-arch-unsupported"
    assert diagnosis.line is not None and diagnosis.line.raw == heading
    assert diagnose_log(comment).failure is None
    body = "RuntimeError: Failed to infer device type"
    assert diagnose_log(f"{comment}\n{body}\n").failure == "no-device"


def test_terminal_wrapped_lines_are_joined() -> None:
    lines = read_log_lines(read_log("kv-cache-too-small-4.log"))

    error = next(line for line in lines if line.text.startswith("ValueError"))

    assert error.number == 18
    assert error.raw.count("\n") == 1
    assert "(4.26 GiB KV cache is needed, which is larger" in error.text
    assert [line.number for line in lines if line.text.startswith("ValueError")] == [18]


def test_log_wrapped_at_a_fixed_width_keeps_its_diagnosis() -> None:
    width = 90
    text = "\n".join(
        "\n".join(line[i : i + width] for i in range(0, max(len(line), 1), width))
        for line in [
            "INFO 03-12 10:11:10 [gpu_model_runner.py:1] Starting to load model m...",
            "INFO 03-12 10:11:11 [default_loader.py:1] Loading weights took 2.48 seconds",
            V1_KV_ERROR,
            "ERROR 03-12 10:11:13 [core.py:1] EngineCore failed to start.",
        ]
    )

    diagnosis = diagnose_log(text)

    assert diagnosis.failure == "kv-cache-too-small"
    assert diagnosis.numbers["estimated_max_model_len"] == 148464
    assert diagnosis.line is not None and diagnosis.line.number == 3


def test_crlf_and_progress_bar_redraws() -> None:
    text = (
        "INFO 03-12 10:11:12 [a.py:1] Starting to load model m...\r\n"
        "(EngineCore_DP0 pid=4) \rLoading safetensors checkpoint shards:   0% 0/4\r"
        "Loading safetensors checkpoint shards: 100% 4/4\r\n"
    )

    lines = read_log_lines(text)

    assert lines[1].text == "Loading safetensors checkpoint shards: 100% 4/4"
    assert [p.name for p in phases(text)] == ["weights"]


# --- the wrapper / root cause rule ------------------------------------------------------


def test_unknown_exception_is_a_generic_failure_but_not_after_ready() -> None:
    error = "ERROR 03-12 10:11:15 [serving.py:1] KeyError: 'choices'"
    ready = "INFO:     Application startup complete."

    assert diagnose_log(error).failure == "unrecognised-error"
    assert diagnose_log(ready + "\n" + error).state == READY
    assert diagnose_log(error + "\n" + ready).state == READY


# --- benign look-alikes ------------------------------------------------------------------


def test_benign_free_memory_report_raises_nothing() -> None:
    text = (
        "(Worker_TP0 pid=554) INFO 08-30 03:01:53 [gpu_worker.py:970] Free memory on device "
        "(39.01/39.67 GiB) on startup. Desired GPU memory utilization is (0.87, 34.52 GiB). "
        "Actual usage is 22.28 GiB.\nINFO:     Application startup complete."
    )

    diagnosis = diagnose_log(text)

    assert (diagnosis.state, diagnosis.failure) == (READY, None)
    assert [note.entry.id for note in diagnosis.notes] == ["free-memory-info"]


STALL = (
    "(EngineCore pid=2) INFO 08-13 11:{m:02d}:02 [shm_broadcast.py:802] No available shared "
    "memory broadcast block found in 60 seconds. This typically happens when some processes "
    "are hanging or doing some time-consuming work (e.g. compilation)."
)
COMPILE = "(Worker pid=3) INFO 08-13 11:{m:02d}:30 [backends.py:1] Dynamo bytecode transform time"
KV = "(Worker pid=3) INFO 08-13 11:{m:02d}:40 [gpu_worker.py:1] Available KV cache memory: 9 GiB"


def test_shm_stall_during_compile_then_progress_is_benign() -> None:
    text = "\n".join([COMPILE.format(m=1), STALL.format(m=2), KV.format(m=3)])

    diagnosis = diagnose_log(text, running=True)

    assert (diagnosis.state, diagnosis.phase) == (LOADING, "kv-cache")
    assert [note.entry.id for note in diagnosis.notes] == ["shm"]


@pytest.mark.parametrize(
    "stalls",
    [
        [STALL.format(m=2)],  # the last line of the log
        [STALL.format(m=m) for m in (2, 3, 4)] + ["(Worker pid=3) INFO 08-13 11:04:05 [x.py:1] y"],
    ],
)
def test_shm_stall_last_or_persistent_is_a_hang(stalls: list[str]) -> None:
    diagnosis = diagnose_log("\n".join([COMPILE.format(m=1), *stalls]))

    assert (diagnosis.state, diagnosis.failure) == (HUNG, "shm")
    assert not diagnosis.ok


# --- logs that stop without an error; the kernel log -----------------------------------

STOPPED = "\n".join(
    [
        "INFO 03-12 10:11:10 [api_server.py:1] vLLM API server version 0.11.2",
        "INFO 03-12 10:11:12 [gpu_model_runner.py:1] Starting to load model /models/kimi...",
        "Loading safetensors checkpoint shards:  31% Completed | 37/119 [05:01<11:02, 8.08s/it]",
    ]
)
DMESG = (
    "[12345.678901] python3 invoked oom-killer: gfp_mask=0x140cca(GFP_HIGHUSER_MOVABLE)\n"
    "[12345.679001] Out of memory: Killed process 4242 (python3) total-vm:912345678kB, "
    "anon-rss:503316480kB, file-rss:0kB, shmem-rss:0kB, UID:0 pgtables:1000kB oom_score_adj:0\n"
)


def test_kernel_log_names_the_oom_kill() -> None:
    kills = classify_kernel_log(DMESG)

    assert [(k.pid, k.process, k.line_no, k.anon_rss_kb) for k in kills] == [
        (4242, "python3", 2, 503316480)
    ]
    assert classify_kernel_log("[1.0] usb 1-1: new high-speed USB device") == []


def test_kernel_log_turns_a_stopped_log_into_host_oom_killer() -> None:
    diagnosis = diagnose_log(STOPPED, running=False, kernel_log=DMESG)

    assert (diagnosis.state, diagnosis.failure, diagnosis.phase) == (
        FAILED,
        "host-oom-killer",
        "weights",
    )
    assert diagnosis.numbers["pid"] == 4242


@pytest.mark.parametrize(
    "last",
    ["Killed", "[1]+  Killed                  vllm serve /models/m", "vllm-1 exited with code 137"],
)
def test_a_log_that_ends_in_a_sigkill_report_is_the_host_oom_killer(last: str) -> None:
    text = "\n".join(
        [
            "INFO 06-10 06:16:42 [core.py:65] Initializing a V1 LLM engine (v0.9.0.1) with config",
            "INFO 06-10 06:16:50 [loader.py:1] Loading safetensors checkpoint shards:  40% 2/5",
            last,
        ]
    )

    diagnosis = diagnose_log(text)

    assert (diagnosis.state, diagnosis.failure) == (FAILED, "host-oom-killer")
    assert diagnosis.line is not None and diagnosis.line.number == 3
    assert "dmesg" in diagnosis.remedy
    assert diagnose_log(text, running=True).state == LOADING


def test_a_compose_exit_report_and_a_qualified_exception_are_never_wrapped_pieces() -> None:
    head = "vllm-1  | (APIServer pid=1) ERROR 01-02 03:04:05 [api_server.py:123] Error in loading"
    pieces = ["vllm-1 exited with code 137", "huggingface_hub.errors.OfflineModeIsEnabled: x"]

    for piece in pieces:
        assert len(read_log_lines(head + "\n" + piece)) == 2, piece


def test_oom_phase_comes_from_the_last_phase_seen() -> None:
    oom = (
        "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB. GPU 3 has a "
        "total capacity of 94.97 GiB of which 1.2 GiB is free."
    )
    loading = "INFO 03-12 10:11:12 [m.py:1] Starting to load model x..."
    loaded = "INFO 03-12 10:11:20 [m.py:1] Model loading took 60.1 GiB and 8.0 seconds"
    graphs = "Capturing CUDA graphs (decode, FULL):  40%|████      | 20/51"

    def stage(*lines: str) -> object:
        return diagnose_log("\n".join(lines)).numbers.get("phase")

    assert stage(loading, oom) == "loading"
    assert stage(loading, loaded, oom) == "profiling"
    assert stage(loading, loaded, graphs, oom) == "graph capture"
    assert stage(oom) is None


def test_backend_reasons_with_nested_brackets_and_a_truncated_tail() -> None:
    text = (
        "Reasons: {FLASHINFER_MLA: [FlashInfer MLA kernel requires qk_nope_head_dim in "
        "[64, 128, 192], but got 96, compute capability not supported], TRITON_MLA: [sparse "
        "not supported], FLASHM"
    )

    assert parse_backend_reasons(text) == {
        "FLASHINFER_MLA": [
            "FlashInfer MLA kernel requires qk_nope_head_dim in [64, 128, 192], but got 96",
            "compute capability not supported",
        ],
        "TRITON_MLA": ["sparse not supported"],
    }


# --- version, phases, timestamps ----------------------------------------------------------


@pytest.mark.parametrize(
    ("line", "version"),
    [
        ("INFO 11-20 10:00:00 api_server.py:585] vLLM API server version 0.6.4", "0.6.4"),
        (
            "(EngineCore_DP0 pid=420) INFO 11-28 15:27:27 [core.py:93] Initializing a V1 LLM "
            "engine (v0.11.2) with config: model='m'",
            "0.11.2",
        ),
        (
            "INFO 11-18 18:07:00 llm_engine.py:249] Initializing an LLM engine (v0.6.4.post1) "
            "with config: model='Qwen'",
            "0.6.4.post1",
        ),
        ("vLLM version 0.9.1", "0.9.1"),
        (
            "(APIServer pid=1) INFO 05-15 05:33:37 [utils.py:306]  ▄▄ ▄█ █     █     █ ▀▄▀ █  "
            "version 0.20.2rc1.dev249+glm",
            "0.20.2rc1.dev249+glm",
        ),
        ("INFO 07-09 14:34:25 [pynccl.py:69] vLLM is using nccl==2.21.5", None),
        ("Using a slow image processor... default behavior in v4.52", None),
    ],
)
def test_version_extraction(line: str, version: str | None) -> None:
    assert find_version(read_log_lines(line)) == version


def test_phases_and_timestamps_of_a_v1_startup() -> None:
    found = phases(read_log("ready-4.log"))

    assert [p.name for p in found] == [
        "args",
        "engine-config",
        "weights",
        "backend",
        "compile",
        "kv-cache",
        "graphs",
        "engine-ready",
        "http",
        "ready",
    ]
    by_name = {p.name: p for p in found}
    assert by_name["args"].first_line_no == 5
    # The log's Python-logging lines carry the year; vLLM's own prefix does not.
    assert by_name["args"].timestamp == datetime(2025, 11, 28, 15, 27, 15)
    assert by_name["engine-ready"].timestamp == datetime(2025, 11, 28, 15, 28, 13)
    # Uvicorn's line has no time: the phase starts no earlier than the last stamped line.
    assert by_name["ready"].timestamp == datetime(2025, 11, 28, 15, 28, 15)


def test_timestamps_of_v0_prefixes_use_the_placeholder_year() -> None:
    found = phases(read_log("port-in-use-1.log"))

    assert found[0].name == "http"
    assert found[0].timestamp == datetime(2000, 10, 12, 0, 26, 58)


def test_logs_without_timestamps_have_none() -> None:
    found = phases(
        "Capturing CUDA graphs (FULL): 100%| 2/2\nINFO:     Application startup complete"
    )

    assert [(p.name, p.first_line_no, p.timestamp) for p in found] == [
        ("graphs", 1, None),
        ("ready", 2, None),
    ]


def test_a_log_across_new_year_keeps_time_increasing() -> None:
    text = (
        "INFO 12-31 23:59:50 [a.py:1] Starting to load model m\n"
        "INFO 01-01 00:00:20 [a.py:1] Model loading took 1 GiB"
    )

    first, second = read_log_lines(text)

    assert first.timestamp is not None and second.timestamp is not None
    assert (second.timestamp - first.timestamp).total_seconds() == 30


# --- presentation and the catalogue --------------------------------------------------------


def test_diagnosis_renders_as_json_text_html_and_result() -> None:
    diagnosis = diagnose_log(read_log("oom-2.log"))

    data = json.loads(json.dumps(diagnosis.to_dict()))
    assert data["failure"] == "oom" and data["line"]["number"] == 2
    assert "oom" in str(diagnosis) and "remedy:" in str(diagnosis)
    assert "CUDA out of memory" in diagnosis._repr_html_()
    result = diagnosis.to_result()
    assert isinstance(result, Result) and not result.ok
    assert result.findings[0].subject == "oom"


ROUTES = "\n".join(
    [
        "(APIServer pid=7) INFO 05-06 21:00:46 [core.py:1] init engine (profile, create kv "
        "cache, warmup model) took 50.1 seconds",
        "(APIServer pid=7) INFO 05-06 21:00:52 [api_server.py:602] Starting vLLM server on "
        "http://0.0.0.0:8000",
        "(APIServer pid=7) INFO 05-06 21:00:52 [launcher.py:37] Available routes are:",
        "(APIServer pid=7) INFO 05-06 21:00:52 [launcher.py:46] Route: /health, Methods: GET",
    ]
)


def test_the_route_list_is_not_ready_when_something_follows_or_the_process_is_known() -> None:
    later = ROUTES + "\n(APIServer pid=7) INFO 05-06 21:00:53 [x.py:1] Shutting down"

    assert diagnose_log(later).state == NO_CONCLUSION
    assert diagnose_log(ROUTES, running=False).state == NO_CONCLUSION
    assert diagnose_log(ROUTES, running=True).state == LOADING


def test_a_route_list_cut_inside_the_next_line_prefix_or_followed_by_prose_is_serving() -> None:
    cut = ROUTES + "\n(APIServer pid=7) INFO 05-06 21"
    quoted = ROUTES + "\n\nThe server then lists its routes and is ready."

    for text in (cut, quoted):
        diagnosis = diagnose_log(text)
        assert diagnosis.state == READY
        assert diagnosis.line is not None and diagnosis.line.number == 2


def test_a_route_list_with_nothing_of_the_startup_before_it_is_the_same_proof_of_ready() -> None:
    # vLLM lists the routes only after the engine client and the app exist (launcher.py
    # serve_http), whether or not the excerpt shows the startup above them.
    fragment = "\n".join(ROUTES.split("\n")[1:])

    diagnosis = diagnose_log("```\n" + fragment)

    assert diagnosis.state == READY
    assert diagnose_log("```\n" + fragment, running=False).state == NO_CONCLUSION


def test_the_ready_line_is_startup_complete_not_the_address_after_it() -> None:
    text = "\n".join(
        [
            "INFO:     Started server process [9264]",
            "INFO:     Application startup complete.",
            "INFO:     Uvicorn running on http://localhost:5500 (Press CTRL+C to quit)",
        ]
    )
    alone = "INFO:     Uvicorn running on http://localhost:5500 (Press CTRL+C to quit)"

    assert (line := diagnose_log(text).line) is not None and line.number == 2
    assert (line := diagnose_log(alone).line) is not None and line.number == 1


def test_ready_diagnosis_is_ok_and_serialises_phases() -> None:
    diagnosis = diagnose_log(read_log("ready-3.log"))

    data = diagnosis.to_dict()

    assert diagnosis.ok and diagnosis.to_result().ok
    assert data["phases"][0] == {"name": "args", "line_no": 6, "timestamp": "2000-06-10T06:16:19"}


def test_catalogue_entries_are_complete() -> None:
    catalogue = load_catalogue()
    ids = [entry.id for entry in catalogue]

    assert len(ids) == len(set(ids))
    for entry in catalogue:
        assert entry.patterns and entry.remedy.strip() and entry.source.strip(), entry.id
        assert entry.severity in SEVERITIES
    required = {
        "fp8kv-mla",
        "no-backend",
        "oom",
        "kv-cache-too-small",
        "free-memory",
        "port-in-use",
        "trust-remote-code",
        "nccl",
        "custom-allreduce",
        "quant-capability",
        "safetensors-corrupt",
        "shm",
        "unknown-arg",
        "model-not-found",
        "host-oom-killer",
        "engine-dead",
    }
    assert required <= set(ids)
    # A class outside the shared failure ids is reported under one of them.
    for entry in catalogue:
        assert entry.family is None or entry.family in ids, entry.id


def test_an_error_retyped_in_lower_case_is_still_recognised() -> None:
    line = (
        "valueerror: loading internvl2-8b/ requires you to execute the configuration file in "
        "that repo on your local machine."
    )

    diagnosis = diagnose_log(line)

    assert (diagnosis.failure, diagnosis.line and diagnosis.line.number) == ("trust-remote-code", 1)
    # Only a line with no capital letter at all is read without case.
    assert diagnose_log("Loading x Requires you to execute the configuration file").state != FAILED


def test_an_error_raised_in_resolve_trust_remote_code_is_named_by_its_frame() -> None:
    # An excerpt cut inside the message: the raising frame says which refusal it is.
    text = "\n".join(
        [
            "Traceback (most recent call last):",
            '  File "/env/transformers/dynamic_module_utils.py", line 678, in '
            "resolve_trust_remote_code",
            "    raise ValueError(",
            "ValueError: Loading deepse",
        ]
    )

    diagnosis = diagnose_log(text)

    assert diagnosis.failure == "trust-remote-code"
    assert diagnosis.line is not None and diagnosis.line.number == 4
    assert diagnose_log("ValueError: Loading deepse").failure == "unrecognised-error"


def test_parsed_values_of_the_new_signatures() -> None:
    devices = diagnose_log(
        "AssertionError: local_world_size (16) must be less than or equal to the number of "
        "visible devices (8)."
    )
    missing_file = diagnose_log(
        "requests.exceptions.HTTPError: 404 Client Error: Not Found for url: "
        "https://huggingface.co/org/m/resolve/main/config.json"
    )

    assert (devices.numbers["world_size"], devices.numbers["gpu_count"]) == (16, 8)
    assert "needs 16 GPUs and this host has 8" in devices.remedy
    assert missing_file.failure == "model-not-found"
    assert missing_file.numbers["repository"] == "org/m"


def test_too_few_gpus_for_ray_is_refused_or_waited_for() -> None:
    # vLLM ray_utils.py raises "The number of required GPUs exceeds the total number of
    # available GPUs in the placement group." (0.2-0.4, and with the counts since 0.10.2)
    # but in between logs it as a warning and waits for Ray to place the workers.
    message = (
        "The number of required GPUs exceeds the total number of available GPUs in the "
        "placement group."
    )
    waiting = (
        "INFO 03-18 11:21:42 ray_utils.py:214] Waiting for creating a placement group of specs "
        "for 10 seconds. specs=[{'GPU': 1.0}, {'GPU': 1.0}]."
    )

    raised = diagnose_log("ValueError: " + message)
    warned = diagnose_log(f"WARNING 03-18 11:21:32 ray_utils.py:320] {message}\n{waiting}")

    assert raised.failure == "not-enough-devices"
    assert warned.failure == "ray-resources"


def test_levelled_vllm_lines_without_a_phase_are_an_unfinished_startup() -> None:
    wait = (
        "(APIServer pid=3) DEBUG 09-02 17:29:{s} [utils.py:777] Waiting for 1 local, 0 remote "
        "core engine proc(s) to start."
    )
    text = "\n".join([wait.format(s="06"), wait.format(s="16"), "", "It hangs here."])

    diagnosis = diagnose_log(text)

    assert diagnosis.state == NO_CONCLUSION and diagnosis.phase is None
    assert diagnosis.line is not None and diagnosis.line.number == 2
    assert "without an error" in diagnosis.title
    assert diagnose_log(text, running=True).state == LOADING


# vLLM 0.10.2 vllm/distributed/device_communicators/pynccl_wrapper.py NCCL_CHECK:
# raise RuntimeError(f"NCCL error: {error_str}"), with NCCL's ncclGetErrorString text.
NCCL_TRACEBACK = [
    '  File "/x/vllm/distributed/device_communicators/pynccl_wrapper.py", line 272, in NCCL_CHECK',
    '    raise RuntimeError(f"NCCL error: {error_str}")',
    "RuntimeError: NCCL error: unhandled system error (run with NCCL_DEBUG=INFO for details)",
]


def test_a_deployments_bracketed_tag_before_each_line_is_removed() -> None:
    text = "\n".join("[vllm]: [rank0]: " + line for line in NCCL_TRACEBACK)

    lines = read_log_lines(text)
    diagnosis = diagnose_log(text)

    assert lines[1].is_code and lines[2].process == "rank0"
    assert diagnosis.failure == "nccl"
    assert diagnosis.line is not None and diagnosis.line.number == 3


def test_the_logging_howto_format_with_a_logger_name_is_a_prefix() -> None:
    # docs.python.org logging HOWTO: "%(asctime)s - %(name)s - %(levelname)s - %(message)s".
    prefix = "2025-06-27 12:57:51,690 - __main__ - INFO - "

    assert normalise_line(prefix + NCCL_TRACEBACK[2]) == NCCL_TRACEBACK[2]
    assert read_log_lines(prefix + NCCL_TRACEBACK[1])[0].is_code
    assert read_log_lines(prefix + "x")[0].level == "INFO"


def test_a_bracketed_level_is_a_level_not_a_deployments_tag() -> None:
    line = read_log_lines("[ERROR]: ValueError: x")[0]

    assert (line.level, line.text) == ("ERROR", "ValueError: x")


def test_an_excerpt_starting_inside_a_relayed_traceback_reports_its_exception() -> None:
    # vLLM 0.20.2 vllm/v1/executor/multiproc_executor.py: logger.exception("WorkerProc failed
    # to start.") relays the worker's traceback with the ERROR prefix on every line; torch's
    # torch/cuda/__init__.py _lazy_init raises the driver's error.
    prefix = "(Worker pid=3{n}) ERROR 03-13 08:47:26 [multiproc_executor.py:870] "
    text = "\n".join(
        prefix.format(n=n) + body
        for n, body in [
            (3, "    torch.cuda.set_device(device)"),
            (3, '  File "/x/torch/cuda/__init__.py", line 424, in _lazy_init'),
            (3, "    torch._C._cuda_init()"),
            (3, "RuntimeError: Unexpected error from cudaGetDeviceCount(). Error 802"),
            (2, "WorkerProc failed to start."),
            (2, "Traceback (most recent call last):"),
        ]
    )

    lines = read_log_lines(text)
    diagnosis = diagnose_log(text)

    assert [line.is_code for line in lines[:4]] == [True, True, True, False]
    assert diagnosis.failure == "unrecognised-error"
    assert diagnosis.line is not None and diagnosis.line.number == 4


def test_a_wrappers_own_error_line_after_the_last_progress_is_an_unrecognised_error() -> None:
    # A program that runs vLLM logs its own level in brackets and its component; only its
    # own error is in the text. A line that opens a list, and the list's items, are not the
    # statement of the error.
    text = "\n".join(
        [
            "2026-05-08 11:50:18.715 [Error] (Server) This usually means:",
            "2026-05-08 11:50:18.715 [Error] (Server)   - Missing drivers",
            "2026-05-08 11:50:23.733 [Warn] (Manager) Process did not respond to SIGTERM",
            "2026-05-08 11:50:25.739 [Error] (Router) Failed to load model: start timed out",
            "2026-05-08 11:50:25.741 [Info] (Server) Unloading model...",
        ]
    )

    lines = read_log_lines(text)
    diagnosis = diagnose_log(text)

    assert [line.level for line in lines] == ["ERROR", "ERROR", "WARNING", "ERROR", "INFO"]
    assert diagnosis.state == FAILED and diagnosis.failure == "unrecognised-error"
    assert diagnosis.line is not None and diagnosis.line.number == 4


def test_a_paste_that_lost_its_line_breaks_is_read_line_by_line() -> None:
    # vLLM 0.10.2 vllm/v1/engine/core.py: "EngineCore failed to start." above the engine
    # core's traceback; the paste ran every prefixed line into one.
    text = (
        "(EngineCore_DP0 pid=7) ERROR 03-12 10:11:12 [core.py:718] EngineCore failed to start."
        "(EngineCore_DP0 pid=7) ERROR 03-12 10:11:12 [core.py:718] Traceback (most recent call "
        "last):(EngineCore_DP0 pid=7) ERROR 03-12 10:11:12 [core.py:718]     raise "
        'ValueError("x")(EngineCore_DP0 pid=7) ERROR 03-12 10:11:12 [core.py:718] ValueError: '
        "No available memory for the cache blocks."
    )

    lines = read_log_lines(text)
    diagnosis = diagnose_log(text)

    assert len(lines) == 4 and {line.number for line in lines} == {1}
    assert lines[2].is_code
    assert diagnosis.failure == "kv-cache-too-small"
    assert diagnosis.line is not None and diagnosis.line.raw.startswith("(EngineCore_DP0")
    assert diagnosis.line.raw.endswith("cache blocks.")


def test_an_error_line_of_a_process_known_alive_leaves_it_loading() -> None:
    text = "\n".join(
        [
            "INFO 05-06 21:00:41 [gpu_model_runner.py:1] Starting to load model org/model...",
            "ERROR 05-06 21:00:42 [x.py:1] Failed to load optional kernel y",
        ]
    )

    assert diagnose_log(text, running=True).state == LOADING
    assert diagnose_log(text).failure == "unrecognised-error"


@pytest.mark.parametrize("stamp", ["E0106", "E20260106"])
def test_a_glog_line_with_or_without_the_year_is_an_error_record(stamp: str) -> None:
    # google/glog src/logging.cc LogMessage::Init: severity letter, the year when
    # FLAGS_log_year_in_prefix (true by default in 0.7 src/flags.cc), month, day, time,
    # thread id, "file:line] ".
    (line,) = read_log_lines(f"{stamp} 06:43:02.966156  5793 transport.cpp:820] Connect timeout")

    assert (line.level, line.text) == ("ERROR", "Connect timeout")
    assert line.timestamp is not None and (line.timestamp.month, line.timestamp.day) == (1, 6)
