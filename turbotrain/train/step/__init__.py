"""The one training step and what it runs on: StepEngine (loop.py), the LR schedule,
mixup/cutmix, the EMA; the device, precision and thread decisions, torch.distributed,
the host allocator setting.
"""
