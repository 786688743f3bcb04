"""Weights in and out: `--init-from` / `--pretrained` (weights_in.py, finetune.py),
best/final.safetensors and their card (keep_best.py, weights.py).
"""
