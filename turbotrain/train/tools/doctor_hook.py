"""The hook `turbotrain doctor` loads into a training script's interpreter (tools/doctor_run.py
copies it, with doctor_patches.py and doctor_probe.py, into a package beside a temporary
sitecustomize.py). It imports nothing of turbotrain and
nothing heavy at start: it patches torch and PIL the moment the script imports them, and
writes what it measures as JSON lines, one file per process, each line flushed, so a script
that is killed still leaves what was measured (tools/doctor_analysis.py reads them).

What it times, per optimizer step (the clock is the first optimizer that steps; a step ends
at its post hook):
  wait     inside DataLoader iterators' __next__ (the batch the loop waits for)
  copy     in Tensor.to/.cuda calls that moved a tensor to another device
  fwd      the outermost module forward (the model, found by global forward hooks during the
           first steps, then hooked alone: a global hook costs a call on every module)
  bwd      torch.autograd.backward (loss.backward() goes through it)
  optim    inside optimizer.step, less any forward/backward run by a closure (Lightning)
  the rest of the step is "other" (Python around the loop). On CUDA the GPU's span of a step
  is timed with events read when done, never by synchronising.
Page faults: the process's minor faults, read once per "steps" line (a getrusage), so a line
carries the faults of the steps it holds.
Decode: DataLoader fetches (in whichever process runs them) and PIL's decode, per batch.
After the timed steps it probes a copy of the model on the last batch (threads, batch size,
bf16, channels_last, the GPU) so that the advice can say what each change measured.
"""
from __future__ import annotations

import atexit
import json
import os
import sys
import time

try:
    import resource
except ImportError:  # not on Windows: page faults go unmeasured there
    resource = None

CONFIG_VARIABLE = "TURBOTRAIN_DOCTOR"
CONFIG = json.loads(os.environ.get(CONFIG_VARIABLE) or "{}")
RECORD_EVERY = 50  # model facts again every 50 steps (device/dtype can change mid-run)
# A step's record is a row of these, written with the rows of its neighbours as one "steps"
# line every Recorder.flush_every (doctor_run.read_measurements turns them back into "step"
# records): a json.dumps of its own cost a 1.4 ms MLP step 2.5-3.5 % (its overhead measured
# block against block in one process), a row in a list nothing measurable.
SUMS = ("wait", "copy", "fwd", "bwd", "optim")  # seconds a step spent in each
COUNTS = ("batches", "images", "forwards", "backwards", "syncs", "sync_s", "fetch_s", "decode_s",
          "fetched")
STEP_FIELDS = ("i", "t", "dur", *SUMS, *COUNTS, "warmup")
FIND_ROOTS_STEPS = 2  # global module hooks only for the first steps: then the model alone
PROBE_REPEATS = 5  # the fastest of 5 (doctor_probe.py)


# The clock called directly, not through a function of ours: the paths that run every step
# make no Python call they do not need (each costs the training loop more than it costs in a
# loop of its own; the hook's budget is 2 % of a 1.2 ms step).
_now = time.perf_counter


# Read once per "steps" line, not per step: a system call between a training loop's ops cost
# it 7-11 us (0.7 us in a loop of its own), 0.6-0.9 % of a 1.2 ms step. The whole process's
# faults: those of torch's other threads delay the step too (counting the training thread's
# alone predicted 1.6x where removing the faults measured 3.3x).
def _minor_faults() -> int:
    """Minor page faults of this process so far, all its threads (0 where unmeasured)."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_minflt if resource else 0


class Recorder:
    """One JSON-lines file per process: DIR/<pid>.jsonl (a forked loader worker opens its own)."""

    # A flush is a system call (~10 us, more on a busy machine): the training process
    # flushes at most every 0.25 s, so a process killed outright loses at most that much; a
    # loader worker, which ends with os._exit and no clean-up, flushes every line.
    def __init__(self, folder: str, flush_every: float = 0.25):
        self.folder = folder
        self.file = None
        self.flush_every = flush_every
        self.flushed = 0.0
        self.open()

    def open(self) -> None:
        os.makedirs(self.folder, exist_ok=True)
        self.file = open(os.path.join(self.folder, f"{os.getpid()}.jsonl"), "a",
                         encoding="utf-8")
        self.write({"kind": "start", "pid": os.getpid(), "ppid": os.getppid(),
                    "rank": _int_env("RANK"), "world_size": _int_env("WORLD_SIZE"),
                    "argv": sys.argv[:8], "time": time.time()})

    def write(self, record: dict) -> None:
        try:
            self.file.write(json.dumps(record) + "\n")
            now = _now()
            if self.flush_every == 0 or now - self.flushed >= self.flush_every:
                self.file.flush()
                self.flushed = now
        except (OSError, ValueError, TypeError):
            pass  # the measurement must never break the script

    def flush(self) -> None:
        try:
            self.file.flush()
        except (OSError, ValueError):
            pass


def _int_env(name: str) -> int | None:
    value = os.environ.get(name, "")
    return int(value) if value.isdigit() else None


def _user_site(skip=("/torch/", "/lightning/", "/pytorch_lightning/", "doctor_hook",
                     "/site-packages/", "<frozen")) -> str | None:
    """file:line of the innermost frame that is the user's code."""
    frame = sys._getframe(2)
    while frame is not None:
        name = frame.f_code.co_filename
        if not any(part in name for part in skip):
            return f"{name}:{frame.f_lineno}"
        frame = frame.f_back
    return None


class StepClock:
    """The running sums of the current step, booked into a record at each optimizer step."""

    def __init__(self, recorder: Recorder):
        self.recorder = recorder
        self.warmup = int(CONFIG.get("warmup", 5))
        self.steps = CONFIG.get("steps")  # None: a few seconds' worth, decided after warm-up
        self.stop = bool(CONFIG.get("stop"))
        self.active = True  # False once the window is measured: every patch passes through
        self.probing = False
        self.step = 0
        self.last_end = None
        self.clock_optimizer = None
        self.sums = dict.fromkeys(SUMS, 0.0)
        # fetch_s/decode_s/fetched: batches loaded in this process (num_workers=0), booked
        # with the step rather than a record a batch (a record is ~8 us of json and write)
        self.counts = dict.fromkeys(COUNTS, 0)
        self.optim_started = None
        self.nested_at_start = 0.0
        self.forward_depth = 0
        self.forward_started = 0.0
        self.roots: list = []  # the models: modules called outside any other, with parameters
        self.root_hooks: list = []
        self.global_hooks: list = []
        self.last_input = None
        self.facts: dict = {}  # the last model facts written: the probe runs as the loop did
        self.sync_sites: dict[str, int] = {}
        self.no_sync_used = False
        self.gpu_pending: list = []
        self.gpu_started = None
        self.activation_bytes = 0
        self.measuring_activations = False
        self.probed = False
        self.run_probes = lambda clock: None  # doctor_patches sets doctor_probe.run_probes
        self.timed_steps = 0  # steps after warm-up ...
        self.timed_seconds = 0.0  # ... and their seconds
        self.step_rows: list[tuple] = []  # steps not yet written (STEP_FIELDS)
        self.faults_at = 0  # _minor_faults() when the rows now waiting began (first step's end)
        self.tensor_type = None  # torch.Tensor, once torch is imported (doctor_patches)

    # -- booking
    def optimizer_pre(self, optimizer, args, kwargs) -> None:
        """torch's optimizer step pre hook."""
        if self.active and self.clock_optimizer in (None, id(optimizer)):
            self.optim_started = _now()
            sums = self.sums  # the time booked so far, summed inline: no call of ours (_now)
            self.nested_at_start = sums["wait"] + sums["copy"] + sums["fwd"] + sums["bwd"]

    def optimizer_post(self, optimizer, args, kwargs) -> None:
        """torch's optimizer step post hook: the step's end (no call of ours on the way of a
        common step, see _now)."""
        now = _now()
        if not self.active:
            return
        if id(optimizer) != self.clock_optimizer:
            if self.clock_optimizer is not None:
                return
            self.clock_optimizer = id(optimizer)
        sums = self.sums
        if self.optim_started is not None:  # less a closure's forward/backward (Lightning)
            nested = sums["wait"] + sums["copy"] + sums["fwd"] + sums["bwd"]
            sums["optim"] += max(0.0, now - self.optim_started - (nested - self.nested_at_start))
            self.optim_started = None
        self.forward_depth = 0  # a forward that raised never reached its post hook
        if self.last_end is not None:
            dur = now - self.last_end
            self.step_rows.append((self.step, now, dur, *sums.values(), *self.counts.values(),
                                   self.step <= self.warmup))
            # warm-up's rows on a line of their own: their page faults (the heap growing) are
            # not the timed steps'
            if now - self.recorder.flushed >= self.recorder.flush_every \
                    or self.step == self.warmup:
                self.write_step_rows()
            if self.step > self.warmup:
                self.timed_steps += 1
                self.timed_seconds += dur
        else:  # the first step's end: the first row's start
            self.faults_at = _minor_faults()
        if self.gpu_started is not None:
            self._gpu_mark_end()
        self.last_end = _now()
        self.sums = dict.fromkeys(SUMS, 0.0)
        self.counts = dict.fromkeys(COUNTS, 0)
        self.step += 1
        if self.step == FIND_ROOTS_STEPS:
            self._hook_roots_only()
        if self.steps is None or self.timed_steps >= self.steps:
            self._maybe_finish()

    def write_step_rows(self) -> None:
        if self.step_rows:
            faults = _minor_faults()
            self.recorder.write({"kind": "steps", "fields": STEP_FIELDS, "rows": self.step_rows,
                                 "faults": faults - self.faults_at})
            self.faults_at = faults
            self.step_rows = []

    def _maybe_finish(self) -> None:
        timed = self.timed_steps
        if self.steps is None and timed == 3:
            mean = self.timed_seconds / timed
            # a few seconds' worth: 5 s of steps, at least 10 and at most 300
            self.steps = max(10, min(300, round(5.0 / max(mean, 1e-6))))
            self.recorder.write({"kind": "window", "steps": self.steps, "warmup": self.warmup})
        if self.steps is not None and timed >= self.steps:
            self.finish("stopped" if self.stop else "measured")

    def finish(self, reason: str) -> None:
        if not self.active:
            return
        self.active = False
        self.write_step_rows()
        self._remove_hooks()
        self._gpu_resolve(wait=True)
        self.recorder.write({"kind": "syncs", "sites": self.sync_sites,
                             "no_sync_used": self.no_sync_used})
        if not self.probed and self.roots and self.last_input is not None:
            self.probed = True
            self.run_probes(self)
        # The script's model and batch are its own again: a DDP model the hook kept alive
        # outlived its process group at exit and aborted the rank
        self.roots, self.last_root, self.last_input = [], None, None
        self.recorder.write({"kind": "end", "reason": reason, "steps": self.step})
        self.recorder.flush()
        if reason == "stopped":
            raise SystemExit(0)

    # -- the model
    def root_pre(self, module, args):
        if not self.active or self.probing:
            return
        if self.forward_depth == 0:
            self.forward_started = _now()
            self.counts["forwards"] += 1
            # the usual model(x) without a call of ours (see _now)
            first = args[0] if args and self.tensor_type is not None and \
                type(args[0]) is self.tensor_type else _first_tensor(args)
            if first is not None:
                self.last_root, self.last_input = module, first
                if self.step % RECORD_EVERY == 0 and self.counts["forwards"] == 1:
                    self.facts = model_facts(module, first, self.step)
                    self.recorder.write(self.facts)
                if first.is_cuda and self.gpu_started is None:
                    self._gpu_mark_start(first)
        self.forward_depth += 1

    def root_post(self, module, args, output):
        if not self.active or self.probing:
            return
        self.forward_depth = max(0, self.forward_depth - 1)
        if self.forward_depth == 0:
            self.sums["fwd"] += _now() - self.forward_started

    def global_pre(self, module, args):
        if self.forward_depth == 0 and not self.probing and _has_parameters(module):
            if not any(r is module for r in self.roots):
                self.roots.append(module)
            self.measuring_activations = self.activation_bytes == 0
        if self.forward_depth == 0 and not any(r is module for r in self.roots):
            return
        self.root_pre(module, args)

    def global_post(self, module, args, output):
        if self.measuring_activations and not list(module.children()):
            self.activation_bytes += _tensor_bytes(output)
        if self.forward_depth == 1 and not any(r is module for r in self.roots):
            return
        if self.forward_depth >= 1:
            self.root_post(module, args, output)
            if self.forward_depth == 0:
                self.measuring_activations = False

    def _hook_roots_only(self) -> None:
        """Global hooks cost a call per module per forward: after FIND_ROOTS_STEPS the
        models found are hooked alone."""
        for handle in self.global_hooks:
            handle.remove()
        self.global_hooks = []
        for root in self.roots:
            self.root_hooks.append(root.register_forward_pre_hook(self.root_pre))
            self.root_hooks.append(root.register_forward_hook(self.root_post))

    def _remove_hooks(self) -> None:
        for handle in self.global_hooks + self.root_hooks:
            handle.remove()
        self.global_hooks, self.root_hooks = [], []

    # -- CUDA events: the GPU's span of a step, read once done (no synchronisation)
    def _gpu_mark_start(self, tensor) -> None:
        if self.gpu_started is None and getattr(tensor, "is_cuda", False):
            import torch
            self.gpu_started = torch.cuda.Event(enable_timing=True)
            self.gpu_started.record()

    def _gpu_mark_end(self) -> None:
        if self.gpu_started is None:
            return
        import torch
        end = torch.cuda.Event(enable_timing=True)
        end.record()
        self.gpu_pending.append((self.step, self.gpu_started, end))
        self.gpu_started = None
        self._gpu_resolve(wait=False)

    def _gpu_resolve(self, wait: bool) -> None:
        while self.gpu_pending and (wait or self.gpu_pending[0][2].query()):
            step, start, end = self.gpu_pending.pop(0)
            end.synchronize()  # done already unless wait (after the window)
            self.recorder.write({"kind": "gpu", "i": step, "ms": start.elapsed_time(end)})


def _has_parameters(module) -> bool:
    return next(module.parameters(), None) is not None


def _first_tensor(value):
    import torch
    if isinstance(value, torch.Tensor):
        return value
    if isinstance(value, (list, tuple)):
        for item in value:
            found = _first_tensor(item)
            if found is not None:
                return found
    if isinstance(value, dict):
        return _first_tensor(list(value.values()))
    return None


def _tensor_bytes(value) -> int:
    import torch
    if isinstance(value, torch.Tensor):
        return value.numel() * value.element_size()
    if isinstance(value, (list, tuple)):
        return sum(_tensor_bytes(v) for v in value)
    return 0


def model_facts(module, first, step: int) -> dict:
    import torch
    inner = getattr(module, "module", module)  # DistributedDataParallel's model
    parameter = next(inner.parameters())
    convs = [m for m in inner.modules() if isinstance(m, torch.nn.Conv2d)]
    device_type = first.device.type
    return {"kind": "model", "i": step, "type": type(inner).__name__,
            "ddp": type(module).__name__ == "DistributedDataParallel",
            "device": str(parameter.device), "dtype": str(parameter.dtype).replace("torch.", ""),
            "parameters": sum(p.numel() for p in inner.parameters()),
            "conv": bool(convs),
            "channels_last": bool(convs) and convs[0].weight.is_contiguous(
                memory_format=torch.channels_last) and convs[0].weight.dim() == 4,
            "autocast": bool(torch.is_autocast_enabled(device_type)),
            "autocast_dtype": str(torch.get_autocast_dtype(device_type)).replace("torch.", ""),
            "input_device": str(first.device), "input_dtype": str(first.dtype).replace(
                "torch.", ""), "input_shape": list(first.shape),
            "torch_threads": torch.get_num_threads(),
            "cuda_available": torch.cuda.is_available()}

