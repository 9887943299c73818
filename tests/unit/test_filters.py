"""The decision's choice by severity and process (issue 31, item 3): a warning is never the
failure when a known fatal error follows in the same startup, and an API server's error is
not the failure when the engine core recorded its death of another."""

from __future__ import annotations

from opsbook.knowledge import logscan

_START = """\
(APIServer pid=6) INFO 12-06 10:00:00 [api_server.py:1] vLLM API server version 0.11.0
(APIServer pid=6) INFO 12-06 10:00:00 [utils.py:1] non-default args: {'model': 'org/m', \
'tensor_parallel_size': 3}
"""
# The engine core's death of a stated, catalogued error (vLLM 0.11.0 vllm/v1/engine/core.py
# run_engine_core: logger.exception("EngineCore failed to start.") and the traceback).
_ENGINE_CORE_DIES = """\
(EngineCore_DP0 pid=7) ERROR 12-06 10:00:09 [core.py:708] EngineCore failed to start.
(EngineCore_DP0 pid=7) ERROR 12-06 10:00:09 [core.py:708] Traceback (most recent call last):
(EngineCore_DP0 pid=7) ERROR 12-06 10:00:09 [core.py:708]   File "/v/vllm/config.py", line 9, in f
(EngineCore_DP0 pid=7) ERROR 12-06 10:00:09 [core.py:708]     raise ValueError(msg)
(EngineCore_DP0 pid=7) ERROR 12-06 10:00:09 [core.py:708] ValueError: Total number of attention \
heads (40) must be divisible by tensor parallel size (3).
(APIServer pid=6) RuntimeError: Engine core initialization failed. See root cause above. \
Failed core proc(s): {}
"""
_KEY_LINE = "Total number of attention heads (40) must be divisible by tensor parallel size (3)."


def test_a_warning_then_a_fatal_error_is_the_error() -> None:
    # The warning matches a class that outranks the error's by the catalogue's order (equal
    # priority, earlier line): the severity decides, not the order.
    log = (
        _START
        + "(EngineCore_DP0 pid=7) WARNING 12-06 10:00:05 [utils.py:1] Address already in use "
        "for the side channel port 5557; picking another one\n" + _ENGINE_CORE_DIES
    )
    diagnosis = logscan.diagnose_log(log)
    assert diagnosis.failure == "tp-not-divisible"
    assert diagnosis.line is not None and _KEY_LINE in diagnosis.line.raw


def test_a_warning_with_no_error_after_it_stays_the_failure() -> None:
    log = (
        _START
        + "(EngineCore_DP0 pid=7) WARNING 12-06 10:00:05 [utils.py:1] Address already in use "
        "for port 8000\n"
    )
    diagnosis = logscan.diagnose_log(log, running=False)
    assert diagnosis.failure == "port-in-use"


def test_an_uncatalogued_exception_after_a_catalogued_warning_keeps_the_warning() -> None:
    # vLLM's compiled extension failing to import is logged as a warning; the exception under
    # it is its consequence (tests/data/logs/development/heldout/unrecognised-error-h1.log).
    log = (
        "WARNING 02-28 20:57:36 _core_ext.py:180] Failed to import from vllm._core_C with "
        "ImportError('libtorch_hip.so: cannot open shared object file: No such file or "
        "directory')\n"
        "Traceback (most recent call last):\n"
        '  File "/v/vllm/_core_ext.py", line 182, in <module>\n'
        "    ScalarType = torch.classes._core_C.ScalarType\n"
        "RuntimeError: Tried to instantiate class '_core_C.ScalarType', but it does not exist!\n"
    )
    diagnosis = logscan.diagnose_log(log)
    assert diagnosis.line is not None and "Failed to import from vllm._core_C" in diagnosis.line.raw


def test_an_api_server_error_loses_to_the_engine_cores_death_of_another() -> None:
    log = (
        _START + "(APIServer pid=6) ERROR 12-06 10:00:04 [launcher.py:1] OSError: [Errno 98] error "
        "while attempting to bind on address ('0.0.0.0', 9090): address already in use\n"
        + _ENGINE_CORE_DIES
    )
    diagnosis = logscan.diagnose_log(log)
    assert diagnosis.failure == "tp-not-divisible"
    assert diagnosis.line is not None and _KEY_LINE in diagnosis.line.raw


def test_an_api_server_error_with_no_engine_death_is_the_failure() -> None:
    log = (
        _START + "(APIServer pid=6) ERROR 12-06 10:00:04 [launcher.py:1] OSError: [Errno 98] error "
        "while attempting to bind on address ('0.0.0.0', 8000): address already in use\n"
    )
    assert logscan.diagnose_log(log, running=False).failure == "port-in-use"
