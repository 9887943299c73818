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


def test_a_login_banner_around_the_answer_does_not_break_the_probe() -> None:
    import subprocess

    # What ssh returns when ~/.zshenv echoes a banner (and a logout script another line).
    script = "echo 'Welcome to gpu-01'; python3 -; echo 'bye'"
    proc = subprocess.run(
        ["bash", "-c", script],
        input=probes.assemble("configs", {"dir": "/nonexistent"}),
        capture_output=True,
        text=True,
        check=True,
    )
    assert proc.stdout.startswith("Welcome to gpu-01\n")
    answer = probes.decode("configs", proc.stdout, proc.stderr, proc.returncode)
    assert answer["exists"] is False


def test_an_unframed_answer_is_refused() -> None:
    with pytest.raises(ProbeError, match="did not answer JSON"):
        probes.decode("x", '{"ok": true}', "", 0)
