"""The same few small photo-like JPEGs as an ImageFolder, WebDataset shards (written by the real
`webdataset.TarWriter`/`ShardWriter`) and Hugging Face datasets (written by the real `datasets`),
for the source tests: each sharded source must prepare to what the ImageFolder prepares to."""
from __future__ import annotations

import io
from pathlib import Path

import numpy as np
from PIL import Image

CLASSES = ["cat", "dog", "eel"]
PER_CLASS = 4


def jpeg(seed: int, size=(40, 30)) -> bytes:
    """A smooth gradient with noise: photo-like enough to be a JPEG that is copied as it is."""
    rng = np.random.default_rng(seed)
    y, x = np.mgrid[0:size[1], 0:size[0]]
    base = np.stack([x * 5 + seed * 17, y * 7, (x + y) * 3], axis=-1)
    pixels = (base + rng.integers(0, 20, base.shape)) % 256
    out = io.BytesIO()
    Image.fromarray(pixels.astype(np.uint8)).save(out, "JPEG", quality=90)
    return out.getvalue()


def samples(split: str = "train") -> list[tuple[str, int, bytes]]:
    """(key, label, JPEG bytes) in ImageFolder's order (by class, then name)."""
    offset = 0 if split == "train" else 100
    return [(f"{name}{k:02d}", c, jpeg(offset + c * PER_CLASS + k))
            for c, name in enumerate(CLASSES) for k in range(PER_CLASS if split == "train" else 2)]


def image_folder(root: Path, splits=("train",)) -> Path:
    for split in splits:
        for key, label, data in samples(split):
            folder = root / split / CLASSES[label] if len(splits) > 1 else root / CLASSES[label]
            folder.mkdir(parents=True, exist_ok=True)
            (folder / f"{key}.jpg").write_bytes(data)
    return root


def webdataset_shards(folder: Path, split: str = "train", label: str = "cls",
                      maxcount: int = 5, compress: bool = False,
                      prefix: str | None = None) -> list[Path]:
    """ShardWriter shards `<prefix or split>-000000.tar` ... of the split's samples; label as
    .cls (index), .txt (name) or .json ({"label": name})."""
    import webdataset as wds
    folder.mkdir(parents=True, exist_ok=True)
    pattern = str(folder / f"{prefix or split}-%06d.tar{'.gz' if compress else ''}")
    with wds.ShardWriter(pattern, maxcount=maxcount, verbose=0) as sink:
        for key, c, data in samples(split):
            sample = {"__key__": key, "jpg": data}
            if label == "cls":
                sample["cls"] = c
            elif label == "txt":
                sample["txt"] = CLASSES[c]
            else:
                sample["json"] = {"label": CLASSES[c], "other": [1, 2]}
            sink.write(sample)
    return sorted(folder.glob(f"{prefix or split}-*"))


def hf_dataset(split: str = "train", string_labels: bool = False, image="image", label="label"):
    """A `datasets.Dataset` of the samples with the Image feature (and ClassLabel names)."""
    from datasets import ClassLabel, Dataset, Features, Image as HFImage, Value
    rows = samples(split)
    labels = [CLASSES[c] if string_labels else c for _, c, _ in rows]
    features = Features({image: HFImage(),
                         label: Value("string") if string_labels else ClassLabel(names=CLASSES)})
    data = {image: [{"bytes": d, "path": None} for _, _, d in rows], label: labels}
    return Dataset.from_dict(data, features=features)
