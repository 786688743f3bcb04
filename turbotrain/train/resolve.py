"""`auto` settings made concrete from the dataset and the device, each with its reason.

The resolved TrainConfig is what RUNDIR/config.yaml stores, so a saved run reruns as is.
"""
from __future__ import annotations

import time
from dataclasses import dataclass, field
from pathlib import Path

from turbotrain.printable import printable

from .checkpoint import CHECKPOINT_NAME
from .config import TrainConfig
from .data import auto_image_size
from .errors import TrainError
from .finetune import auto_warmup, lr_factor, weights_hint
from .model_args import canonical, parse_model_kwargs
from .models import ModelSpec, auto_model, get_model_spec
from .schedule import ADAMW_LR_PER_256, ADAMW_WEIGHT_DECAY, auto_warmup_steps, scaled_lr


@dataclass
class Resolved:
    config: TrainConfig
    spec: ModelSpec
    reasons: dict[str, str] = field(default_factory=dict)  # setting -> why it has its value


def resolve_data_settings(config: TrainConfig, dataset, device_type: str, world_size: int
                          ) -> Resolved:
    """image size, model, batch size and learning rate; the schedule length comes later."""
    reasons = {}
    hint = weights_hint(config)  # what --init-from's card or --pretrained implies
    image_size = config.image_size
    if image_size is None and hint.image_size is not None:
        image_size = hint.image_size
        reasons["image_size"] = f"{image_size} px, the size the --init-from weights learnt at"
    if image_size is None:
        image_size, reasons["image_size"] = auto_image_size(dataset, device_type)
    model = config.model
    if model == "auto" and hint.model is not None:
        model, reasons["model"] = hint.model, hint.reason
    if model == "auto":
        model, reasons["model"] = auto_model(image_size, device_type, len(dataset))
    if config.model_kwargs is not None:
        model_kwargs = parse_model_kwargs(config.model_kwargs)
    else:  # a run of the same model keeps the card's constructor arguments
        model_kwargs = hint.model_kwargs if hint.model == model and hint.model_kwargs else {}
        if model_kwargs:
            reasons["model_kwargs"] = "the --init-from weights' model_kwargs"
    spec = get_model_spec(model, model_kwargs=model_kwargs, image_size=image_size)

    batch = config.batch_size
    if batch is None:
        batch, reasons["batch_size"] = fitting_batch_size(config, spec, dataset, image_size,
                                                          device_type, world_size)
    accum = config.accum_steps
    if config.global_batch_size is not None:
        accum, reasons["accum_steps"] = accum_for_global_batch(config, batch, world_size)
    per_step = batch * world_size
    if per_step > len(dataset):
        raise TrainError(f"--batch-size {batch} x {world_size} rank(s) = {per_step} is larger "
                         f"than the train split ({len(dataset)} images)")
    if per_step * accum > len(dataset):
        raise TrainError(f"the global batch {per_step * accum} (batch-size x "
                         f"accum-steps x ranks) is larger than the train split "
                         f"({len(dataset)} images)")
    global_batch = per_step * accum

    lr = config.lr
    if lr is None:
        if config.optimizer == "sgd":
            lr = scaled_lr(spec.sgd_lr, global_batch, "sgd")
            reasons["lr"] = f"{spec.name}'s {spec.sgd_lr} per 256 images x {global_batch}/256"
        else:
            lr = scaled_lr(ADAMW_LR_PER_256, global_batch, "adamw")
            reasons["lr"] = (f"AdamW {ADAMW_LR_PER_256} per 256 images x "
                             f"sqrt({global_batch}/256)")
        factor, why = lr_factor(config, spec, dataset)  # starting from weights (finetune.py)
        if factor != 1.0:
            lr = float(f"{lr * factor:.6g}")  # 0.0025, not 0.0025000000000000005
        reasons["lr"] += why
    weight_decay = config.weight_decay
    if weight_decay is None:
        weight_decay = spec.weight_decay if config.optimizer == "sgd" else ADAMW_WEIGHT_DECAY
        reasons["weight_decay"] = (f"{spec.name}'s SGD decay" if config.optimizer == "sgd"
                                   else "AdamW's usual 0.05")
    worker_mode = config.worker_mode
    if worker_mode == "auto":
        worker_mode, reasons["worker_mode"] = "threads", "measured faster than worker processes"
    resolved = config.replace(image_size=image_size, model=spec.name, batch_size=batch, lr=lr,
                              model_kwargs=canonical(model_kwargs),
                              weight_decay=weight_decay, accum_steps=accum,
                              worker_mode=worker_mode)
    return Resolved(resolved, spec, reasons)


# The preferred batch is halved until the run makes at least this many optimizer steps. On
# 2,000 photos (airbench, 64 px, 10 epochs, dev box): batch 512 = 30 steps reached 34.8 % val
# accuracy, 256 = 70 steps 98.8 %, 128 = 150 steps 99.4 %.
MIN_RUN_STEPS = 64
MIN_AUTO_BATCH = 32  # below this BatchNorm's batch statistics get noisy


def auto_batch_size(image_size: int, device_type: str, num_samples: int | None = None,
                    epochs: int | None = None) -> tuple[int, str]:
    """The preferred micro-batch for this image size and device; with the number of samples
    (per rank) and epochs, lowered so that a small set still gets MIN_RUN_STEPS updates."""
    batch, why = _device_batch(image_size, device_type)
    if num_samples is None or epochs is None:
        return batch, why
    preferred = batch
    while batch > MIN_AUTO_BATCH and (num_samples // batch) * epochs < MIN_RUN_STEPS:
        batch //= 2
    if batch < preferred:
        why = (f"{why}, halved to {batch}: {num_samples:,} images x {epochs} epochs then make "
               f"{(num_samples // batch) * epochs} optimizer steps (>= {MIN_RUN_STEPS} learn; "
               f"{preferred} would make {(num_samples // preferred) * epochs})")
    return batch, why


def _device_batch(image_size: int, device_type: str) -> tuple[int, str]:
    if device_type == "cuda":
        if image_size <= 64:
            return 512, "small images on CUDA: 512 keeps the GPU busy"
        return 256, "256 per GPU on CUDA, the ImageNet reference batch"
    if image_size <= 64:
        # On the 2-core dev box 256 runs no faster per image than 128 (the convs are already
        # large enough to use both cores), so the smaller batch gives twice the updates.
        return 128, "small images on CPU: per-image speed is flat from 128 up, more updates"
    return 64, "large images on CPU: 64 keeps a step under a few seconds"


def fitting_batch_size(config: TrainConfig, spec: ModelSpec, dataset, image_size: int,
                       device_type: str, world_size: int) -> tuple[int, str]:
    """`--batch-size auto`: the preferred batch (the device default, or this rank's share of
    --global-batch-size), lowered to the largest that fits in memory (batch_finder)."""
    import torch

    from .batch_finder import divisor_at_most, find_batch_size
    from .device import choose_channels_last, choose_precision
    from .models import build_model
    preferred, why = auto_batch_size(image_size, device_type,
                                     len(dataset) // world_size, config.epochs)
    global_batch = config.global_batch_size
    if global_batch is not None:
        if global_batch % world_size:
            raise TrainError(f"--global-batch-size {global_batch} is not a multiple of the "
                             f"{world_size} ranks")
        preferred = global_batch // world_size
        why = f"--global-batch-size {global_batch} over {world_size} rank(s)"
    limit = min(preferred, max(1, len(dataset) // world_size))
    device = torch.device(device_type)
    fit = find_batch_size(lambda: build_model(spec, dataset.num_classes), image_size=image_size,
                          num_classes=dataset.num_classes, device=device,
                          precision=choose_precision(config.precision, device).value,
                          channels_last=choose_channels_last(config.channels_last,
                                                             spec.conv).value,
                          optimizer=config.optimizer, limit=limit,
                          reserve_bytes=_resident_reserve(config, dataset, device, image_size))
    if fit.batch_size < 1:
        raise TrainError(f"not even one {image_size} px image fits in memory for {spec.name} "
                         f"({fit.how}); try a smaller --image-size or --model")
    batch = fit.batch_size
    if global_batch is not None:
        batch = divisor_at_most(preferred, batch)  # accumulation must add up to it exactly
    if batch == preferred:
        return batch, f"{why}; it fits ({fit.how})"
    if fit.batch_size >= limit and limit < preferred:
        return batch, f"{why}, but the train split has only {len(dataset)} images"
    return batch, f"{why}, but {preferred} does not fit: {batch} is the largest that does " \
                  f"({fit.how})"


def _resident_reserve(config: TrainConfig, dataset, device, image_size: int) -> int:
    """Memory the resident store will hold when the pipeline will be resident (it is decoded
    after the batch is chosen, so the finder leaves it room)."""
    if config.pipeline not in ("auto", "resident"):
        return 0
    from turbotrain.pipeline import PipelineOptions
    from turbotrain.pipeline.resident import memory_budget, resident_bytes
    need = resident_bytes(dataset, PipelineOptions(train=True, batch_size=1,
                                                   image_size=image_size, device=device))
    return need if need <= memory_budget(device)[0] else 0


def accum_for_global_batch(config: TrainConfig, batch: int, world_size: int) -> tuple[int, str]:
    """`--global-batch-size G`: accum-steps = G / (batch-size x ranks), which must be whole."""
    global_batch, per_step = config.global_batch_size, batch * world_size
    if global_batch % per_step:
        raise TrainError(f"--global-batch-size {global_batch} is not a multiple of batch-size "
                         f"{batch} x {world_size} rank(s) = {per_step}")
    accum = global_batch // per_step
    if config.accum_steps not in (1, accum):
        raise TrainError(f"--accum-steps {config.accum_steps} contradicts --global-batch-size "
                         f"{global_batch} = {batch} x {world_size} rank(s) x {accum}; give one")
    return accum, f"--global-batch-size {global_batch} = {batch} x {world_size} rank(s) x {accum}"


def resolve_schedule(config: TrainConfig, steps_per_epoch: int) -> tuple[TrainConfig, int, dict]:
    """(config with warmup_steps, total optimizer steps, reasons)."""
    total = config.epochs * steps_per_epoch
    if config.max_steps is not None:
        total = min(total, config.max_steps)
    reasons = {}
    warmup = config.warmup_steps
    if warmup is None:
        warmup, reasons["warmup_steps"] = auto_warmup(config, total, auto_warmup_steps(total))
    return config.replace(warmup_steps=warmup), total, reasons


def resolve_resume(config: TrainConfig, names: list[str] | None) -> tuple[TrainConfig, str]:
    """`--resume auto`, from the names in --out (None: no such folder): continue the run there
    when it has a checkpoint, else start a new one, which needs the folder missing or empty
    (train deletes nothing it did not write). Returns the config with `resume` True or False,
    and the reason."""
    if config.resume != "auto":
        return config.replace(resume=bool(config.resume)), ""
    if not config.out:
        raise TrainError("--resume auto needs --out RUNDIR (the run to continue or start)")
    if names and CHECKPOINT_NAME in names:
        return config.replace(resume=True), f"auto: {config.out} holds a checkpoint"
    if names:
        shown = ", ".join(printable(name) for name in names[:3]) + (", ..." if len(names) > 3
                                                                    else "")
        raise TrainError(f"--resume auto: --out {config.out} has no {CHECKPOINT_NAME} to "
                         f"continue and is not empty (holds {shown}), so no new run can start "
                         "there either; choose another --out")
    return config.replace(resume=False), f"auto: no checkpoint in {config.out} yet: a new run"


def default_run_dir(config: TrainConfig) -> str:
    name = Path(config.data.rstrip("/")).name or "data"
    return str(Path("runs") / f"{name}-{config.model.replace(':', '-')}-"
                              f"{time.strftime('%Y%m%d-%H%M%S')}")
