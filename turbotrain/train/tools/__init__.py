"""Tools that look at this machine and these settings: `turbotrain tune` (the fastest
pipeline, workers and batch size here) and `turbotrain info` (versions, features,
what `train` would pick).
"""
