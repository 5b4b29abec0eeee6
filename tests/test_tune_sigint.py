"""How tune and sweep take Ctrl-C, in process: held over pool calls, recorded under the guard,
raised only where that is safe, never lost (``signal.raise_signal`` stands for the Ctrl-C)."""

from __future__ import annotations

import signal

import pytest

from stallfree.tune.sigint import SigintGuard, deferred, interruptible


def ctrl_c() -> None:
    signal.raise_signal(signal.SIGINT)


def test_deferred_raises_after_the_block_not_inside_it() -> None:
    steps = []
    with pytest.raises(KeyboardInterrupt), deferred():
        ctrl_c()
        steps.append("after the Ctrl-C")  # the block runs to its end
    assert steps == ["after the Ctrl-C"]
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler
    with deferred():  # nothing came: nothing raised
        pass


def test_the_guard_records_and_raises_at_its_checks() -> None:
    with SigintGuard() as sigint:
        ctrl_c()  # recorded only: a callback or C code here could not swallow it
        assert sigint.received
        with pytest.raises(KeyboardInterrupt):
            sigint.check()
        # Sticky: a KeyboardInterrupt lost on its way is raised again at every pool call.
        with pytest.raises(KeyboardInterrupt), deferred():
            pass
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler


def test_under_the_guard_a_ctrl_c_in_a_pool_call_is_raised_when_the_call_ends() -> None:
    with SigintGuard() as sigint:
        with pytest.raises(KeyboardInterrupt), deferred():
            ctrl_c()
        assert sigint.received


def test_interruptible_work_stops_at_once_under_the_guard() -> None:
    steps = []
    with SigintGuard() as sigint:
        with pytest.raises(KeyboardInterrupt), interruptible():
            ctrl_c()
            steps.append("not reached")
        assert sigint.received and not steps
        # A later interruptible block starts with it.
        with pytest.raises(KeyboardInterrupt), interruptible():
            steps.append("not reached")
    assert not steps


def test_an_ignored_sigint_stays_ignored() -> None:
    previous = signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        with SigintGuard() as sigint, deferred():
            ctrl_c()
        assert not sigint.received
        assert signal.getsignal(signal.SIGINT) is signal.SIG_IGN
    finally:
        signal.signal(signal.SIGINT, previous)
