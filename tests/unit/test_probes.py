import pytest

from opsbook import probes
from opsbook.exceptions import ProbeError


def test_decode_failure_carries_stderr() -> None:
    with pytest.raises(ProbeError) as e:
        probes.decode("x", "", "Traceback...\nZeroDivisionError: division by zero", 1, "h")
    assert "ZeroDivisionError" in str(e.value)
    assert "Traceback" in e.value.stderr


def test_decode_refuses_non_json() -> None:
    with pytest.raises(ProbeError, match="did not answer JSON"):
        probes.decode("x", "Welcome to the host!\n{}", "", 0)


def test_unknown_probe_is_named() -> None:
    with pytest.raises(ProbeError, match="no probe named 'nope'"):
        probes.source("nope")
