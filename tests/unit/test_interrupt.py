"""SIGINT/SIGTERM become RunInterrupted once; the handlers are restored afterwards."""

import os
import signal

import pytest

from opsbook.interrupt import RunInterrupted, raising_on_signals, signum_of


@pytest.mark.parametrize(("sig", "code"), [(signal.SIGTERM, 143), (signal.SIGINT, 130)])
def test_the_first_signal_raises_with_the_shells_exit_code(sig: int, code: int) -> None:
    before = signal.getsignal(sig)
    with pytest.raises(RunInterrupted) as interrupted, raising_on_signals():
        os.kill(os.getpid(), sig)
    assert interrupted.value.exit_code == code
    assert signal.getsignal(sig) == before


def test_a_second_signal_while_sealing_is_ignored() -> None:
    sealed = False
    with raising_on_signals():
        try:
            os.kill(os.getpid(), signal.SIGTERM)
        except RunInterrupted:
            # Sealing the record: another Ctrl-C must not cut it short.
            os.kill(os.getpid(), signal.SIGINT)
            sealed = True
    assert sealed


def test_keyboard_interrupt_counts_as_sigint() -> None:
    assert signum_of(KeyboardInterrupt()) == signal.SIGINT
    assert signum_of(RunInterrupted(signal.SIGTERM)) == signal.SIGTERM
