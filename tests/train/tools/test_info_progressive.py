"""`turbotrain info` states the progressive-resizing decision with its reason, for this machine
and for one described (--machine)."""
from __future__ import annotations

from turbotrain.train.plan import PRESETS
from turbotrain.train.tools.info_facts import train_picks

from ..tiny_data import write_tiny_dataset


def test_info_states_the_progressive_decision(tmp_path):
    photos = write_tiny_dataset(tmp_path / "photos", size=72)  # photos: > 64 px
    small = write_tiny_dataset(tmp_path / "small", size=28)
    cifar = write_tiny_dataset(tmp_path / "cifar", size=32)
    picks, _, _ = train_picks(str(photos), PRESETS["h200"])
    assert picks["progressive"].startswith("off: 64 px training (< 128)")
    # 28 px small images: off, with the measured reason; TTA off.
    picks, _, _ = train_picks(str(small), PRESETS["cpu2"])
    assert picks["progressive"].startswith("off: small images at 28 px")
    assert "Fashion-MNIST" in picks["progressive"]
    assert picks["tta"].startswith("off: small images at 28 px")
    picks, _, _ = train_picks(str(cifar), PRESETS["cpu2"])
    assert picks["progressive"].startswith("off: small images at 32 px (> 28)")
