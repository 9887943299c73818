import pickle

import pytest

from opsbook.core import exceptions


@pytest.mark.parametrize(
    "error",
    [
        exceptions.OpsbookError("m", host="h", remedy="r"),
        exceptions.HostKeyChanged("m", host="h", remedy="r", fingerprint="SHA256:x"),
        exceptions.CommandTimeout("m", host="h", timeout=3.0),
        exceptions.ProbeError("m", stderr="trace"),
    ],
)
def test_errors_survive_pickling(error: exceptions.OpsbookError) -> None:
    copy = pickle.loads(pickle.dumps(error))
    assert type(copy) is type(error)
    assert str(copy) == str(error)
    assert copy.__dict__ == error.__dict__


def test_message_names_host_and_remedy() -> None:
    text = str(exceptions.ConnectionRefused("refused", host="gpu-01", remedy="start sshd"))
    assert text == "[gpu-01] refused\n  remedy: start sshd"


def test_unreachable_errors_share_a_base() -> None:
    for cls in (
        exceptions.ConnectionRefused,
        exceptions.UnknownHostName,
        exceptions.ConnectTimeout,
    ):
        assert issubclass(cls, exceptions.HostUnreachable)
