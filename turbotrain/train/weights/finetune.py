"""Starting from weights: the model a run begins with, its head, what trains, and the recipe.

    train --data OUT --model resnet18 --pretrained            # torchvision's ImageNet weights
    train --data OUT --model timm:vit_tiny_patch16_224 --pretrained --image-size 64
    train --data OUT --init-from runs/a                       # a run of ours: its best weights
    train --data OUT --init-from weights.pt --freeze-backbone # a plain state_dict, head only

What is decided here, each printed as a decision line:

* **head**: the classifier layer (torchvision ResNets' `fc`, the last `nn.Linear` that outputs
  the class count for ours and other torchvision nets, `get_classifier()` for timm) is replaced
  by a fresh one when the weights were trained for another number of classes, or for other
  class names (a run's card names them); otherwise it is kept.
* **normalisation**: the input stem normalises as the weights expect: ImageNet's mean/std for
  torchvision's weights, the pretrained_cfg's for timm's (ImageNet's, or 0.5/0.5 for many
  ViTs), the source run's own for a turbotrain run; the dataset's own for a plain state_dict
  (it says nothing about its input).
* **freeze_backbone**: only the head trains; the rest keeps its weights, and stays in eval
  mode, so its BatchNorm statistics and dropout are the loaded model's too.
* **layer_decay F**: each depth below the head gets F times the learning rate of the one
  above it (BEiT's layer-wise decay): depths are timm's own layer groups for timm models, else the
  net's top-level blocks in order (a BatchNorm goes with the conv before it).
* **recipe** (automatic values only; flags given win): the warm-up is 2% of the run instead
  of 5%, and the learning rate depends on what the weights were trained for. On the same
  classes (continuing a task: a run's card names them, or a published model's class count
  matches) it is SAME_TASK_LR_FACTOR = 0.1 times the from-scratch rate: the weights already
  solve the task, and small steps keep what they know. On other classes (a fresh head) it
  stays the from-scratch rate, because the features must move too (plan/recipe.py has the
  numbers and the measurements).
  With --freeze-backbone a fresh head learns alone, at the from-scratch rate.

On `--resume` none of this loads anything: the checkpoint holds the weights, and the saved
config the resolved learning rate and warm-up; freezing and the parameter groups are rebuilt
the same way, so the optimizer state fits.
"""
from __future__ import annotations

import types
from dataclasses import dataclass

from torch import nn

from ..config.config import TrainConfig
from ..errors import TrainError
from ..models.models import Classifier, ModelSpec, build_model, get_model_spec
from ..plan import WeightsFacts
from .weights_in import Start, init_card, init_start, pretrained_start, source_classes

# The recipe's numbers (the LR factors, the warm-up) and the measurements behind them: plan/recipe.py.
PRETRAINED_AUTO_MODEL = "resnet18"
NORM_TYPES = (nn.modules.batchnorm._NormBase, nn.GroupNorm, nn.LayerNorm)


# ---------------------------------------------------------------------------- auto settings

@dataclass
class Hint:
    """What the starting weights say about --model / --image-size / --model-kwargs auto."""
    model: str | None = None
    model_kwargs: dict | None = None
    image_size: int | None = None
    reason: str = ""


def weights_hint(config: TrainConfig) -> Hint:
    if config.resume is True:  # the saved config has every value; the source may be gone
        return Hint()
    if config.init_from is not None:
        card = init_card(config.init_from)
        if card is not None:
            return Hint(card.model, dict(card.model_kwargs), card.image_size,
                        f"the model of the --init-from weights ({config.init_from})")
    elif config.pretrained:
        return Hint(PRETRAINED_AUTO_MODEL, reason=f"--pretrained: {PRETRAINED_AUTO_MODEL}, "
                    "the smallest of torchvision's ImageNet ResNets")
    return Hint()


def weights_facts(config: TrainConfig):
    """What the starting weights say, for the plan (plan.WeightsFacts), or None when the run
    starts from random weights. Reads --init-from's card (not its tensors), or --pretrained's
    published metadata; a failure is kept in `error`, for the plan to raise when it needs the
    weights (with --resume auto it may not: a resumed run has them in its checkpoint)."""
    if not config.from_weights or config.resume is True:
        return None
    try:
        hint = weights_hint(config)
        name = hint.model if config.model == "auto" and hint.model else config.model
        count, names = (None, None)
        if name != "auto" or config.init_from is not None:
            spec = get_model_spec(name) if config.init_from is None else None
            count, names = source_classes(config, spec)
    except TrainError as exc:
        return WeightsFacts(error=str(exc))
    return WeightsFacts(model=hint.model, model_kwargs=hint.model_kwargs,
                        image_size=hint.image_size, reason=hint.reason, source_classes=count,
                        source_names=None if names is None else tuple(names))


# ---------------------------------------------------------------------------- the model

def start_model(spec: ModelSpec, config: TrainConfig, dataset, *, resuming: bool,
                decide) -> Classifier:
    """The run's model, with its starting weights loaded (not when resuming: the checkpoint
    restores everything) and --freeze-backbone applied."""
    n = dataset.num_classes
    if spec.note:
        decide("img_size", spec.kwargs.get("img_size", "not passed"), spec.note)
    if resuming or not config.from_weights:
        model = build_model(spec, n, dataset.mean, dataset.std)
    else:
        start = (pretrained_start(spec, n, download=config.download) if config.pretrained
                 else init_start(config.init_from))
        decide("init", start.what, "--pretrained" if config.pretrained else "--init-from")
        if start.mean is not None:
            mean, std = start.mean, start.std
            decide("normalisation", f"mean {_rounded(mean)} std {_rounded(std)}", start.norm)
        else:
            mean, std = dataset.mean, dataset.std
            decide("normalisation", "the dataset's mean/std", "the weights name no input "
                   "statistics (a plain state_dict)")
        if start.net is not None:  # timm loaded its weights and sized the head itself
            model = Classifier(start.net, mean, std)
            head = find_head(model.net, n)
            replaced = start.num_classes is not None and start.num_classes != n
            decide("head", f"net.{head} {'replaced' if replaced else 'kept'}",
                   _head_reason(replaced, start.num_classes, n, names_differ=False))
        else:
            model = build_model(spec, n, mean, std)
            _load_into(model, start, spec, dataset, decide)
    if config.freeze_backbone:
        head = find_head(model.net, n)
        trained = freeze_backbone(model, head)
        decide("freeze_backbone", f"only net.{head} trains ({trained:,} weights)",
               "--freeze-backbone: the rest keeps the starting weights, in eval mode")
    return model


def _rounded(values) -> str:
    return "/".join(f"{v:.4g}" for v in values)


def find_head(net: nn.Module, num_classes: int) -> str:
    """The name (in `net`) of the classifier layer: timm's get_classifier(), else the last
    nn.Linear (or 1x1 conv, as SqueezeNet's) with `num_classes` outputs."""
    if hasattr(net, "get_classifier"):
        head = net.get_classifier()
        for name, module in net.named_modules():
            if module is head and name:
                return name
    found = None
    for name, module in net.named_modules():
        if isinstance(module, nn.Linear) and module.out_features == num_classes:
            found = name
    if found is None:
        for name, module in net.named_modules():
            if isinstance(module, nn.Conv2d) and module.out_channels == num_classes:
                found = name
    if found is None:
        raise TrainError(f"cannot tell which layer of {type(net).__name__} is the classifier "
                         f"head (no Linear with {num_classes} outputs)")
    return found


def _head_reason(replaced: bool, source: int | None, n: int, names_differ: bool) -> str:
    if names_differ:
        return f"the weights were trained on other classes (same count, {n}, other names)"
    if replaced:
        return f"the weights have {source} classes, this dataset {n}: a fresh head"
    return f"the weights were trained on these {n} classes"


def _load_into(model: Classifier, start: Start, spec: ModelSpec, dataset, decide) -> None:
    net, n = model.net, dataset.num_classes
    head = find_head(net, n)
    own = net.state_dict()
    head_keys = {k for k in own if k.startswith(head + ".")}
    state = start.state
    source = start.num_classes
    if source is None and f"{head}.weight" in state:
        source = state[f"{head}.weight"].shape[0]
    # A run's card names its classes; published weights' names (ImageNet's) are never a
    # dataset's folder names, so only their count counts.
    names_differ = (start.card is not None and len(start.card.classes) == n
                    and tuple(start.card.classes) != tuple(dataset.class_names))
    replaced = names_differ or (source is not None and source != n)
    if replaced:
        state = {k: v for k, v in state.items() if k not in head_keys}
    missing = [k for k in own if k not in state and not (replaced and k in head_keys)
               and not k.endswith("num_batches_tracked")]
    unexpected = [k for k in state if k not in own]
    wrong = [f"{k} {tuple(state[k].shape)} vs {tuple(own[k].shape)}" for k in state
             if k in own and state[k].shape != own[k].shape]
    if missing or unexpected or wrong:
        parts = [f"{len(items)} {what} ({', '.join(items[:3])}{', ...' if len(items) > 3 else ''})"
                 for what, items in (("missing", missing), ("unexpected", unexpected),
                                     ("of another shape", wrong)) if items]
        raise TrainError(f"{start.flag}: the weights of {start.what} do not fit {spec.name}: "
                         f"{'; '.join(parts)} tensors; is it a {spec.name}?")
    net.load_state_dict(state, strict=False)
    decide("head", f"net.{head} {'replaced' if replaced else 'kept'}",
           _head_reason(replaced, source, n, names_differ))


# ---------------------------------------------------------------------------- what trains

def _always_eval(self, mode: bool = True):
    return nn.Module.train(self, False)


def freeze_backbone(model: Classifier, head: str) -> int:
    """Only net.`head` keeps requires_grad; the other modules stay in eval mode whatever
    model.train() says. Returns the number of trainable weights."""
    net = model.net
    net.requires_grad_(False)
    head_module = net.get_submodule(head)
    head_module.requires_grad_(True)
    path = [""] + [".".join(head.split(".")[:i]) for i in range(1, head.count(".") + 2)]
    for parent_name in path[:-1]:
        parent = net.get_submodule(parent_name)
        for child_name, child in parent.named_children():
            full = f"{parent_name}.{child_name}" if parent_name else child_name
            if full not in path:
                child.train = types.MethodType(_always_eval, child)
                child.eval()
    return sum(p.numel() for p in head_module.parameters())


def depth_of_parameters(net: nn.Module, head: str) -> dict[str, int]:
    """Parameter name -> depth (0 = input side); the head is the deepest."""
    if hasattr(net, "group_matcher"):  # timm: its own layer grouping (BEiT's, for ViTs)
        from timm.models import group_parameters
        return group_parameters(net, net.group_matcher(coarse=False), reverse=True)
    total = sum(p.numel() for p in net.parameters()) or 1
    blocks = list(net.named_children())
    while True:
        # Open a container that holds nearly all weights (airbench's `body`, a ViT's encoder),
        # or the largest one while there are fewer than 4 blocks (features + classifier).
        share = [(sum(p.numel() for p in m.parameters()) / total, i)
                 for i, (_, m) in enumerate(blocks) if list(m.children())]
        holding = sum(1 for _, m in blocks if any(True for _ in m.parameters()))
        if not share:
            break
        largest, index = max(share)
        if not (largest > 0.9 or (holding < 4 and largest > 0.5)):
            break
        name, module = blocks[index]
        blocks[index:index + 1] = [(f"{name}.{c}", m) for c, m in module.named_children()]
    depths, depth = {}, -1
    for name, module in blocks:
        params = [f"{name}.{p}" for p, _ in module.named_parameters()]
        if not params:
            continue
        if not (isinstance(module, NORM_TYPES) and depth >= 0):
            depth += 1  # a norm layer belongs to the conv before it
        for param in params:
            depths[param] = depth
    in_head = [p for p in depths if p.startswith(head + ".")]
    deepest = 1 + max((d for p, d in depths.items() if p not in in_head), default=-1)
    for param in in_head:  # the head is the deepest, wherever it was registered
        depths[param] = deepest
    for param, _ in net.named_parameters():  # held by an opened container (a class token,
        depths.setdefault(param, 0)          # a position embedding): the input side
    return depths


def optimizer_groups(model: Classifier, config: TrainConfig, *, num_classes: int, lr: float,
                     weight_decay: float, decide) -> list[dict] | None:
    """--layer-decay's parameter groups (decay and no-decay per depth, the head's first, so
    the logged LR is the peak one); None without it (schedule.param_groups then)."""
    if config.layer_decay >= 1.0:
        return None
    head = find_head(model.net, num_classes)
    depths = depth_of_parameters(model.net, head)
    deepest = max(depths.values())
    groups: dict[tuple[int, bool], dict] = {}
    for name, param in model.net.named_parameters():
        if not param.requires_grad:
            continue
        depth = depths.get(name, deepest)
        decays = param.ndim >= 2
        scale = config.layer_decay ** (deepest - depth)
        group = groups.setdefault((depth, decays), {
            "params": [], "lr": lr * scale, "weight_decay": weight_decay if decays else 0.0})
        group["params"].append(param)
    ordered = [groups[key] for key in sorted(groups, key=lambda k: (-k[0], not k[1]))]
    low = config.layer_decay ** deepest
    decide("layer_decay", f"{config.layer_decay} over {deepest + 1} depths",
           f"lr x{low:.3g} at the input .. x1 at the head (net.{head})")
    return ordered
