"""Fuzzes weights files in ONE process, for tests/security/test_weights_files.py.

    python tests/security/fuzz_weights.py WORKDIR CASES SEED

Writes one real weights file (compact28, 2 classes, 16 px, its card), then CASES times writes a
mutated copy and loads it as eval, predict and export do (`weights.load_classifier`): the
safetensors header's JSON mutated (dtypes, shapes, offsets, metadata), the card's JSON mutated
(every field: fuzz_dataset_json's values, other model names, model_kwargs that make a model
huge or unbuildable, too many classes), or the file's bytes cut, flipped or given a huge
header length.

Acceptable: a model whose logits have the card's class count, or one TrainError line. Prints
{"cases": N, "refused": K, "problems": [...]}; a problem is any other exception or a message
that is not one printable line.
"""
from __future__ import annotations

import json
import random
import struct
import sys
import traceback
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

import torch  # noqa: E402

from tests.security.fuzz_dataset_json import VALUES, _parent, _paths  # noqa: E402
from turbotrain.printable import printable  # noqa: E402
from turbotrain.train.errors import TrainError  # noqa: E402
from turbotrain.train.models.models import build_model, get_model_spec  # noqa: E402
from turbotrain.train.weights.weights import CARD_KEY, ModelCard, load_classifier, save_weights  # noqa

MODELS = ["compact28", "resnet9", "airbench", "resnet18", "resnet50", "vit_b_16",
          "timm:resnet18", "timm:no_such_net", "os.system", "", "../compact28", "x" * 300]
KWARGS = [{}, {"width_per_group": 1024}, {"width_per_group": 128}, {"groups": 0},
          {"num_classes": 5}, {"depth": 10**9}, {"width": 2**31}, {"drop_rate": float("nan")},
          {"a" * 5000: 1}, {"__class__": "os.system"}, {"layers": [1] * 65},
          {"norm_layer": "torch.nn.Identity"}, {"dropout": 0.5}]


def header_of(data: bytes) -> tuple[dict, int]:
    (length,) = struct.unpack("<Q", data[:8])
    return json.loads(data[8:8 + length]), length


def with_header(data: bytes, header: dict, old_length: int) -> bytes:
    text = json.dumps(header).encode("utf-8", "surrogatepass")
    text += b" " * (-len(text) % 8)
    return struct.pack("<Q", len(text)) + text + data[8 + old_length:]


def mutate_card(card: dict, rng: random.Random) -> tuple[dict, str]:
    card = json.loads(json.dumps(card))
    kind = rng.choice(["set", "set", "drop", "model", "kwargs", "classes"])
    if kind == "model":
        card["model"] = rng.choice(MODELS)
        return card, f"model {card['model'][:40]!r}"
    if kind == "kwargs":  # to a constructor that takes keyword arguments, mostly
        card["model"] = rng.choice(["resnet18", "resnet50", "resnet50", "compact28"])
        card["model_kwargs"] = rng.choice(KWARGS)
        return card, f"{card['model']} model_kwargs {str(card['model_kwargs'])[:60]}"
    if kind == "classes":
        count = rng.choice([0, 1, 3, 200_001, 4_000_000])
        card["classes"] = [rng.choice(["", "c", "=cmd", 7])] * count
        return card, f"classes x{count}"
    path = rng.choice([p for p in _paths(card) if p])
    parent = _parent(card, path)
    if kind == "drop":
        del parent[path[-1]]
    else:
        parent[path[-1]] = rng.choice(VALUES)
    return card, f"card {kind} {'.'.join(map(str, path))}"


def mutate(data: bytes, rng: random.Random) -> tuple[bytes, str]:
    header, length = header_of(data)
    kind = rng.choice(["card", "card", "card", "header", "header", "bytes"])
    if kind == "card":
        card, what = mutate_card(json.loads(header["__metadata__"][CARD_KEY]), rng)
        header["__metadata__"][CARD_KEY] = json.dumps(card)
        return with_header(data, header, length), what
    if kind == "header":
        path = rng.choice([p for p in _paths(header) if p and p[0] != "__metadata__"])
        parent = _parent(header, path)
        parent[path[-1]] = rng.choice(VALUES + [[1 << 40], [0], [-1, 3], "F64", "I8", "BOOL",
                                                [0, 1 << 62]])
        return with_header(data, header, length), f"header {'.'.join(map(str, path))}"
    op = rng.choice(["truncate", "flip", "length"])
    out = bytearray(data)
    if op == "truncate":
        del out[rng.randrange(len(out)):]
    elif op == "flip":
        for _ in range(rng.randint(1, 6)):
            out[rng.randrange(min(len(out), 8 + length))] ^= 1 << rng.randrange(8)
    else:
        out[:8] = struct.pack("<Q", rng.choice([0, 7, length - 1, 1 << 40, (1 << 64) - 1]))
    return bytes(out), f"bytes {op}"


def main() -> int:
    workdir, cases, seed = Path(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3])
    workdir.mkdir(parents=True, exist_ok=True)
    rng = random.Random(seed)
    torch.manual_seed(0)
    card = ModelCard("compact28", ("a", "b"), 16, (70.0, 70.0, 70.0), (60.0, 60.0, 60.0))
    good = workdir / "good.safetensors"
    save_weights(good, build_model(get_model_spec("compact28"), 2), card)
    original = good.read_bytes()
    images = torch.zeros((2, 3, 16, 16), dtype=torch.uint8)
    problems, refused = [], 0
    for case in range(cases):
        data, what = mutate(original, rng)
        path = workdir / f"case-{case % 10}.safetensors"
        path.write_bytes(data)
        try:
            model, loaded = load_classifier(path)
            with torch.no_grad():
                logits = model(images)
            if logits.shape != (2, loaded.num_classes):
                problems.append({"case": what, "error": f"logits of shape {logits.shape}"})
        except TrainError as e:
            refused += 1
            if "\n" in str(e) or printable(str(e)) != str(e):
                problems.append({"case": what, "error": f"not one printable line: {e!s:.300}"})
        except Exception as e:  # anything else is a finding
            problems.append({"case": what, "error": f"{type(e).__name__}: {str(e)[:300]}",
                             "where": traceback.format_exc(limit=-3)[-600:]})
    json.dump({"cases": cases, "refused": refused, "problems": problems}, sys.stdout)
    return 0


if __name__ == "__main__":
    sys.exit(main())
