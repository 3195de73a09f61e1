"""A call on a thread of its own, so that its round trip overlaps the task's next ones."""

from __future__ import annotations

import contextvars
import threading
from collections.abc import Callable
from typing import Any


class Background:
    """Runs `fn(*args, **kwargs)` now; `result()` waits for it and raises what it
    raised, `wait()` only waits (`error` then holds what it raised)."""

    def __init__(self, fn: Callable, *args, **kwargs) -> None:
        self.error: BaseException | None = None
        self._value: Any = None
        context = contextvars.copy_context()       # the task's log context goes along
        self._thread = threading.Thread(target=self._call, daemon=True,
                                        args=(context, fn, args, kwargs),
                                        name=f"background-{getattr(fn, '__name__', 'call')}")
        self._thread.start()

    def _call(self, context, fn, args, kwargs) -> None:
        try:
            self._value = context.run(fn, *args, **kwargs)
        except BaseException as exc:        # handed to whoever waits for it
            self.error = exc

    def wait(self) -> None:
        self._thread.join()

    def result(self) -> Any:
        self._thread.join()
        if self.error is not None:
            raise self.error
        return self._value
