"""One call on a daemon thread, its value or error handed back where it is awaited (the sweep draws
its report while Ray shuts down). Not :class:`concurrent.futures.ThreadPoolExecutor`: its threads
are joined when the interpreter exits, so a sweep stopped by Ctrl-C or SIGTERM would wait there
for the report; a daemon thread ends with the process."""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

__all__ = ["Background"]


class Background:
    """``fn(*args)`` on a daemon thread; :meth:`result` waits for it and returns its value or raises
    its error.

    >>> Background(sum, [1, 2]).result()
    3
    """

    def __init__(self, fn: Callable[..., Any], *args: Any, name: str = "fedtune-background"):
        self._out: tuple[bool, Any] = (False, None)
        self._thread = threading.Thread(target=self._run, args=(fn, args), name=name, daemon=True)
        self._thread.start()

    def _run(self, fn: Callable[..., Any], args: tuple) -> None:
        try:
            self._out = (True, fn(*args))
        except BaseException as exc:  # noqa: BLE001 - handed to the caller by result()
            self._out = (False, exc)

    def result(self) -> Any:
        self._thread.join()
        ok, value = self._out
        if not ok:
            raise value
        return value
