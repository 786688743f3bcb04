"""The weights a run leaves for people to use: RUN/best.safetensors, rewritten whenever the val
accuracy beats every earlier evaluation of the run, and RUN/final.safetensors at the end.

Each is `weights.save_weights`' file: the whole Classifier state (the input stem's normalisation
included) and a card with the model name, class names, image size, mean/std, model_kwargs and
where the weights came from (step, epoch, val_accuracy, val_top5, dataset, run folder), so that
`weights.load_classifier(RUN)` rebuilds the model exactly. `checkpoint.pt` stays the resume state.

With --ema the files hold the EMA weights (the card's info says `"weights": "ema"`), and "best"
is judged on the EMA weights' own val accuracy, evaluated for the purpose at every evaluation
(one extra pass over the val split per epoch). The best accuracy so far is in the trainer's
counters, hence in every checkpoint, so a resumed run keeps comparing against it.

Every rank evaluates (the sums are all-reduced); only rank 0 writes.
"""
from __future__ import annotations

import json

import torch

from ..step.loop import evaluate
from .weights import BEST_NAME, FINAL_NAME, ModelCard, save_weights


class WeightsKeeper:
    def __init__(self, run):
        self.run = run

    @property
    def module(self) -> torch.nn.Module:
        return self.run.ema.module if self.run.ema is not None else self.run.model

    def evaluated(self, counters, result: dict) -> None:
        """After an evaluation of the model (every rank): writes best.safetensors when the kept
        weights beat the best val accuracy so far."""
        run = self.run
        if run.ema is not None:
            result = evaluate(run.ema.module, run.val_pipeline, device=run.device,
                              precision=run.precision, channels_last=run.channels_last,
                              env=run.env, tta=run.config.tta)
            counters.eval_seconds += result.pop("eval_seconds")
        accuracy = result["val_accuracy"]
        if accuracy <= counters.best_val_accuracy:
            return
        counters.best_val_accuracy = accuracy
        counters.best_step = counters.step
        self._write(BEST_NAME, counters, result)

    def finish(self, counters, result: dict | None) -> dict:
        """final.safetensors (`result`: the kept weights' last evaluation, None without a val
        split); returns the summary's entries about the files."""
        self._write(FINAL_NAME, counters, result or {})
        best = counters.best_val_accuracy
        return {"best_val_accuracy": best if best >= 0 else None,
                "best_step": counters.best_step if best >= 0 else None,
                "weights_best": str(self.run.run_dir / BEST_NAME) if best >= 0 else None,
                "weights_final": str(self.run.run_dir / FINAL_NAME)}

    def card(self, counters, result: dict) -> ModelCard:
        run, config = self.run, self.run.config
        stem = self.module.stem
        # The stem holds 1/std and -mean/std; 4 decimals undo float32's rounding of 1/std.
        std = [round(1.0 / float(v), 4) for v in stem.scale.flatten()]
        mean = [round(-float(shift) * s, 4) for shift, s in zip(stem.shift.flatten(), std)]
        info = {"step": counters.step, "epoch": round(counters.epoch + counters.micro_in_epoch
                                                      / (run.steps_per_epoch
                                                         * config.accum_steps), 4),
                "val_accuracy": result.get("val_accuracy"), "val_top5": result.get("val_top5"),
                "dataset": config.data, "run": str(run.run_dir),
                "weights": "ema" if run.ema is not None else "model"}
        if config.init_from is not None or config.pretrained:
            info["started_from"] = config.init_from or "pretrained"
        kwargs = json.loads(config.model_kwargs) if config.model_kwargs else {}
        return ModelCard(model=config.model, classes=tuple(run.classes),
                         image_size=config.image_size, mean=tuple(mean), std=tuple(std),
                         model_kwargs=kwargs, info=info, eval_size=config.eval_res,
                         tta=bool(config.tta), blurpool=config.blurpool)

    def _write(self, name: str, counters, result: dict) -> None:
        if self.run.env.is_main:
            save_weights(self.run.run_dir / name, self.module, self.card(counters, result))
