"""Fuzzes the compiled decode kernel with mutated JPEGs in ONE process, for
tests/security/test_jpeg_kernel.py.

    python tests/security/fuzz_jpeg_kernel.py WORKDIR --seed S --count N [--native SO]

Writes a split of N seeded mutations of a few valid JPEGs (bit flips, truncations, byte runs,
lying SOF sizes, spliced markers, duplicated chunks, random bytes; baseline at every chroma
subsampling, greyscale and progressive), each stored with the metadata of the image it came
from, then decodes every sample through `cpu_decode` (the native kernel, never the Python
path) in four ways: train and eval, 32 and 224 px, inline and on a native pool, batch by batch.
`--native SO` loads that build of the extension instead (the AddressSanitizer build).

A failure is: a crash (the test sees the exit status), an exception other than
SampleDecodeError, an error message that is not one printable line, or the inline and pool
runs disagreeing on which samples fail. Prints one JSON object:

    {"runs": N, "refused": K, "decoded": M, "failures": [...]}
"""
from __future__ import annotations

import argparse
import importlib.util
import io
import json
import random
import sys
from pathlib import Path


def load_native(path: str) -> None:
    """Makes `turbotrain.pipeline._native` the extension at `path` (before kernel imports it)."""
    spec = importlib.util.spec_from_file_location("turbotrain.pipeline._native", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    sys.modules["turbotrain.pipeline._native"] = module


def base_images():
    """(jpeg bytes, height, width) of the valid JPEGs the mutations start from."""
    import numpy as np
    import simplejpeg
    from PIL import Image
    rng = np.random.default_rng(3)
    found = []
    for k, (h, w, sub) in enumerate([(120, 160, "420"), (97, 131, "444"), (150, 90, "422"),
                                     (80, 200, "411"), (110, 110, "Gray")]):
        y, x = np.mgrid[0:h, 0:w]
        image = np.stack([x * 255 // w, y * 255 // h, (x + y + 40 * k) % 256], -1)
        image = np.clip(image + rng.normal(0, 8, image.shape), 0, 255).astype(np.uint8)
        found.append((simplejpeg.encode_jpeg(image, quality=85, colorsubsampling=sub), h, w))
    out = io.BytesIO()
    Image.fromarray(image).save(out, "JPEG", quality=80, progressive=True)
    found.append((out.getvalue(), 110, 110))
    return found


def mutate(jpeg: bytes, rng: random.Random) -> tuple[bytes, str]:
    data = bytearray(jpeg)
    kind = rng.choice(["flip", "flip", "truncate", "run", "lie", "marker", "duplicate",
                       "random", "scans"])
    if kind == "flip":
        for _ in range(rng.randint(1, 24)):
            data[rng.randrange(2, len(data))] ^= 1 << rng.randrange(8)
    elif kind == "truncate":
        data = data[:rng.randrange(2, len(data))]
    elif kind == "run":
        start = rng.randrange(2, len(data))
        fill = rng.choice([0x00, 0xFF, rng.randrange(256)])
        data[start:start + rng.randint(1, 400)] = bytes([fill]) * rng.randint(1, 400)
    elif kind == "lie":
        at = max(data.find(b"\xff\xc0"), data.find(b"\xff\xc2"))
        field = at + 5 + rng.choice([0, 2])  # height or width
        data[field:field + 2] = rng.choice([1, 7, 65535, rng.randrange(1, 4000)]).to_bytes(2, "big")
    elif kind == "marker":
        at = rng.randrange(2, len(data))
        segment = bytes([0xFF, rng.choice([0xC0, 0xC4, 0xDA, 0xDB, 0xDD, 0xD9, 0xD0, 0xFE])])
        segment += rng.randrange(0, 70000).to_bytes(3, "big")[1:] + rng.randbytes(rng.randint(0, 64))
        data[at:at] = segment
    elif kind == "duplicate":
        start = rng.randrange(2, len(data))
        chunk = data[start:start + rng.randint(1, 2000)]
        data[start:start] = chunk * rng.randint(1, 8)
    elif kind == "random":
        data = bytearray(b"\xff\xd8" + rng.randbytes(rng.randint(0, 3000)))
    else:  # the last SOS segment repeated: many scans (capped at 500 by the kernel)
        at = data.rfind(b"\xff\xda")
        scan = data[at:-2]
        copies = min(rng.randint(2, 700), 1_500_000 // len(scan))  # pages hold 2 MiB
        data = data[:at] + scan * copies + b"\xff\xd9"
    return bytes(data), kind


def write_split(path: Path, count: int, seed: int) -> list[str]:
    from turbotrain.datasets.beton import layout
    from turbotrain.datasets.beton.writer import BetonWriter
    rng = random.Random(seed)
    bases = base_images()
    kinds = []
    with BetonWriter(path, count, page_size=layout.MIN_PAGE_SIZE) as writer:
        for i in range(count):
            jpeg, h, w = rng.choice(bases)
            payload, kind = mutate(jpeg, rng)
            writer.append(layout.MODE_JPEG, h, w, payload, i)
            kinds.append(kind)
    return kinds


def resize_cases(count: int, seed: int) -> dict:
    """Raw images of random sizes (1 to 300 px a side) with random boxes, inside and outside
    the image, to random output sizes (1 to 224), on the cropped and the small path: the
    resampler and the pad-crop must write only their slot and refuse a box outside."""
    import numpy as np
    from turbotrain.pipeline import kernel
    rng = np.random.default_rng(seed)
    worker, refused, failures = kernel.NATIVE.Worker(), 0, []
    for case in range(count):
        h, w = (int(v) for v in rng.integers(1, 301, 2))
        size = int(rng.choice([1, 2, 3, 7, 16, 32, 64, 224]))
        small = bool(rng.integers(0, 2))
        image = rng.integers(0, 256, (h, w, 3), dtype=np.uint8)
        if small:
            top, left = (int(v) for v in rng.integers(-3, 4, 2))
            box_h = box_w = size if rng.random() < 0.9 else int(rng.integers(1, 300))
        else:
            top, left = int(rng.integers(-2, h + 2)), int(rng.integers(-2, w + 2))
            box_h, box_w = int(rng.integers(1, h + 3)), int(rng.integers(1, w + 3))
        table = kernel.sample_table(data=image.ctypes.data, size=image.size, height=h, width=w,
                                    top=top, left=left, box_h=box_h, box_w=box_w,
                                    mode=kernel.NATIVE.MODE_RAW, flip=case % 2)
        guard = np.full((3, size, size, 3), 77, np.uint8)  # slots 0 and 2 must stay untouched
        out = guard[1:2]
        result = worker.run(table, size, small, out)
        refused += bool(result)
        if not (guard[0] == 77).all() or not (guard[2] == 77).all():
            failures.append({"case": case, "wrote outside its slot": [h, w, size, small]})
        if result and not one_line(result[0][1]):
            failures.append({"case": case, "reason": result[0][1]})
    return {"resize_runs": count, "resize_refused": refused, "resize_failures": failures}


def one_line(message: str) -> bool:
    from turbotrain.printable import printable
    return "\n" not in message and printable(message) == message


def run(workdir: Path, count: int, seed: int) -> dict:
    import numpy as np
    import torch
    from turbotrain.datasets import open_dataset
    from turbotrain.pipeline import kernel
    from turbotrain.pipeline.cpu_decode import BatchDecoder, DecodeAhead, SampleDecodeError
    assert kernel.NATIVE is not None, kernel.STATUS
    workdir.mkdir(parents=True, exist_ok=True)
    kinds = write_split(workdir / "train.beton", count, seed)
    dataset = open_dataset(workdir / "train.beton")
    batches = [np.arange(s, min(s + 16, count)) for s in range(0, count, 16)]
    failures, refused, decoded = [], set(), 0
    for size in (32, 224):
        for train in (True, False):
            decoder = BatchDecoder(dataset, image_size=size, train=train, seed=seed)
            inline = {}
            for indices in batches:
                out = np.empty((len(indices), size, size, 3), np.uint8)
                try:
                    for position, reason in decoder.decode_all(indices, 1, out):
                        inline[int(indices[position])] = reason
                except Exception as e:  # noqa: BLE001  (anything but a list is a failure)
                    failures.append({"size": size, "train": train, "error": repr(e)})
            pooled = {}
            ahead = DecodeAhead(decoder, threads=2)
            pending = list(batches)
            while pending:
                try:
                    for indices, _ in ahead.run(1, pending, lambda ix: torch.empty(
                            (len(ix), size, size, 3), dtype=torch.uint8)):
                        pending = pending[1:]
                except SampleDecodeError as e:
                    message = str(e)
                    if not one_line(message) or "does not decode as a JPEG (" not in message:
                        failures.append({"size": size, "train": train, "message": message})
                    sample = int(message.split(": sample ")[1].split()[0])
                    pooled[sample] = message
                    pending = [np.asarray([i for i in pending[0] if i > sample])] + pending[1:]
                    pending = [b for b in pending if len(b)]
                except Exception as e:  # noqa: BLE001
                    failures.append({"size": size, "train": train, "error": repr(e)})
                    break
            ahead.close()
            if set(inline) != set(pooled):
                failures.append({"size": size, "train": train,
                                 "disagree": sorted(set(inline) ^ set(pooled))[:10]})
            for i, reason in inline.items():
                if not one_line(reason):
                    failures.append({"sample": i, "kind": kinds[i], "reason": reason})
            refused |= set(inline)
            decoded += count - len(inline)
    resized = resize_cases(count, seed)
    return {"runs": count, "refused": len(refused), "decoded": decoded,
            "kinds": sorted(set(kinds)), "resize_runs": resized["resize_runs"],
            "resize_refused": resized["resize_refused"],
            "failures": failures + resized["resize_failures"]}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("workdir", type=Path)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--count", type=int, default=200)
    parser.add_argument("--native", help="the extension build to load (an ASan build)")
    args = parser.parse_args(argv)
    if args.native:
        load_native(args.native)
    print(json.dumps(run(args.workdir, args.count, args.seed)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
