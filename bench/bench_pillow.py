"""PIL decode + resize to 224: pillow-simd (as `make install` builds it) against plain pillow.

    .venv/bin/python bench/bench_pillow.py [--images 200] [--rounds 3] [--plain-version 13.0.0]

Both in one run: this environment's PIL (pillow-simd, built by scripts/build_pillow_simd.py) and
plain pillow, installed with `pip install --target bench/.cache/pillow-plain[-VERSION]` (the
newest unless --plain-version) and put first on PYTHONPATH. Each side runs the same timing code
in a fresh process, one thread, on --images photo-like 512x384 q90 JPEGs held in memory (the
synthetic generator, cached under bench/.cache/); sides alternate over --rounds, each round the
best of --repeats passes, and the best round counts (the machine is shared).

* jpeg: Image.open + convert("RGB") (decode: torchvision's pil_loader), then
  resize((224, 224), BILINEAR) (what torchvision's Resize / RandomResizedCrop do to a PIL image).
* png: `encode_sample` on the same images as PNGs, prepare-dataset's one PIL path (PIL decode,
  then cv2 resize and simplejpeg encode as for JPEGs). prepare-dataset's JPEG sources never
  touch PIL: simplejpeg decodes them, cv2 resizes them.

Writes bench/results/pillow.json. Without pillow-simd installed it says so and writes a skip.
"""
from __future__ import annotations

import argparse
import io
import os
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent
CACHE = ROOT / ".cache"
RESULTS = ROOT / "results" / "pillow.json"
sys.path.insert(0, str(ROOT.parent))
sys.path.insert(0, str(ROOT))

import common  # noqa: E402

SIZE = (512, 384)  # width, height: a small photo, as prepare-dataset's default --max-side 512
OUTPUT = (224, 224)


# -- data -----------------------------------------------------------------------------------------
def photos(images: int) -> tuple[list[Path], list[Path]]:
    """The JPEGs (written once) and the same pixels as PNGs."""
    import cv2
    from turbotrain.datasets.synthetic import write_shapes_imagefolder
    root = CACHE / f"pillow-{SIZE[0]}-{images // 10}"
    write_shapes_imagefolder(root, train_per_class=images // 10, val_per_class=0, size=SIZE,
                             quality=90)
    jpegs = sorted((root / "train").rglob("*.jpg"))
    pngs = []
    for jpeg in jpegs:
        png = root / "png" / jpeg.parent.name / jpeg.with_suffix(".png").name
        if not png.exists():
            png.parent.mkdir(parents=True, exist_ok=True)
            cv2.imwrite(str(png), cv2.imread(str(jpeg)))
        pngs.append(png)
    return jpegs, pngs


def plain_pillow(version: str | None) -> Path:
    """A `pip install --target` folder holding plain pillow (once)."""
    folder = CACHE / ("pillow-plain" + (f"-{version}" if version else ""))
    if not (folder / "PIL").is_dir():
        subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--target",
                        str(folder), f"pillow=={version}" if version else "pillow"], check=True)
    return folder


# -- one side, in a child process -----------------------------------------------------------------
def best_pass(work, items: list[bytes], repeats: int) -> list[float]:
    """The seconds [total, part...] of the fastest of `repeats` passes, after one untimed."""
    work(items[: max(1, len(items) // 10)])
    return min((work(items) for _ in range(repeats)), key=lambda parts: parts[0])


def child(jpeg_list: str, png_list: str, repeats: int) -> dict:
    import PIL
    from PIL import Image
    from turbotrain.datasets.beton.sample_codec import encode_sample

    def decode_resize(blobs: list[bytes]) -> list[float]:
        decode = resize = 0.0
        for data in blobs:
            started = time.perf_counter()
            image = Image.open(io.BytesIO(data)).convert("RGB")
            decoded = time.perf_counter()
            image.resize(OUTPUT, Image.BILINEAR)
            resize += time.perf_counter() - decoded
            decode += decoded - started
        return [decode + resize, decode, resize]

    def prepare(blobs: list[bytes]) -> list[float]:
        started = time.perf_counter()
        for data in blobs:
            encode_sample(data, encoding="auto", max_side=512, quality=90)
        return [time.perf_counter() - started]

    jpegs = [Path(p).read_bytes() for p in Path(jpeg_list).read_text().split("\n") if p]
    pngs = [Path(p).read_bytes() for p in Path(png_list).read_text().split("\n") if p]
    total, decode, resize = best_pass(decode_resize, jpegs, repeats)
    (png_total,) = best_pass(prepare, pngs, repeats)
    return {"version": PIL.__version__, "module": str(Path(PIL.__file__).parent),
            "jpeg_images_per_second": len(jpegs) / total,
            "decode_ms": 1000 * decode / len(jpegs), "resize_ms": 1000 * resize / len(jpegs),
            "png_prepare_images_per_second": len(pngs) / png_total}


def env_with_pillow(folder: Path | None) -> dict:
    """os.environ for a child whose PIL comes from `folder` (None: the venv's own)."""
    env = dict(os.environ)
    if folder is not None:  # before site-packages: its PIL wins
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(folder), env.get("PYTHONPATH")]))
    return env


def run_child(pythonpath: Path | None, lists: tuple[Path, Path], repeats: int) -> dict:
    env = env_with_pillow(pythonpath)
    env.update(OMP_NUM_THREADS="1", OPENCV_FOR_THREADS_NUM="1")  # one core per side
    result = common.run_child([__file__, "--child", *lists, "--repeats", repeats], env=env)
    if "error" in result:  # both sides are needed for the ratios
        raise RuntimeError(f"child failed: {result['error']}")
    return result


def side_line(r: dict) -> str:
    return (f"{r['version']}: {r['jpeg_images_per_second']:.0f} JPEG decode+resize/s "
            f"({r['decode_ms']:.2f} + {r['resize_ms']:.2f} ms), "
            f"{r['png_prepare_images_per_second']:.0f} PNG prepare/s")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0], allow_abbrev=False)
    parser.add_argument("--images", type=int, default=200)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--plain-version", default=None,
                        help="plain pillow to compare with (default: the newest)")
    parser.add_argument("--child", nargs=2, default=None, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child:
        common.print_result(child(*args.child, args.repeats))
        return 0

    from turbotrain.train.tools.info_facts import pillow_build
    import PIL
    command = common.command_line(__file__, argv)
    if not pillow_build(PIL.__version__).startswith("pillow-simd"):
        why = (f"pillow-simd is not installed here (PIL {PIL.__version__}); "
               "scripts/build_pillow_simd.py builds it")
        print(why)
        common.write_results(RESULTS, {"command": command, "skipped": why})
        return 0
    jpegs, pngs = photos(args.images)
    lists = (CACHE / "pillow-jpegs.txt", CACHE / "pillow-pngs.txt")
    for path, files in zip(lists, (jpegs, pngs)):
        path.write_text("\n".join(map(str, files)))
    sides = {"pillow-simd": None, "pillow": plain_pillow(args.plain_version)}
    runs = common.interleaved(args.rounds, {
        name: (lambda path=path: run_child(path, lists, args.repeats))
        for name, path in sides.items()}, show=side_line)
    results = {}
    for name in sides:
        best = common.best_run(runs[name], "jpeg_images_per_second")
        results[name] = {
            "pil": pillow_build(best["version"]), "version": best["version"],
            "module": best["module"],
            "jpeg_images_per_second": best["jpeg_images_per_second"],
            "decode_ms": common.best(runs[name], "decode_ms", lowest=True),
            "resize_ms": common.best(runs[name], "resize_ms", lowest=True),
            "png_prepare_images_per_second": common.best(runs[name],
                                                         "png_prepare_images_per_second"),
            "runs": runs[name]}
    simd, plain = results["pillow-simd"], results["pillow"]
    ratios = {"jpeg_decode_resize": simd["jpeg_images_per_second"]
              / plain["jpeg_images_per_second"],
              "decode": plain["decode_ms"] / simd["decode_ms"],
              "resize": plain["resize_ms"] / simd["resize_ms"],
              "png_prepare": simd["png_prepare_images_per_second"]
              / plain["png_prepare_images_per_second"]}
    print(f"\n{len(jpegs)} JPEGs {SIZE[0]}x{SIZE[1]} q90 -> {OUTPUT[0]}x{OUTPUT[1]}, one thread, "
          f"best of {args.rounds} rounds")
    print(f"{'':<12} {'PIL':<34} {'decode+resize/s':>15} {'decode ms':>9} {'resize ms':>9} "
          f"{'PNG prepare/s':>13}")
    for name, r in results.items():
        print(f"{name:<12} {r['pil'][:34]:<34} {r['jpeg_images_per_second']:>15,.0f} "
              f"{r['decode_ms']:>9.2f} {r['resize_ms']:>9.2f} "
              f"{r['png_prepare_images_per_second']:>13,.0f}")
    print(f"pillow-simd / pillow: decode+resize {ratios['jpeg_decode_resize']:.2f}x "
          f"(decode {ratios['decode']:.2f}x, resize {ratios['resize']:.2f}x); "
          f"prepare-dataset on PNGs {ratios['png_prepare']:.2f}x")
    common.write_results(RESULTS, {
        "command": command, "images": len(jpegs),
        "size": f"{SIZE[0]}x{SIZE[1]} q90", "output": f"{OUTPUT[0]}x{OUTPUT[1]}",
        "rounds": args.rounds, "repeats": args.repeats, "ratios": ratios,
        "results": results})
    print(f"wrote {RESULTS}")
    return 0


def markdown(result: dict) -> str:
    if result.get("skipped"):
        return f"Not measured: {result['skipped']}."
    ratios = result["ratios"]
    return common.markdown(
        f"{result['images']} photo-like JPEGs {result['size']}: Image.open + convert(\"RGB\"), "
        f"then resize to {result['output']} (BILINEAR), one thread, best of {result['rounds']} "
        "interleaved rounds; plain pillow from a `pip install --target` folder. PNG: "
        "prepare-dataset's one PIL path (`encode_sample` on the same images as PNGs). No numeric "
        "goal: turbotrain's own pipelines do not use PIL; this is what pillow-simd gives "
        "PIL-based loading.",
        common.md_table(["PIL", "PIL.__version__", "JPEG decode + resize /s", "decode ms",
                         "resize ms", "prepare PNG /s"],
                        [[f"`{name}`", r["version"], common.rate(r["jpeg_images_per_second"]),
                          common.decimal(r["decode_ms"], 2), common.decimal(r["resize_ms"], 2),
                          common.rate(r["png_prepare_images_per_second"])]
                         for name, r in result["results"].items()]),
        f"pillow-simd / pillow: decode + resize **{common.times(ratios['jpeg_decode_resize'])}** "
        f"(decode {common.times(ratios['decode'])}, resize {common.times(ratios['resize'])}); "
        f"prepare-dataset on PNG sources {common.times(ratios['png_prepare'])}.")


if __name__ == "__main__":
    sys.exit(main())
