"""Unit tests of opsbook.knowledge.logscan on the real vLLM logs of tests/data/logs and on mangled
copies.

Real logs are checked against tests/data/logs/INDEX.md (category and key line), parsed here.
Key-line comparison: the key must be an exact substring of the reported line's ``raw`` text
(the original text as in the file, so ``grep -F`` finds it), and ``normalise_line(key)`` must
be a substring of the reported line's normalised ``text`` (prefixes, ANSI codes, quote
markers removed and terminal-wrapped pieces joined).
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


def test_ansi_coloured_failure_is_classified() -> None:
    text = "\x1b[1;36m" + V1_KV_ERROR.replace(") ERROR", ")\x1b[0;0m ERROR")

    diagnosis = diagnose_log(text)

    assert diagnosis.failure == "kv-cache-too-small"
    assert diagnosis.numbers["estimated_max_model_len"] == 148464
    assert "--max-model-len 148464" in diagnosis.remedy


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


@pytest.mark.parametrize(
    "line",
    [
        "huggingface_hub.utils._http.OfflineModeIsEnabled: Cannot reach https://x: offline",
        "torch._dynamo.exc.Unsupported: Observed exception",
        "ray.exceptions.RayTaskError(ValueError): ray::Worker.f() (pid=1, ip=10.0.0.2)",
        "KeyboardInterrupt",
        "requests.exceptions.ReadTimeout: HTTPSConnectionPool(host='huggingface.co')",
        "GracefulExit: stopped",
    ],
)
def test_exceptions_of_any_name_are_read_as_errors(line: str) -> None:
    diagnosis = diagnose_log(line)

    assert diagnosis.state == FAILED and diagnosis.line is not None
    assert diagnosis.line.raw == line


@pytest.mark.parametrize(
    "line",
    [
        "FutureWarning: `resume_download` is deprecated",
        "transformers.utils.hub.UserWarning: x",
        "Note: the model is large",
        "flashinfer.jit: Prebuilt kernels not found, using JIT backend",
    ],
)
def test_warnings_and_notes_are_not_exceptions(line: str) -> None:
    assert diagnose_log(line).state != FAILED


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


def test_a_dead_worker_is_reported_before_the_api_servers_wrapper() -> None:
    text = "\n".join(
        [
            "(EngineCore_DP0 pid=559) ERROR 10-20 03:20:46 [multiproc_executor.py:149] Worker "
            "proc VllmWorker-7 died unexpectedly, shutting down executor.",
            "(APIServer pid=1) ERROR 10-20 03:20:47 [async_llm.py:1] "
            "vllm.v1.engine.exceptions.EngineDeadError: EngineCore encountered an issue.",
        ]
    )

    diagnosis = diagnose_log(text)

    assert (diagnosis.failure, diagnosis.line and diagnosis.line.number) == ("engine-dead", 1)


@pytest.mark.parametrize(
    "line",
    [
        "  Value error, Unknown quantization method: . Must be one of ['awq', 'fp8']",
        "  Assertion failed, max_model_len must be positive",
        "/env/vllm/activation_ops.cpython-310-x86_64-linux-gnu.so: undefined symbol: _ZN3c10",
        "libcudart.so.12: cannot open shared object file: No such file or directory",
    ],
)
def test_error_lines_without_an_exception_name_are_errors(line: str) -> None:
    diagnosis = diagnose_log(line)

    assert (diagnosis.state, diagnosis.failure) == (FAILED, "unrecognised-error")
    assert diagnosis.line is not None and diagnosis.line.raw == line


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


def test_a_stall_before_a_closing_code_fence_is_the_last_line() -> None:
    text = "```\n" + STALL.format(m=2) + "\n```\n"

    assert (diagnose_log(text).state, diagnose_log(text).failure) == (HUNG, "shm")


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


def test_a_single_wrapped_line_is_joined_to_its_prefixed_head() -> None:
    text = (
        "(EngineCore_DP0 pid=7) ERROR 03-12 10:11:12 [core.py:1] ValueError: Free memory on devi\n"
        "ce cuda:0 (3.1/79.2 GiB) on startup is less than desired GPU memory utilization "
        "(0.9, 71.3 GiB). Decrease GPU memory utilization.\n"
    )

    diagnosis = diagnose_log(text)

    assert diagnosis.failure == "free-memory"
    assert diagnosis.numbers["device"] == "cuda:0"
    assert diagnosis.numbers["free_gib"] == 3.1


def test_truncated_tail_still_classifies_and_falls_back_to_the_plain_remedy() -> None:
    cut = V1_KV_ERROR[: V1_KV_ERROR.index("Based on")]

    diagnosis = diagnose_log(cut)

    assert diagnosis.failure == "kv-cache-too-small"
    assert "estimated_max_model_len" not in diagnosis.numbers
    assert diagnosis.remedy.startswith("The memory left after the weights")


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

WRAPPER = (
    "(APIServer pid=9) RuntimeError: Engine core initialization failed. See root cause above. "
    "Failed core proc(s): {}"
)


def test_specific_cause_above_the_wrapper_is_reported() -> None:
    prefix = "(EngineCore_DP0 pid=4) ERROR 03-12 10:11:12 [core.py:1] "
    text = "\n".join(
        [
            prefix + "EngineCore failed to start.",
            prefix + "Traceback (most recent call last):",
            prefix + '  File "/v/triton_mla.py", line 63, in __init__',
            prefix + "    raise NotImplementedError(",
            prefix + "NotImplementedError: TritonMLA V1 with FP8 KV cache not yet supported",
            WRAPPER,
        ]
    )

    diagnosis = diagnose_log(text)

    assert diagnosis.failure == "fp8kv-mla"
    assert diagnosis.line is not None and diagnosis.line.number == 5
    assert diagnosis.wrapper is not None and diagnosis.wrapper.number == 6


@pytest.mark.parametrize(
    "wrapper",
    [
        WRAPPER,
        "vllm.v1.engine.exceptions.EngineDeadError: EngineCore encountered an issue. See stack "
        "trace (above) for the root cause.",
    ],
)
def test_wrapper_alone_is_engine_dead(wrapper: str) -> None:
    text = "\n".join(["Traceback (most recent call last):", '  File "x.py", line 1, in f', wrapper])

    diagnosis = diagnose_log(text)

    assert (diagnosis.state, diagnosis.failure) == (FAILED, "engine-dead")
    assert diagnosis.line is not None and diagnosis.line.number == 3
    assert "earlier" in diagnosis.remedy


def test_source_lines_of_a_traceback_never_identify_a_failure() -> None:
    text = "\n".join(
        [
            '  File "/v/worker.py", line 493, in raise_if_cache_size_invalid',
            '    raise ValueError("No available memory for the cache blocks. "',
        ]
    )

    assert diagnose_log(text).failure is None


def test_unknown_exception_is_a_generic_failure_but_not_after_ready() -> None:
    error = "ERROR 03-12 10:11:15 [serving.py:1] KeyError: 'choices'"
    ready = "INFO:     Application startup complete."

    assert diagnose_log(error).failure == "unrecognised-error"
    assert diagnose_log(ready + "\n" + error).state == READY
    assert diagnose_log(error + "\n" + ready).state == READY


def test_catalogued_failure_after_ready_wins() -> None:
    text = "INFO:     Application startup complete.\nERROR:    [Errno 98] address already in use"

    assert diagnose_log(text).failure == "port-in-use"


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


def test_log_that_stops_mid_phase_is_no_conclusion_with_a_suspect() -> None:
    diagnosis = diagnose_log(STOPPED)

    assert (diagnosis.state, diagnosis.phase) == (NO_CONCLUSION, "weights")
    assert diagnosis.suspect == "host-oom-killer"
    assert "dmesg" in diagnosis.remedy


def test_running_process_makes_the_same_log_loading() -> None:
    diagnosis = diagnose_log(STOPPED, running=True)

    assert (diagnosis.state, diagnosis.phase, diagnosis.suspect) == (LOADING, "weights", None)
    assert diagnosis.ok


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


def test_a_kill_after_an_error_keeps_the_error() -> None:
    text = "AssertionError: Torch not compiled with CUDA enabled\nKilled"

    assert diagnose_log(text).failure == "unrecognised-error"


def test_log_that_stops_after_nccl_init_suspects_nccl() -> None:
    text = STOPPED.rsplit("\n", 1)[0] + (
        "\n(Worker_TP0 pid=5) INFO 03-12 10:11:13 [pynccl.py:69] vLLM is using nccl==2.21.5"
    )

    assert diagnose_log(text).suspect == "nccl"


def test_text_that_is_not_a_vllm_log() -> None:
    diagnosis = diagnose_log("hello\nworld\n")

    assert (diagnosis.state, diagnosis.line, diagnosis.phase) == (NO_CONCLUSION, None, None)
    assert diagnosis.remedy


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


def test_fp8_kv_refused_by_triton_mla_in_the_reasons_is_fp8kv_mla() -> None:
    text = (
        "ValueError: No valid attention backend found for cuda with AttentionSelectorConfig("
        "head_size=576, dtype=torch.bfloat16, kv_cache_dtype=fp8_e4m3, block_size=None, "
        "use_mla=True, has_sink=False, use_sparse=False). Reasons: {FLASHMLA: [compute "
        "capability not supported], TRITON_MLA: [kv_cache_dtype not supported]}."
    )

    diagnosis = diagnose_log(text)

    assert diagnosis.failure == "fp8kv-mla"
    assert diagnosis.numbers["kv_cache_dtype"] == "fp8_e4m3"
    assert diagnosis.numbers["reasons"]["TRITON_MLA"] == ["kv_cache_dtype not supported"]


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


def test_a_log_that_ends_in_the_route_list_is_serving() -> None:
    diagnosis = diagnose_log(ROUTES)

    assert diagnosis.state == READY
    assert diagnosis.line is not None and diagnosis.line.number == 2
    assert "routes" in diagnosis.title


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


def test_a_levelled_line_after_the_route_list_still_ends_the_serving_proof() -> None:
    later = ROUTES + "\nsome prose\n(APIServer pid=7) WARNING 05-06 21:00:53 [x.py:1] Shutting down"

    assert diagnose_log(later).state == NO_CONCLUSION


def test_a_route_list_with_nothing_of_the_startup_before_it_is_the_same_proof_of_ready() -> None:
    # vLLM lists the routes only after the engine client and the app exist (launcher.py
    # serve_http), whether or not the excerpt shows the startup above them.
    fragment = "\n".join(ROUTES.split("\n")[1:])

    diagnosis = diagnose_log("```\n" + fragment)

    assert diagnosis.state == READY
    assert diagnose_log("```\n" + fragment, running=False).state == NO_CONCLUSION


def test_a_redacted_product_name_still_names_the_serving_address() -> None:
    redacted = ROUTES.replace("Starting vLLM server", "Starting v<HOST> server")

    diagnosis = diagnose_log(redacted)

    assert diagnosis.state == READY
    assert diagnosis.line is not None and "Starting v<HOST> server on" in diagnosis.line.raw


def test_a_second_run_after_a_failed_one_is_the_one_diagnosed() -> None:
    # The first run's start is cut from the excerpt; the second has only argparse's lines.
    text = "\n".join(
        [
            "ValueError: Loading org/model requires you to execute the configuration file in "
            "that repo on your local machine.",
            "INFO 04-14 13:59:19 [__init__.py:239] Automatically detected platform cuda.",
            "usage: vllm [-h] [-v] {chat,complete,serve,bench} ...",
            "vllm: error: unrecognized arguments: trust_remote_code=True",
        ]
    )

    diagnosis = diagnose_log(text)

    assert (diagnosis.failure, diagnosis.first_line) == ("unknown-arg", 3)
    assert diagnosis.earlier_counts == {FAILED: 1}


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


@pytest.mark.parametrize(
    ("line", "error_class", "remedy"),
    [
        (
            "ValueError: Bfloat16 is only supported on GPUs with compute capability of at least "
            "8.0. Your Tesla T4 GPU has compute capability 7.5. You can use float16 instead by "
            "explicitly setting the `dtype` flag in CLI, for example: --dtype=half.",
            "dtype-unsupported",
            "--dtype half",
        ),
        (
            "ValueError: Unknown quantization method: gptq_marlin24. Must be one of ['awq'].",
            "quantization-unknown",
            '"gptq_marlin24"',
        ),
        (
            "ValueError: Model architectures ['LlamaModel'] are not supported for now. "
            "Supported architectures: dict_keys(['LlamaForCausalLM'])",
            "architecture-unsupported",
            "upgrade vLLM",
        ),
        (
            "ImportError: /env/vllm/_C.abi3.so: undefined symbol: _ZN3c104cuda9SetDeviceEi",
            "broken-install",
            "Reinstall vLLM",
        ),
        (
            "RuntimeError: CUDA error: an illegal memory access was encountered",
            "illegal-memory-access",
            "CUDA_LAUNCH_BLOCKING=1",
        ),
        (
            "ValueError: max_num_batched_tokens (2048) is smaller than max_model_len (8192). "
            "This effectively limits the maximum sequence length to max_num_batched_tokens.",
            "batched-tokens-below-model-len",
            "--max-num-batched-tokens 8192",
        ),
        (
            "ModuleNotFoundError: No module named 'deep_gemm'",
            "missing-package",
            "The module deep_gemm is not installed",
        ),
        ("ModuleNotFoundError: No module named 'vllm._C'", "broken-install", "Reinstall vLLM"),
        (
            "RuntimeError: CUDA driver version is insufficient for CUDA runtime version",
            "cuda-driver-too-old",
            "upgrade the NVIDIA driver",
        ),
        (
            "/usr/bin/ld: cannot find -lcuda: No such file or directory",
            "libcuda-link",
            "TRITON_LIBCUDA_PATH",
        ),
        (
            "AssertionError: Error in memory profiling. Initial free memory 70.1 GiB, current "
            "free memory 75.3 GiB. This happens when other processes sharing the same container "
            "release GPU memory while vLLM is profiling during initialization.",
            "memory-profiling-changed",
            "alone on its GPUs",
        ),
        (
            "TimeoutError: Timed out waiting for engine core processes to start. This is often "
            "caused by slow weight loading for large models. Waited 600s (configured by "
            "VLLM_ENGINE_READY_TIMEOUT_S).",
            "engine-start-timeout",
            "VLLM_ENGINE_READY_TIMEOUT_S",
        ),
        (
            '(Worker_TP0 pid=6) ERROR 05-06 06:47:41 [m.py:852] ValueError("type fp8e4nv not '
            "supported in this architecture. The supported fp8 dtypes are ('fp8e4b15', 'fp8e5')\")",
            "fp8-unsupported-gpu",
            "--kv-cache-dtype auto",
        ),
    ],
)
def test_a_known_class_outside_the_shared_ids_is_an_unrecognised_error_with_its_remedy(
    line: str, error_class: str, remedy: str
) -> None:
    diagnosis = diagnose_log(line)

    assert (diagnosis.failure, diagnosis.error_class) == ("unrecognised-error", error_class)
    assert remedy in diagnosis.remedy
    assert diagnosis.to_dict()["error_class"] == error_class
    assert f"unrecognised-error ({error_class})" in str(diagnosis)


def test_a_known_class_under_a_wrapper_is_the_root_cause() -> None:
    text = "\n".join(
        [
            "(EngineCore_DP0 pid=5) ERROR 01-02 03:04:05 [core.py:1] ValueError: Bfloat16 is "
            "only supported on GPUs with compute capability of at least 8.0.",
            "(APIServer pid=1) ERROR 01-02 03:04:06 [a.py:1] RuntimeError: Engine core "
            "initialization failed. See root cause above.",
        ]
    )

    diagnosis = diagnose_log(text)

    assert (diagnosis.failure, diagnosis.error_class) == ("unrecognised-error", "dtype-unsupported")
    assert diagnosis.line is not None and diagnosis.line.number == 1


def test_a_known_class_under_a_ray_death_keeps_the_ray_class() -> None:
    text = "\n".join(
        [
            "(RayWorkerWrapper pid=7, ip=10.0.0.2) ERROR 01-02 03:04:05 [w.py:1] RuntimeError: "
            "CUDA error: an illegal memory access was encountered",
            "ray.exceptions.ActorDiedError: The actor died unexpectedly before finishing this "
            "task.",
        ]
    )

    diagnosis = diagnose_log(text)

    assert (diagnosis.failure, diagnosis.error_class) == ("ray-node-died", "illegal-memory-access")
    assert diagnosis.line is not None and diagnosis.line.number == 1
    assert "CUDA_LAUNCH_BLOCKING" in diagnosis.remedy


def test_an_error_the_catalogue_does_not_know_has_no_class() -> None:
    diagnosis = diagnose_log("KeyError: 'rope_type'")

    assert (diagnosis.failure, diagnosis.error_class) == ("unrecognised-error", None)


@pytest.mark.parametrize(
    ("line", "failure"),
    [
        (
            "safetensors_rust.SafetensorError: Error while deserializing header: "
            "MetadataIncompleteBuffer",
            "safetensors-corrupt",
        ),
        (
            "safetensors_rust.SafetensorError: Error while deserializing header: HeaderTooLarge",
            "safetensors-corrupt",
        ),
        (
            "OSError: /models/x is not a local folder and is not a valid model identifier listed "
            "on 'https://huggingface.co/models'",
            "model-not-found",
        ),
        ("huggingface_hub.errors.GatedRepoError: 401 Client Error.", "hub-gated"),
        (
            "torch.distributed.DistNetworkError: The server socket has failed to listen on any "
            "local network address. port: 29500, useIpv6: false, code: -98, name: EADDRINUSE",
            "port-in-use",
        ),
        (
            # vLLM 0.34.0 vllm/distributed/device_communicators/shm_broadcast.py
            "RuntimeError: Insufficient space in /dev/shm for MessageQueue: 640 MiB required, "
            "60 MiB free. Increase /dev/shm (e.g. --shm-size or --ipc=host).",
            "shm-space",
        ),
        (
            "torch.distributed.DistBackendError: NCCL error in: ProcessGroupNCCL.cpp:1970, "
            "unhandled system error",
            "nccl",
        ),
        (
            "[rank1]:[E ProcessGroupNCCL.cpp:563] Watchdog caught collective operation timeout",
            "nccl-timeout",
        ),
        (
            "Failed: Cuda error /workspace/csrc/custom_all_reduce.cuh:455 'invalid argument'",
            "custom-allreduce",
        ),
        (
            "ValueError: Selected backend FLASHMLA is not valid for this configuration. Reason: "
            "['compute capability not supported']",
            "backend-invalid",
        ),
        ("NotImplementedError: FP8 Triton MLA not yet supported", "fp8kv-mla"),
        ("NotImplementedError: FlashAttnMLA V1 with FP8 KV cache not yet supported", "fp8kv-mla"),
        (
            "ValueError: The model's max seq len (32768) is larger than the maximum number of "
            "tokens that can be stored in KV cache (20000).",
            "kv-cache-too-small",
        ),
        ("api_server.py: error: unrecognized arguments: --foo", "unknown-arg"),
        # CPython 3.11 Lib/argparse.py: "%(prog)s: error: %(message)s" with ArgumentError's
        # "argument %(argument_name)s: %(message)s"; _check_value's "invalid choice: %(value)r
        # (choose from %(choices)s)" is a choice this vLLM lacks, _get_value's "invalid
        # %(type)s value: %(value)r" a malformed value of a known flag (not unknown-arg).
        (
            "vllm serve: error: argument --load-format: invalid choice: 'x' (choose from "
            "'auto', 'pt')",
            "unknown-arg",
        ),
        (
            "vllm serve: error: argument --kv-transfer-config: invalid from_cli value: '{bad'",
            "unrecognised-error",
        ),
        ("Out of memory: Killed process 4242 (python3) total-vm:1kB", "host-oom-killer"),
        # vLLM csrc/attention/attention_kernels.cu (TORCH_CHECK "Unsupported head size: ")
        ("RuntimeError: Unsupported head size: 32", "head-size-unsupported"),
        # vLLM default_loader.py "Cannot find any model weights with `{path}`", pasted into
        # Markdown inside a code span: the inner backticks are gone.
        (
            "Runner failed: RuntimeError('Cannot find any model weights with /models/m')",
            "no-weights",
        ),
        # huggingface_hub _validators.py: "Repo id must be a string, not {type}: '{repo_id}'."
        (
            "huggingface_hub.errors.HFValidationError: Repo id must be a string, not <class "
            "'pathlib.PosixPath'>: '/models/m'.",
            "model-not-found",
        ),
        # transformers utils/hub.py: "{path_or_repo_id} does not appear to have a file named
        # {filename}. Checkout 'https://huggingface.co/{path_or_repo_id}/tree/{revision}' ..."
        (
            "OSError: org/m does not appear to have a file named config.json. Checkout "
            "'https://huggingface.co/org/m/tree/main' for available files.",
            "model-not-found",
        ),
        # vLLM 0.12.0-0.17.1 gpu_worker.py: "local_world_size (%d) must be less than or equal
        # to the number of visible devices (%d)."
        (
            "AssertionError: local_world_size (16) must be less than or equal to the number of "
            "visible devices (8).",
            "not-enough-devices",
        ),
        # vLLM ray_utils.py "Placement group bundle cannot have more than 1 %s."
        ("ValueError: Placement group bundle cannot have more than 1 GPU.", "ray-resources"),
        # ray 2.49.0 python/ray/util/placement_group.py check_placement_group_index:
        # f"placement group bundle index {bundle_index} is invalid. Valid placement group
        # indexes: 0-{placement_group.bundle_count}"
        (
            "ValueError: placement group bundle index 3 is invalid. Valid placement group "
            "indexes: 0-2",
            "ray-resources",
        ),
        # vLLM 0.10.2 ray_distributed_executor.py, v0.2-0.9 ray_gpu_executor.py.
        (
            "ValueError: Ray does not allocate any GPUs on the driver node. Consider adjusting "
            "the Ray placement group or running the driver on a GPU node.",
            "ray-resources",
        ),
        # huggingface_hub 2.4.0 utils/_http.py (hf_request_event_hook: OfflineModeIsEnabled).
        (
            "huggingface_hub.errors.OfflineModeIsEnabled: Cannot reach https://huggingface.co/"
            "api/models/org/m: offline mode is enabled. To disable it, please unset the "
            "`HF_HUB_OFFLINE` environment variable.",
            "model-not-found",
        ),
        # DeepGEMM DGException through pybind11, quoted by vLLM's multiproc executor.
        (
            "RuntimeError: Worker failed with error 'Assertion error (/w/deepgemm-src/csrc/apis/"
            "gemm.hpp:56): Unsupported architecture', please check the stack trace above for "
            "the root cause",
            "cuda-arch-unsupported",
        ),
        # PyTorch's and Triton's checks of CUDA driver calls (cuGetErrorString's text).
        ("RuntimeError: CUDA driver error: out of memory", "oom"),
        # vLLM 0.4 quoted the path with plain quotes.
        ("RuntimeError: Cannot find any model weights with '/models/m'", "no-weights"),
        # PyTorch torch/cuda/__init__.py and c10/cuda/CUDAFunctions.cpp.
        ("RuntimeError: No CUDA GPUs are available", "no-device"),
        (
            "RuntimeError: Found no NVIDIA driver on your system. Please check that you have an "
            "NVIDIA GPU and installed a driver from http://www.nvidia.com/Download/index.aspx",
            "no-device",
        ),
        ("RuntimeError: Triton Error [CUDA]: out of memory", "oom"),
        # vLLM gpu_model_runner.py _dummy_sampler_run.
        (
            "RuntimeError: CUDA out of memory occurred when warming up sampler with 256 dummy "
            "requests. Please try lowering `max_num_seqs` or `gpu_memory_utilization` when "
            "initializing the engine.",
            "oom",
        ),
        # ray 2.60.0 _raylet.so (core worker).
        (
            "The actor is dead because its worker process has died. Worker exit type: SYSTEM_ERROR",
            "ray-node-died",
        ),
        # vLLM's FlashAttention 2 build.
        (
            "RuntimeError: This flash attention build does not support headdim not being a "
            "multiple of 32.",
            "head-size-unsupported",
        ),
        (
            "RuntimeError: CUDA error: peer access is not supported between these two devices",
            "custom-allreduce",
        ),
    ],
)
def test_catalogue_signatures(line: str, failure: str) -> None:
    assert diagnose_log(line).failure == failure


def test_a_linker_error_above_the_wrapper_is_the_root_cause() -> None:
    text = "\n".join(
        [
            "/usr/bin/ld: cannot find -lnvrtc-builtins: No such file or directory",
            "collect2: error: ld returned 1 exit status",
            "ERROR 05-27 11:47:57 [core.py:396] EngineCore failed to start.",
            "RuntimeError: Engine core initialization failed. See root cause above.",
        ]
    )

    diagnosis = diagnose_log(text)

    assert diagnosis.failure == "unrecognised-error"
    assert diagnosis.root_cause is not None and diagnosis.root_cause.number == 1


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


def test_cuda_out_of_memory_seen_through_nccl_is_oom() -> None:
    # NVIDIA/nccl checks.h CUDACHECK: WARN("Cuda failure '%s'", ...), repeated by PyTorch
    # under "Last error:" after its own "NCCL error ... unhandled cuda error".
    worker = "(VllmWorker rank=7 pid=240) "
    text = "\n".join(
        [
            worker + "torch.distributed.DistBackendError: NCCL error in: NCCLUtils.cpp:133, "
            "unhandled cuda error (run with NCCL_DEBUG=INFO for details), NCCL version 2.21.5",
            worker + "ncclUnhandledCudaError: Call to CUDA function failed.",
            worker + "Last error:",
            worker + "Cuda failure 'out of memory'",
        ]
    )

    diagnosis = diagnose_log(text)

    assert diagnosis.failure == "oom"
    assert diagnosis.line is not None and diagnosis.line.number == 4


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


@pytest.mark.parametrize(
    "line",
    [
        "WARNING 07-09 14:34:25 [custom_all_reduce.py:146] Custom allreduce is disabled because "
        "your platform lacks GPU P2P capability or P2P test failed.",
        "(APIServer pid=2122) The argument `trust_remote_code` is to be used with Auto classes. "
        "It has no effect here and is ignored.",
        "(Worker pid=350) WARNING 05-15 05:34:08 [symm_mem.py:66] SymmMemCommunicator: Device "
        "capability 12.0 not supported, communicator is not available.",
        "/opt/venv/lib/python3.12/site-packages/torch/cuda/__init__.py:61: FutureWarning: The "
        "pynvml package is deprecated.",
        # vLLM 0.33.0 argparse_utils.py: what 0.10.2 raised is a warning now.
        "WARNING 06-30 23:14:18 [argparse_utils.py:257] With `vllm serve`, you should provide "
        "the model as a positional argument or in a config file instead of via the `--model` "
        "option. The `--model` option will be removed in a future version.",
        # transformers 5.19.0 quantizer_finegrained_fp8.py: dequantizes instead of refusing.
        "FP8 quantized models is only supported on GPUs with compute capability >= 8.9 (e.g "
        "4090/H100), actual = `8.0`. We will default to dequantizing the model to bf16. Feel free "
        "to use a different quantization method like bitsandbytes or torchao",
    ],
)
def test_expected_warnings_are_not_failures(line: str) -> None:
    assert diagnose_log(line).failure is None


# Where an unfinished startup stopped: its last record. The lines are vLLM's own format
# strings (vllm/v1/worker/gpu_model_runner.py 0.10.2 "Starting to load model %s...";
# vllm/v1/engine/utils.py 0.10.2-0.20.2 "Waiting for %d local, %d remote core engine proc(s)
# to start.", logged at DEBUG) rendered with sample values.
def test_an_unfinished_startup_names_its_last_levelled_line() -> None:
    text = "\n".join(
        [
            "(APIServer pid=7) INFO 05-06 21:00:40 [api_server.py:1] vLLM API server "
            "version 0.20.2",
            "(EngineCore pid=9) INFO 05-06 21:00:41 [gpu_model_runner.py:1] Starting to load "
            "model org/model...",
            "(EngineCore pid=9) WARNING 05-06 21:00:42 [x.py:1] Op 'y' not present in model",
            "(EngineCore",
            "",
            "The server never answers.",
        ]
    )

    diagnosis = diagnose_log(text)

    assert diagnosis.state == NO_CONCLUSION and diagnosis.failure is None
    assert diagnosis.line is not None and diagnosis.line.number == 3


def test_a_progress_bar_after_the_last_levelled_line_is_where_it_stopped() -> None:
    text = "\n".join(
        [
            "INFO 05-06 21:00:41 [gpu_model_runner.py:1] Starting to load model org/model...",
            "Loading safetensors checkpoint shards:  10% Completed | 1/10 [00:05<00:45,  5.0s/it]",
            "Loading safetensors checkpoint shards:  20% Completed | 2/10 [00:10<00:40,  5.0s/it]",
        ]
    )

    diagnosis = diagnose_log(text)

    assert diagnosis.state == NO_CONCLUSION
    assert diagnosis.line is not None and diagnosis.line.number == 3


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


def test_an_exception_line_cut_short_reads_as_its_raise_statements_message() -> None:
    # vLLM 0.10.2 vllm/v1/engine/utils.py wait_for_engine_startup:
    # raise RuntimeError("Engine core initialization failed. " "See root cause above. ...")
    text = "\n".join(
        [
            '  File "/x/vllm/v1/engine/utils.py", line 782, in wait_for_engine_startup',
            '    raise RuntimeError("Engine core initialization failed. "',
            "RuntimeError: Engine core ini",
        ]
    )

    diagnosis = diagnose_log(text)

    assert diagnosis.failure == "engine-dead"
    assert diagnosis.line is not None and diagnosis.line.number == 3


def test_an_exception_line_that_differs_from_its_raise_statement_is_kept() -> None:
    text = "\n".join(
        [
            '    raise RuntimeError("Engine core initialization failed. "',
            "ValueError: Engine core ini",
        ]
    )

    assert diagnose_log(text).failure == "unrecognised-error"


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


def test_an_error_line_before_later_startup_progress_does_not_fail_the_startup() -> None:
    text = "\n".join(
        [
            "ERROR 05-06 21:00:40 [x.py:1] Failed to import optional plugin foo",
            "INFO 05-06 21:00:41 [gpu_model_runner.py:1] Starting to load model org/model...",
        ]
    )

    diagnosis = diagnose_log(text)

    assert diagnosis.state == NO_CONCLUSION and diagnosis.failure is None


def test_a_command_line_programs_error_line_is_an_error_and_starts_a_line() -> None:
    # Triton Inference Server's FAIL_IF_ERR: std::cerr << "error: " << (MSG) << ": " << err,
    # after its glog lines (which a terminal-wrap guess must not join it to).
    glog = 'I1216 02:12:50.904936 179 server.cc:328] "Timeout 30: Found 0 live models and 0 x"'
    text = "\n".join([glog, glog, "error: creating server: Internal - failed to load all models"])

    diagnosis = diagnose_log(text)

    assert diagnosis.failure == "unrecognised-error"
    assert diagnosis.line is not None and diagnosis.line.number == 3


# vLLM 0.34.0 vllm/v1/engine/utils.py wait_for_engine_startup: the API server's wrapper.
STARTUP_WRAPPER = (
    "(APIServer pid=9) RuntimeError: Engine core initialization failed. See root cause above. "
    "Failed core proc(s): {}"
)


def test_an_exception_below_a_startup_wrapper_with_nothing_above_is_the_root_cause() -> None:
    # torch's own message (torch/cuda/__init__.py _lazy_init raises the driver's error),
    # written by the engine core after the API server's wrapper.
    below = "RuntimeError: Unexpected error from cudaGetDeviceCount(). Error 802"
    text = "\n".join([STARTUP_WRAPPER, "", below])

    diagnosis = diagnose_log(text)

    assert diagnosis.failure == "unrecognised-error"
    assert diagnosis.line is not None and diagnosis.line.number == 3
    assert diagnosis.wrapper is not None and diagnosis.wrapper.number == 1


def test_an_error_above_the_wrapper_wins_over_one_below() -> None:
    above = "(EngineCore_DP0 pid=8) ValueError: first"
    text = "\n".join([above, STARTUP_WRAPPER, "RuntimeError: later"])

    diagnosis = diagnose_log(text)

    assert diagnosis.line is not None and diagnosis.line.number == 1


def test_an_exception_below_a_dead_engine_while_serving_is_not_its_cause() -> None:
    # vLLM 0.10.2 vllm/v1/engine/exceptions.py EngineDeadError; the requests in flight are
    # cancelled after it.
    text = "\n".join(
        [
            "vllm.v1.engine.exceptions.EngineDeadError: EngineCore encountered an issue. See "
            "stack trace (above) for the root cause.",
            "RuntimeError: cancelled",
        ]
    )

    diagnosis = diagnose_log(text)

    assert diagnosis.failure == "engine-dead"


@pytest.mark.parametrize(
    ("message", "failure"),
    [
        # vLLM 0.10.2-0.34.0 vllm/model_executor/layers/quantization/utils/marlin_utils.py
        (
            "ValueError: Weight output_size_per_partition = 3696 is not divisible by  "
            "min_thread_n = 64. Consider reducing tensor_parallel_size or running with "
            "--quantization gptq.",
            "tp-not-divisible",
        ),
        # vLLM 0.34.0 vllm/distributed/utils.py verify_group_size_divides_partition
        (
            "ValueError: Weight input_size_per_partition=1848 for layer 'mlp.down_proj' is not "
            "divisible by group_size=128. This happens when tensor_parallel_size splits the "
            "layer input into shards that are not a whole number of quant groups.",
            "tp-not-divisible",
        ),
        # vLLM 0.11.2-0.34.0 utils/fp8_utils.py
        (
            "ValueError: Weight input_size_per_partition = 2368 is not divisible by weight "
            "quantization block_k = 128.",
            "tp-not-divisible",
        ),
        # vLLM 0.10.2-0.34.0 model_loader/runai_streamer_loader.py; bitsandbytes_loader.py
        (
            "RuntimeError: Cannot find any safetensors model weights with `/models/x`",
            "no-weights",
        ),
        ("RuntimeError: No model weights found in: `/models/x`", "no-weights"),
        # vLLM 0.10.2 vllm/config/cache.py; 0.11.2-0.34.0 vllm/utils/torch_utils.py
        ("ValueError: Unknown kv cache dtype: fp7", "invalid-kv-cache-dtype"),
        ("ValueError: Invalid kv cache dtype: fp7", "invalid-kv-cache-dtype"),
        # vLLM 0.10.2 vllm/executor/mp_distributed_executor.py
        (
            "RuntimeError: please set tensor_parallel_size (8) to less than max local gpu "
            "count (4)",
            "not-enough-devices",
        ),
        # vLLM 0.14.1-0.34.0 auto-fit of --max-model-len
        (
            "ValueError: Cannot auto-fit max_model_len: not enough GPU memory available to "
            "serve even a single token. Try increasing `gpu_memory_utilization`.",
            "kv-cache-too-small",
        ),
        # vLLM 0.20.2-0.34.0 vllm/vllm_flash_attn/cute/interface.py
        (
            "AssertionError: Unsupported compute capability: 7.5. Supported: 8.x, 9.x, 10.x",
            "cuda-arch-unsupported",
        ),
        # transformers 5.19.0 configuration_utils.py _get_config_dict; utils/hub.py
        (
            "OSError: Can't load the configuration of '/models/x'. If you were trying to load "
            "it from 'https://huggingface.co/models', make sure you don't have a local "
            "directory with the same name.",
            "model-not-found",
        ),
        (
            "OSError: We couldn't connect to 'https://huggingface.co' to load the files, and "
            "couldn't find them in the cached files.",
            "model-not-found",
        ),
    ],
)
def test_other_releases_and_loaders_wordings_are_their_classes(message: str, failure: str) -> None:
    diagnosis = diagnose_log("(EngineCore_DP0 pid=7) ERROR 03-12 10:11:12 [core.py:1] " + message)

    assert diagnosis.failure == failure, str(diagnosis)


def test_no_platform_detected_is_no_device() -> None:
    # vLLM 0.10.2 vllm/platforms/__init__.py logs it at INFO, later releases at DEBUG.
    text = "\n".join(
        [
            "INFO 05-14 04:44:35 [__init__.py:243] No platform detected, vLLM is running on "
            "UnspecifiedPlatform",
            "INFO 05-14 04:44:37 [api_server.py:1034] vLLM API server version 0.10.2",
        ]
    )

    diagnosis = diagnose_log(text)

    assert diagnosis.failure == "no-device"
    assert diagnosis.line is not None and diagnosis.line.number == 1


def test_a_pasted_comment_naming_an_error_does_not_end_a_run() -> None:
    text = "\n".join(
        [
            "# the run below fails with RuntimeError: Failed to infer device type",
            "INFO 05-14 04:44:36 [x.py:1] Loading model org/model",
            "INFO 05-14 04:44:37 [api_server.py:1034] vLLM API server version 0.10.2",
            "RuntimeError: Failed to infer device type",
        ]
    )

    diagnosis = diagnose_log(text)

    assert diagnosis.first_line == 1 and not diagnosis.earlier_counts
    assert diagnosis.failure == "no-device"


# vLLM 0.10.2-0.34.0 vllm/distributed/device_communicators/shm_broadcast.py, logged at WARNING.
SHM_STALL = (
    "(EngineCore_DP0 pid=7) WARNING 03-12 10:12:{s} [shm_broadcast.py:1] No available shared "
    "memory broadcast block found in 60 seconds. This typically happens when some processes "
    "are hanging or doing some time-consuming work (e.g. compilation, weight/kv cache "
    "quantization)."
)


def test_a_stall_that_ends_the_log_is_a_hang_even_with_a_reporters_words_under_it() -> None:
    text = "\n".join([SHM_STALL.format(s="11"), "", "It stays like this forever."])

    diagnosis = diagnose_log(text)

    assert (diagnosis.state, diagnosis.failure) == (HUNG, "shm")


def test_a_stall_followed_by_progress_is_not_a_hang() -> None:
    text = "\n".join(
        [
            SHM_STALL.format(s="11"),
            "Capturing CUDA graphs (mixed prefill-decode, PIECEWISE): 100%|##########| 67/67",
            "",
            "It then finishes.",
        ]
    )

    assert diagnose_log(text).state != HUNG


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


def test_v0s_engine_process_wrapper_reports_the_error_above_it() -> None:
    # vLLM 0.10.2 vllm/entrypoints/openai/api_server.py (build_async_engine_client_from_engine_args)
    text = "\n".join(
        [
            "ERROR 03-12 10:11:12 [engine.py:1] Failed to infer device type",
            "RuntimeError: Failed to infer device type",
            "RuntimeError: Engine process failed to start. See stack trace for the root cause.",
        ]
    )

    diagnosis = diagnose_log(text)

    assert diagnosis.failure == "no-device"
    assert diagnosis.wrapper is not None and diagnosis.wrapper.number == 3


def test_torchs_driver_initialization_failure_is_no_device() -> None:
    # pytorch c10/cuda/CUDAFunctions.cpp device_count_impl (cudaErrorInitializationError).
    text = "RuntimeError: CUDA driver initialization failed, you might not have a CUDA gpu."

    assert diagnose_log(text).failure == "no-device"


def test_the_grpc_servers_readiness_lines_are_ready() -> None:
    # vLLM 0.30.0 vllm/entrypoints/launchers/grpc_server.py, after server.start().
    text = "\n".join(
        [
            "(APIServer pid=7) INFO 05-06 21:00:40 [api_server.py:1] vLLM API server "
            "version 0.30.0",
            "(APIServer pid=7) INFO 05-06 21:00:52 [grpc_server.py:1] vLLM gRPC server started on "
            "0.0.0.0:50051",
            "(APIServer pid=7) INFO 05-06 21:00:52 [grpc_server.py:1] Server is ready to accept "
            "requests",
        ]
    )

    diagnosis = diagnose_log(text)

    assert diagnosis.state == READY


def test_an_error_line_of_a_process_known_alive_leaves_it_loading() -> None:
    text = "\n".join(
        [
            "INFO 05-06 21:00:41 [gpu_model_runner.py:1] Starting to load model org/model...",
            "ERROR 05-06 21:00:42 [x.py:1] Failed to load optional kernel y",
        ]
    )

    assert diagnose_log(text, running=True).state == LOADING
    assert diagnose_log(text).failure == "unrecognised-error"


def _tool_parser_error_after_an_answer(location: str) -> str:
    # vLLM 0.8.3 hermes_tool_parser.py extract_tool_calls: logger.exception("Error in
    # extracting tool call from response.") (its traceback under it, same prefix), then the
    # answer is returned as plain content; uvicorn's access line ('%s - "%s %s HTTP/%s" %d').
    prefix = f"ERROR 05-06 21:01:02 [{location}]"
    return "\n".join(
        [
            'INFO:     10.0.0.1:5000 - "POST /v1/chat/completions HTTP/1.1" 200 OK',
            f"{prefix} Error in extracting tool call from response.",
            f"{prefix} Traceback (most recent call last):",
            f'{prefix}   File "/v/json/decoder.py", line 1, in decode',
            f"{prefix} json.decoder.JSONDecodeError: Expecting value: line 1 column 1 (char 0)",
        ]
    )


def test_a_tool_parsers_logged_error_after_an_answered_request_is_still_serving() -> None:
    diagnosis = diagnose_log(_tool_parser_error_after_an_answer("hermes_tool_parser.py:110"))

    assert diagnosis.state == READY
    assert diagnosis.line is not None and '"POST /v1/chat/completions' in diagnosis.line.raw


def test_the_same_error_logged_by_another_module_is_no_proof_of_serving() -> None:
    diagnosis = diagnose_log(_tool_parser_error_after_an_answer("serving_chat.py:110"))

    assert diagnosis.state == FAILED


def _stats(prompt: float, generation: float) -> str:
    # vLLM 0.8.3 vllm/v1/metrics/loggers.py LoggingStatLogger.log: "Engine %03d: Avg prompt
    # throughput: %.1f tokens/s, Avg generation throughput: %.1f tokens/s, Running: %d reqs,
    # Waiting: %d reqs, GPU KV cache usage: %.1f%%, Prefix cache hit rate: %.1f%%".
    return (
        f"INFO 05-06 21:01:0{int(prompt) % 10} [loggers.py:87] Engine 000: Avg prompt throughput: "
        f"{prompt:.1f} tokens/s, Avg generation throughput: {generation:.1f} tokens/s, Running: "
        "1 reqs, Waiting: 0 reqs, GPU KV cache usage: 0.1%, Prefix cache hit rate: 0.0%"
    )


def test_the_first_stats_line_with_tokens_going_through_shows_serving() -> None:
    # A warning first: the screen keeps the routine lines next to a line of interest.
    warning = "WARNING 05-06 21:01:00 [x.py:1] something worth a look"
    text = "\n".join([warning, _stats(0, 0), _stats(3.9, 93.1)])

    diagnosis = diagnose_log(text)

    assert diagnosis.state == READY
    assert diagnosis.line is not None and diagnosis.line.number == 3


def test_a_post_answered_before_an_idle_stats_line_shows_serving() -> None:
    # uvicorn's access line ('%s - "%s %s HTTP/%s" %d').
    answered = 'INFO:     10.0.0.1:5000 - "POST /v1/completions HTTP/1.1" 200 OK'
    warning = "WARNING 05-06 21:01:00 [x.py:1] something worth a look"
    text = "\n".join([warning, answered, _stats(0, 0)])

    diagnosis = diagnose_log(text)

    assert diagnosis.state == READY
    assert diagnosis.line is not None and diagnosis.line.number == 2


@pytest.mark.parametrize("stamp", ["E0106", "E20260106"])
def test_a_glog_line_with_or_without_the_year_is_an_error_record(stamp: str) -> None:
    # google/glog src/logging.cc LogMessage::Init: severity letter, the year when
    # FLAGS_log_year_in_prefix (true by default in 0.7 src/flags.cc), month, day, time,
    # thread id, "file:line] ".
    (line,) = read_log_lines(f"{stamp} 06:43:02.966156  5793 transport.cpp:820] Connect timeout")

    assert (line.level, line.text) == ("ERROR", "Connect timeout")
    assert line.timestamp is not None and (line.timestamp.month, line.timestamp.day) == (1, 6)


def test_cann_s_message_under_interleaved_worker_tracebacks_is_the_failed_rank_s_cause() -> None:
    # vLLM's worker relays its traceback line by line at ERROR (multiproc_executor.py
    # worker_busy_loop: logger.exception("WorkerProc hit an exception.")); two ranks' lines
    # interleave, and the failed rank's exception text holds CANN's message, each line ending
    # in "[FUNC:%s][FILE:%s][LINE:%d]" (as vllm-project/vllm-ascend#3017 shows it).
    def rank(n: int, text: str) -> str:
        prefix = f"(VllmWorker rank={n} pid=1{n}) ERROR 08-21 08:26:21"
        return f"{prefix} [multiproc_executor.py:546] {text}"

    text = "\n".join(
        [
            rank(2, '  File "/t/graph_module.py", line 393, in __call__'),
            rank(
                1,
                "       rtStreamSynchronizeWithTimeout execute failed, reason=[x]"
                "[FUNC:FuncErrorReason][FILE:error_message_manage.cc][LINE:53]",
            ),
            rank(2, "    return self._wrapped_call(self, *args, **kwargs)"),
            rank(
                1,
                "       synchronize stream failed, runtime result = 107027"
                "[FUNC:ReportCallError][FILE:log_inner.cpp][LINE:161]",
            ),
            rank(7, "WorkerProc hit an exception."),
        ]
    )

    diagnosis = diagnose_log(text)

    assert diagnosis.failure == "unrecognised-error"
    assert diagnosis.line is not None and "rtStreamSynchronizeWithTimeout" in diagnosis.line.raw


# Python's ImportError for a .so the loader refuses (run here with CPython 3.11 on a built
# deep_gemm/_C.so: "ImportError: /tmp/d16so/deep_gemm/_C.so: undefined symbol: missing_fn").
_DEEP_GEMM_REFUSED = (
    "ImportError: /v/deep_gemm/_C.cpython-312-x86_64-linux-gnu.so: undefined symbol: _Z1fv"
)


def test_deep_gemm_s_refused_import_is_not_the_cause_when_another_error_follows() -> None:
    # vLLM 0.33.0 vllm/utils/deep_gemm.py _import_deep_gemm catches the ImportError; vLLM
    # 0.33.0 v1/engine/utils.py wait_for_engine_startup raises the wrapper.
    text = "\n".join(
        [
            _DEEP_GEMM_REFUSED,
            "KeyError: 'model.layers.1.mtp_block.norm.weight'",
            "RuntimeError: Engine core initialization failed. See root cause above. "
            "Failed core proc(s): {}",
        ]
    )

    diagnosis = diagnose_log(text)

    assert diagnosis.line is not None and "KeyError: 'model.layers.1" in diagnosis.line.raw


def test_deep_gemm_s_refused_import_alone_is_still_reported() -> None:
    diagnosis = diagnose_log(_DEEP_GEMM_REFUSED)

    assert diagnosis.line is not None and "deep_gemm/_C" in diagnosis.line.raw


def test_a_generation_logged_as_finished_shows_serving_before_a_later_stats_line() -> None:
    # Xinference 1.7.1.post1 xinference/model/llm/vllm/core.py: logger.info("Generate finished,
    # request_id: %s, stop reason: %s, prompt tokens: %s, completion tokens: %s, all tokens:
    # %s", ...), in Python logging's "%(asctime)s %(name)s %(process)d %(levelname)s" form.
    warning = "WARNING 05-06 21:01:00 [x.py:1] something worth a look"
    finished = (
        "2025-07-08 17:36:59,526 xinference.model.llm.vllm.core 458 INFO     Generate "
        "finished, request_id: r1, stop reason: stop, prompt tokens: 3, completion tokens: 2, "
        "all tokens: 5"
    )
    text = "\n".join([warning, finished, _stats(2.8, 0.1)])

    diagnosis = diagnose_log(text)

    assert diagnosis.state == READY
    assert diagnosis.line is not None and diagnosis.line.number == 2
