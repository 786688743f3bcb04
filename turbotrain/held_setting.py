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

OpenCV's thread count matters for a second reason: a process that forks workers while cv2's
thread pool is alive must not let those workers change the count. In the child, the pool's
threads are gone but its condition variables still have waiters on record, and
`cv2.setNumThreads` there blocks forever in pthread_cond_destroy (prepare-dataset hung so after
the bench had drawn its images with cv2 in the same process). So whoever forks workers holds
ONE_CV2_THREAD in the parent first: the pool is then torn down in the parent, where its threads
exist, and the children inherit a single thread.
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


def _cv2_threads() -> int:
    import cv2
    return cv2.getNumThreads()


def _set_cv2_threads(count: int) -> None:
    import cv2
    cv2.setNumThreads(count)


# One OpenCV thread: for code that parallelises across images itself (cv2's own pool inside
# each call only adds overhead then) and for any process about to fork workers (above).
ONE_CV2_THREAD = HeldSetting(_cv2_threads, _set_cv2_threads, lambda: 1)
