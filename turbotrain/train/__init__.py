"""The `train` command's engine: models, recipe, loop, checkpoints and reports, one folder
per concern (docs/ARCHITECTURE.md "Layout"): engine/ (the run), step/ (the training step),
records/, weights/, models/, plan/, config/, use/ (eval, predict, export), tools/ (tune,
info).

    from turbotrain.train import TrainConfig, train
    summary = train(TrainConfig(data="OUT", epochs=2))

Importing this package is cheap (no torch); `train` imports the rest on first use.
"""
from .config.config import TrainConfig
from .errors import Interrupted, TrainError, TrainingDiverged


def train(config: TrainConfig) -> dict:
    # lazy: `import turbotrain.train` needs no torch (~1.5 s)
    from .engine.trainer import train as _train
    return _train(config)


__all__ = ["Interrupted", "TrainConfig", "TrainError", "TrainingDiverged", "train"]
