"""A trained model, used: `turbotrain eval`, `predict` and `export`, and what they share
(inference.py: loading `--run`/`--weights`, the run's settings as defaults).
"""
