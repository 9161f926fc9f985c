"""SIGTERM handled as Ctrl-C: a batch scheduler's stop or a ``kill`` ends a run or a study the way
Ctrl-C does (recorded as interrupted, the trial row written, exit 130, the ``--resume`` line).
"""

from __future__ import annotations

import signal
import threading
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Iterator


class Terminated(KeyboardInterrupt):
    """SIGTERM, turned into an interrupt by :func:`sigterm_as_interrupt` (a KeyboardInterrupt, so
    everything that handles Ctrl-C handles it the same way)."""


@dataclass
class SigtermSeen:
    """What :func:`sigterm_as_interrupt` yields: ``received`` is True once SIGTERM came while it
    was active. Needed because the exception does not always survive: a SIGTERM that lands in a
    blocking ``ray.get`` is re-raised by Ray's C++ layer as a fresh, plain ``KeyboardInterrupt``."""

    received: bool = False


@contextmanager
def sigterm_as_interrupt() -> Iterator[SigtermSeen]:
    """While active (main thread only; elsewhere a no-op), SIGTERM does what SIGINT (Ctrl-C) does:
    it calls the current SIGINT handler (Ray Tune's graceful stop during a sweep), or raises
    :class:`Terminated` where that handler is Python's default. Without it, ``ray.init``'s handler
    turns SIGTERM into ``sys.exit`` and a plain Python process dies without writing anything.
    The previous SIGTERM handler is restored on exit. Yields a :class:`SigtermSeen`."""
    seen = SigtermSeen()
    if threading.current_thread() is not threading.main_thread():
        yield seen
        return

    def on_sigterm(signum, frame):
        seen.received = True
        handler = signal.getsignal(signal.SIGINT)
        if callable(handler) and handler is not signal.default_int_handler:
            try:
                handler(signal.SIGINT, frame)
            except KeyboardInterrupt as exc:  # a handler that raises Ctrl-C's exception: it is SIGTERM's
                if isinstance(exc, Terminated):
                    raise
                raise Terminated("SIGTERM") from None
        else:
            raise Terminated("SIGTERM")

    old = signal.signal(signal.SIGTERM, on_sigterm)
    try:
        yield seen
    finally:
        signal.signal(signal.SIGTERM, old if old is not None else signal.SIG_DFL)
