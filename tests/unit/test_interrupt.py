"""SIGINT/SIGTERM become RunInterrupted once; the handlers are restored afterwards."""

import asyncio
import os
import signal

import pytest

from opsbook.runner.interrupt import RunInterrupted, raising_on_signals, sealing, signum_of


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


def test_an_interruption_in_an_event_loop_callback_reaches_the_run() -> None:
    # A signal lands wherever the main thread is, often in a callback of the notebook client's
    # event loop (its ZMQ poller); asyncio drops any BaseException there but these two kinds.
    loop = asyncio.new_event_loop()
    try:

        def callback() -> None:
            raise RunInterrupted(signal.SIGTERM)

        waiting = loop.create_task(asyncio.sleep(5))
        loop.call_later(0.01, callback)
        with pytest.raises(RunInterrupted) as caught:
            loop.run_until_complete(waiting)
        assert caught.value.exit_code == 143
        waiting.cancel()
        with pytest.raises(asyncio.CancelledError):
            loop.run_until_complete(waiting)
    finally:
        loop.close()


def test_signals_while_the_record_is_sealed_are_ignored_then_the_handlers_come_back() -> None:
    with raising_on_signals():
        handler = signal.getsignal(signal.SIGTERM)
        with sealing():
            os.kill(os.getpid(), signal.SIGTERM)
            os.kill(os.getpid(), signal.SIGINT)
            sealed = True  # reached: neither signal raised
        assert sealed
        assert signal.getsignal(signal.SIGTERM) is handler
