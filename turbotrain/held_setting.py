"""Process-wide settings of other libraries that turbotrain changes only while it uses them.

PIL's decompression-bomb limit and OpenCV's thread count are globals of the whole process, with
no per-call form. turbotrain is imported as a library too (a notebook, another trainer), so it
must not leave them changed behind its user's back: each is a `HeldSetting`, set when the first
of our users takes it and given back when the last one lets go. Counted under a lock, because
our users are threads (predict's decode pool) and objects that live side by side (a train and
a val pipeline). While it is held, the rest of the process sees our value too: the libraries
have nothing finer.

    with PIL_LIMIT:                       # around one piece of work
        ...
    release = ONE_CV2_THREAD.hold()       # for an owner with a lifetime (a pipeline) ...
    release()                             # ... in its close(); calling it again does nothing
"""
from __future__ import annotations

import threading
from typing import Callable


class HeldSetting:
    """`read()` and `write(value)` get and set the library's global; `wanted()` is our value,
    asked each time the setting is taken (a test may patch what it returns)."""

    def __init__(self, read: Callable[[], object], write: Callable[[object], None],
                 wanted: Callable[[], object]):
        self._read, self._write, self._wanted = read, write, wanted
        self._lock = threading.Lock()
        self._holders = 0
        self._saved: object = None

    def __enter__(self) -> HeldSetting:
        with self._lock:
            if self._holders == 0:
                self._saved = self._read()
                self._write(self._wanted())
            self._holders += 1
        return self

    def __exit__(self, *exc) -> None:
        with self._lock:
            self._holders -= 1
            if self._holders == 0:
                self._write(self._saved)
                self._saved = None

    def hold(self) -> Callable[[], None]:
        """Takes the setting until the returned function is called (once; later calls do
        nothing, like a pipeline's second close())."""
        self.__enter__()
        held = [True]

        def release() -> None:
            if held[0]:
                held[0] = False
                self.__exit__()
        return release
