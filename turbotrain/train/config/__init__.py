"""The settings: TrainConfig (one dataclass), the flags made from it, the YAML files
layered under them, and `--model-kwargs`. No torch is imported here.
"""
