"""Where the doctor's hook attaches (see doctor_hook.py): torch's public hooks (optimizer step
pre/post hooks, global module forward hooks) and thin wrappers around DataLoader iteration,
its batch fetch, autograd.backward, cross-device Tensor.to/.cuda, the synchronising
.item()/.tolist()/.cpu() of CUDA tensors, DDP's no_sync and PIL's decode. torch and PIL are
patched when the script imports them (an import watcher), never imported by the hook itself.
Every wrapper passes straight through once the window is measured (`CLOCK.active`).
"""
from __future__ import annotations

import atexit
import importlib.abc
import os
import sys
import time

from .doctor_hook import CONFIG, Recorder, StepClock, _first_tensor, _now, _user_site
from .doctor_probe import run_probes

CLOCK: StepClock | None = None
DECODE = [0.0]  # seconds in PIL decode since the last fetch was booked (per process)


def install() -> None:
    global CLOCK
    if not CONFIG.get("dir") or CLOCK is not None:
        return
    CLOCK = StepClock(Recorder(CONFIG["dir"]))
    CLOCK.run_probes = run_probes
    os.register_at_fork(after_in_child=_forked)
    atexit.register(_at_exit)
    sys.meta_path.insert(0, ImportWatcher({"torch": _patch_torch, "PIL.ImageFile": _patch_pil}))
    for name, patch in (("torch", _patch_torch), ("PIL.ImageFile", _patch_pil)):
        if name in sys.modules:
            patch(sys.modules[name])


def _forked() -> None:
    """A forked DataLoader worker: its own file, no step clock (it only fetches)."""
    CLOCK.active_steps = False
    CLOCK.recorder = Recorder.__new__(Recorder)
    CLOCK.recorder.folder, CLOCK.recorder.file = CONFIG["dir"], None
    CLOCK.recorder.flush_every, CLOCK.recorder.flushed = 0.0, 0.0
    CLOCK.recorder.write = _open_then_write(CLOCK.recorder)


def _open_then_write(recorder):
    def write(record: dict) -> None:  # a fork that never fetches leaves no file
        del recorder.write
        recorder.open()
        recorder.write(record)
    return write


def _at_exit() -> None:
    if CLOCK is not None and CLOCK.active and getattr(CLOCK, "active_steps", True):
        try:
            CLOCK.finish("exited")
        except BaseException:  # noqa: BLE001: nothing may change how the script exits
            pass
    if CLOCK is not None and CLOCK.recorder.file is not None:
        CLOCK.recorder.flush()


class ImportWatcher(importlib.abc.MetaPathFinder):
    """Calls `then(module)` right after `name` finished importing."""

    def __init__(self, watched: dict):
        self.watched = dict(watched)
        self.busy = False

    def find_spec(self, name, path, target=None):
        if name not in self.watched or self.busy:
            return None
        self.busy = True
        try:
            for finder in sys.meta_path:
                if finder is self or not hasattr(finder, "find_spec"):
                    continue
                spec = finder.find_spec(name, path, target)
                if spec is not None and spec.loader is not None:
                    spec.loader = _ThenLoader(spec.loader, self.watched.pop(name))
                    return spec
        finally:
            self.busy = False
        return None


class _ThenLoader(importlib.abc.Loader):
    def __init__(self, inner, then):
        self.inner, self.then = inner, then

    def create_module(self, spec):
        return self.inner.create_module(spec)

    def exec_module(self, module):
        self.inner.exec_module(module)
        try:
            self.then(module)
        except Exception as e:  # noqa: BLE001: a torch we cannot hook still runs the script
            CLOCK.recorder.write({"kind": "error", "where": "patch", "error": repr(e)[:300]})

    def __getattr__(self, name):  # get_resource_reader, is_package, ...
        return getattr(self.inner, name)


def _patch_torch(torch) -> None:
    import torch.nn.parallel
    import torch.optim.optimizer as optimizer
    import torch.utils.data
    import torch.utils.data._utils.fetch as fetch
    from torch.nn.modules import module as module_hooks
    from torch.utils.data import dataloader

    clock = CLOCK
    clock.tensor_type = torch.Tensor
    optimizer.register_optimizer_step_pre_hook(clock.optimizer_pre)
    optimizer.register_optimizer_step_post_hook(clock.optimizer_post)
    clock.global_hooks = [module_hooks.register_module_forward_pre_hook(clock.global_pre),
                          module_hooks.register_module_forward_hook(clock.global_post)]
    torch.autograd.backward = _timed_backward(torch.autograd.backward)
    torch.Tensor.to = _timed_copy(torch.Tensor.to)
    torch.Tensor.cuda = _timed_copy(torch.Tensor.cuda)
    for name in ("item", "tolist", "cpu"):
        setattr(torch.Tensor, name, _counted_sync(getattr(torch.Tensor, name)))
    loader = dataloader.DataLoader
    loader.__init__ = _noting_site(loader.__init__)
    loader.__iter__ = _describing(loader.__iter__)
    iterator = dataloader._BaseDataLoaderIter
    iterator.__next__ = _timed_next(iterator.__next__)
    for fetcher in (fetch._MapDatasetFetcher, fetch._IterableDatasetFetcher):
        fetcher.fetch = _timed_fetch(fetcher.fetch)
    ddp = torch.nn.parallel.DistributedDataParallel
    ddp.no_sync = _noting_no_sync(ddp.no_sync)


def _patch_pil(image_file) -> None:
    original = image_file.ImageFile.load

    def load(self, *args, **kwargs):
        started = _now()
        try:
            return original(self, *args, **kwargs)
        finally:
            DECODE[0] += _now() - started
    image_file.ImageFile.load = load


def _timed_backward(original):
    def backward(*args, **kwargs):
        if not CLOCK.active or CLOCK.probing:
            return original(*args, **kwargs)
        started = _now()
        try:
            return original(*args, **kwargs)
        finally:
            CLOCK.sums["bwd"] += _now() - started
            CLOCK.counts["backwards"] += 1
    return backward


def _timed_copy(original):
    # torch.compile traces these wrappers where the model calls .to()/.item(): under
    # tracing they are the original call, so timing never breaks a compiled graph
    compiling = _compiling()

    def copy(self, *args, **kwargs):
        if not CLOCK.active or CLOCK.probing or compiling():
            return original(self, *args, **kwargs)
        started = _now()
        result = original(self, *args, **kwargs)
        if result is not self and result.device != self.device:
            CLOCK.sums["copy"] += _now() - started
        return result
    copy.__name__ = original.__name__
    return copy


def _counted_sync(original):
    compiling = _compiling()

    def synchronising(self, *args, **kwargs):
        if CLOCK.active and not CLOCK.probing and self.is_cuda and CLOCK.last_end is not None \
                and not compiling():
            CLOCK.counts["syncs"] += 1
            site = _user_site()
            if site is not None:
                CLOCK.sync_sites[site] = CLOCK.sync_sites.get(site, 0) + 1
            started = _now()  # the host blocks here until the GPU caught up
            try:
                return original(self, *args, **kwargs)
            finally:
                CLOCK.counts["sync_s"] += _now() - started
        return original(self, *args, **kwargs)
    synchronising.__name__ = original.__name__
    return synchronising


def _compiling():
    import torch
    return getattr(getattr(torch, "compiler", None), "is_compiling", lambda: False)


def _noting_site(original):
    def __init__(self, *args, **kwargs):
        original(self, *args, **kwargs)
        self._doctor_site = _user_site()
    return __init__


def _describing(original):
    def __iter__(self):
        described = CLOCK.__dict__.setdefault("loaders", set())
        if CLOCK.active and id(self) not in described:
            described.add(id(self))
            dataset = self.dataset
            root = getattr(dataset, "root", None)
            CLOCK.recorder.write({
                "kind": "loader", "id": id(self), "num_workers": self.num_workers,
                "pin_memory": bool(self.pin_memory), "batch_size": self.batch_size,
                "persistent_workers": bool(getattr(self, "persistent_workers", False)),
                "dataset": type(dataset).__name__, "length": _length(dataset),
                "root": str(root) if isinstance(root, (str, os.PathLike)) else None,
                "site": getattr(self, "_doctor_site", None)})
        return original(self)
    return __iter__


def _length(dataset) -> int | None:
    try:
        return len(dataset)
    except TypeError:
        return None


def _timed_next(original):
    def __next__(self):
        clock = CLOCK
        if not clock.active:
            return original(self)
        started = _now()
        batch = original(self)
        clock.sums["wait"] += _now() - started
        clock.counts["batches"] += 1
        first = _first_tensor(batch)
        if first is not None and first.dim() > 0:
            clock.counts["images"] += first.shape[0]
            if clock.counts["batches"] == 1 and clock.step % 50 == 0:
                clock.recorder.write({"kind": "batch", "i": clock.step,
                                      "device": str(first.device), "pinned": _pinned(first),
                                      "shape": list(first.shape)})
        return batch
    return __next__


def _pinned(tensor) -> bool:
    try:
        return bool(tensor.is_pinned())
    except RuntimeError:  # no CUDA build: nothing can be pinned
        return False


def _timed_fetch(original):
    def fetch(self, possibly_batched_index):
        if not CLOCK.active:
            return original(self, possibly_batched_index)
        DECODE[0] = 0.0
        started, cpu_started = _now(), time.thread_time()
        batch = original(self, possibly_batched_index)
        seconds = _now() - started
        if getattr(CLOCK, "active_steps", True):  # the training process: booked with the step
            CLOCK.counts["fetch_s"] += seconds
            CLOCK.counts["decode_s"] += DECODE[0]
            CLOCK.counts["fetched"] += 1
            return batch
        samples = len(possibly_batched_index) if self.auto_collation else 1
        # cpu: the worker's own CPU time, what a batch costs once it has a core to itself
        # (the wall time `s` also counts the time it waited for a core it shared)
        CLOCK.recorder.write({"kind": "fetch", "s": seconds, "n": samples, "decode": DECODE[0],
                              "cpu": time.thread_time() - cpu_started,
                              "pid": os.getpid(), "ppid": os.getppid()})
        return batch
    return fetch


def _noting_no_sync(original):
    def no_sync(self):
        CLOCK.no_sync_used = True
        return original(self)
    return no_sync
