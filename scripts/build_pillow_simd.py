"""Builds Pillow-SIMD from source and installs it, under the distribution name `pillow`, into the
environment of the Python that runs this script; or says in one line why not and keeps pillow.

    .venv/bin/python scripts/build_pillow_simd.py                  # what `make install` runs
    python3 scripts/build_pillow_simd.py --cache /tmp/pillow-simd  # e.g. from a Dockerfile

Why: Pillow-SIMD is Pillow with SSE4/AVX2 resampling and colour conversion. One thread of the
2-core build machine (AMD EPYC, AVX2 build), decode + resize to 224x224 of 512x384 q90 JPEGs:
1,316/s against 746/s with pillow 13.0.0, 1.77x (1.95x in another run; bench/bench_pillow.py).
The resize is ~8x faster, the decode (libjpeg-turbo in both) the same. That is what PIL-based
loading (torchvision transforms) pays. turbotrain's own pipelines decode with simplejpeg and
resize with cv2, and prepare-dataset uses PIL only to decode non-JPEG sources: no gain there
(PNG sources: 0.99x).

Why the rename: Pillow-SIMD installs the same `PIL` package as pillow but under its own name, so
anything that requires `pillow` (turbotrain, torchvision, matplotlib) makes pip install pillow
over it. Built with `name = "pillow"` in its pyproject.toml, it *is* the pillow pip sees, at
Pillow-SIMD's version plus a local label naming the instruction set (12.1.1.post0+avx2): that
satisfies `pillow>=10`, so later `pip install`s keep it, and `turbotrain info` reads the label.

Steps: check for x86-64 Linux with SSE4.2, a C compiler, Python.h and the jpeg, zlib, WebP and
TIFF headers (WebP and TIFF because prepare-dataset reads those formats through PIL, and the
pillow wheel bundles both); `pip download` the sdist; rename; `pip wheel` it with CC="cc -mavx2"
where the CPU has AVX2; `pip install --force-reinstall --no-deps`; check that it imports, has
those codecs and decodes + resizes a JPEG, else put the previous pillow back. The wheel is kept
in --cache (default: <environment>/pillow-simd/) with the build log, so a reinstall takes
seconds; an installed build that still works is left alone. Exits 0 whatever happens, so
`make install` goes on with plain pillow after a one-line note.
"""
from __future__ import annotations

import argparse
import os
import platform
import re
import shlex
import shutil
import subprocess
import sys
import sysconfig
import tarfile
import tempfile
from pathlib import Path

# 12.1.1.post0 is the newest release (2026-09); its pyproject.toml and src/PIL/_version.py are
# what rename() edits. Pillow-SIMD versions are pillow's plus .postN and lag pillow's releases,
# so turbotrain's floor (pillow>=10 in pyproject.toml) must stay at or below this one.
VERSION = "12.1.1.post0"
# header -> (what Pillow's setup.py calls it, the Debian package that has it). jpeg and zlib
# Pillow needs to build at all; webp and tiff we ask it to require (-C x=enable) so that a
# build without them fails here instead of refusing WebP/TIFF sources in prepare-dataset.
HEADERS = {"jpeglib.h": ("jpeg", "libjpeg-dev"), "zlib.h": ("zlib", "zlib1g-dev"),
           "webp/decode.h": ("webp", "libwebp-dev"), "tiffio.h": ("tiff", "libtiff-dev")}
# Run in the target interpreter after installing: it must import, have the codecs above and
# decode + resize a JPEG (a wheel linked to a system libjpeg that has since gone fails here).
CHECK = """
import io, sys, PIL
from PIL import Image, features
missing = [f for f in ("jpg", "zlib", "webp", "libtiff") if not features.check(f)]
if missing:
    sys.exit("built without " + ", ".join(missing))
buffer = io.BytesIO()
Image.new("RGB", (64, 48), (200, 30, 90)).save(buffer, "JPEG")
Image.open(io.BytesIO(buffer.getvalue())).convert("RGB").resize((16, 16), Image.BILINEAR)
print(PIL.__version__)
"""
NOTE = ("note: pillow-simd not built ({reason}); using pillow {plain}, ~1.8x slower at PIL "
        "decode + resize (PIL-based loading such as torchvision transforms; turbotrain's own "
        "pipelines do not use PIL)")


class NotBuilt(Exception):
    """The reason, in a few words, that pillow-simd is not installed."""


def cpu_flags() -> set[str]:
    try:
        text = Path("/proc/cpuinfo").read_text()
    except OSError:
        return set()
    return next((set(line.split(":", 1)[1].split()) for line in text.splitlines()
                 if line.startswith("flags")), set())


def instruction_set() -> str:
    """"avx2" or "sse4": what the build targets (and the local version label says)."""
    if sys.platform != "linux" or platform.machine() not in ("x86_64", "AMD64"):
        raise NotBuilt(f"its SIMD code is x86-64 only; this is {sys.platform} "
                       f"{platform.machine()}")
    flags = cpu_flags()
    if "sse4_2" not in flags:
        raise NotBuilt("the CPU lacks SSE4.2, which pillow-simd needs at least")
    return "avx2" if "avx2" in flags else "sse4"


def compiler() -> list[str]:
    cc = shlex.split(os.environ.get("CC", "cc"))
    if not cc or shutil.which(cc[0]) is None:
        raise NotBuilt(f"no C compiler: {' '.join(cc) or 'CC is empty'} not found; "
                       "apt-get install gcc")
    return cc


def check_headers(cc: list[str]) -> None:
    include = Path(sysconfig.get_paths()["include"])
    if not (include / "Python.h").is_file():
        raise NotBuilt(f"no Python.h in {include}: apt-get install python3-dev")
    for header, (_, package) in HEADERS.items():
        source = f"#include <stdio.h>\n#include <{header}>\n"  # jpeglib.h needs stdio.h first
        done = subprocess.run([*cc, "-E", "-x", "c", "-", "-o", os.devnull], input=source,
                              capture_output=True, text=True)
        if done.returncode != 0:
            raise NotBuilt(f"no <{header}>: apt-get install {package}")


def installed_pillow() -> str | None:
    """The installed `pillow` distribution's version, asked in a fresh interpreter (this one's
    importlib.metadata may have cached what pip has since replaced)."""
    code = ("import importlib.metadata as m\ntry: print(m.version('pillow'))\n"
            "except m.PackageNotFoundError: pass")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    return done.stdout.strip() or None


def pip(*args: str, log: Path | None = None, **kwargs) -> subprocess.CompletedProcess:
    command = [sys.executable, "-m", "pip", *args]
    done = subprocess.run(command, capture_output=True, text=True, **kwargs)
    if log is not None:
        with log.open("a") as f:
            f.write(f"$ {' '.join(command)}\n{done.stdout}{done.stderr}\n")
    return done


def works() -> tuple[bool, str]:
    """Whether the installed PIL passes CHECK, run in a fresh interpreter; and what it said."""
    done = subprocess.run([sys.executable, "-c", CHECK], capture_output=True, text=True)
    said = (done.stdout + done.stderr).strip().splitlines()
    return done.returncode == 0, said[-1] if said else f"exit {done.returncode}"


def failure_reason(output: str, what: str) -> str:
    """A few words from pip's output: a missing library, else the last error line."""
    missing = re.search(r"could not be found for (\w+)", output)
    if missing:
        package = {name: pkg for name, pkg in HEADERS.values()}.get(missing[1], "its -dev package")
        return f"{what}: no {missing[1]} headers or library; apt-get install {package}"
    errors = [line.strip() for line in output.splitlines() if "error" in line.lower()]
    last = (errors or [line.strip() for line in output.splitlines() if line.strip()] or ["?"])[-1]
    return f"{what}: {last[:120]}"


def rename(source: Path, label: str) -> None:
    """Distribution name pillow-simd -> pillow, version VERSION -> VERSION+label."""
    for path, old, new in (
            (source / "pyproject.toml", 'name = "pillow-simd"', 'name = "pillow"'),
            (source / "src" / "PIL" / "_version.py", f'__version__ = "{VERSION}"',
             f'__version__ = "{VERSION}+{label}"')):
        text = path.read_text() if path.is_file() else ""
        if text.count(old) != 1:
            raise NotBuilt(f"the sdist changed: no single `{old}` in {path.name}")
        path.write_text(text.replace(old, new))


def build(label: str, cc: list[str], cache: Path, log: Path) -> Path:
    """Downloads the sdist, renames it, builds the wheel into `cache`; returns the wheel."""
    with tempfile.TemporaryDirectory(prefix="pillow-simd-") as tmp:
        work = Path(tmp)
        done = pip("download", "--no-deps", "--no-binary", ":all:", f"pillow-simd=={VERSION}",
                   "-d", str(work), log=log)
        sdists = list(work.glob("pillow_simd-*.tar.gz")) + list(work.glob("pillow-simd-*.tar.gz"))
        if done.returncode != 0 or not sdists:
            raise NotBuilt(failure_reason(done.stdout + done.stderr,
                                          f"pip download pillow-simd=={VERSION} failed"))
        with tarfile.open(sdists[0]) as tar:
            # The "data" filter refuses absolute paths and links out of the folder (3.11.4+).
            tar.extractall(work, **({"filter": "data"} if hasattr(tarfile, "data_filter")
                                    else {}))
        source = next(p for p in work.iterdir() if p.is_dir())
        rename(source, label)
        # -mavx2 on the compiler itself, as Pillow-SIMD's docs say: setup.py adds only -msse4.
        env = {**os.environ, "CC": " ".join([*cc, "-mavx2"] if label == "avx2" else cc)}
        print(f"building pillow-simd {VERSION} ({label.upper()}) with CC=\"{env['CC']}\": "
              "about a minute on 2 cores", flush=True)
        done = pip("wheel", "--no-deps", "-C", "webp=enable", "-C", "tiff=enable",
                   "-w", str(work / "wheel"), str(source), log=log, env=env)
        wheels = list((work / "wheel").glob("pillow-*.whl"))
        if done.returncode != 0 or not wheels:
            raise NotBuilt(failure_reason(done.stdout + done.stderr, "build failed"))
        cache.mkdir(parents=True, exist_ok=True)
        return Path(shutil.copy2(wheels[0], cache / wheels[0].name))


def install(wheel: Path, log: Path) -> tuple[bool, str]:
    """pip-installs the wheel over whatever pillow is there; returns works()."""
    done = pip("install", "--force-reinstall", "--no-deps", str(wheel), log=log)
    if done.returncode != 0:
        raise NotBuilt(failure_reason(done.stdout + done.stderr, "pip install failed"))
    return works()


def put_back(previous: str | None, log: Path) -> None:
    """Reinstalls the plain pillow that was there before (or the newest one)."""
    spec = f"pillow=={previous}" if previous and "+" not in previous else "pillow"
    pip("install", "--force-reinstall", "--no-deps", spec, log=log)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], allow_abbrev=False)
    parser.add_argument("--cache", type=Path, default=Path(sys.prefix) / "pillow-simd",
                        help="where the built wheel and build.log are kept "
                             "(default: <environment>/pillow-simd)")
    args = parser.parse_args(argv)
    previous = installed_pillow()
    log = args.cache / "build.log"
    touched = False
    try:
        label = instruction_set()
        wanted = f"{VERSION}+{label}"
        if previous == wanted and works()[0]:
            print(f"pillow-simd {VERSION} ({label.upper()}) already installed")
            return 0
        cc = compiler()
        check_headers(cc)
        args.cache.mkdir(parents=True, exist_ok=True)
        log.write_text("")
        tag = f"cp{sys.version_info.major}{sys.version_info.minor}"
        cached = sorted(args.cache.glob(f"pillow-{wanted}-{tag}-*.whl"))
        if cached:
            touched = True
            ok, _ = install(cached[0], log)
            if ok:
                print(f"pillow-simd {VERSION} ({label.upper()}) installed from {cached[0]}")
                return 0
            cached[0].unlink()  # rebuilt below: the system libraries it links may have changed
        wheel = build(label, cc, args.cache, log)
        touched = True
        ok, said = install(wheel, log)
        if not ok:
            wheel.unlink()
            raise NotBuilt(f"the built wheel does not work: {said}")
        print(f"pillow-simd {VERSION} ({label.upper()}) built and installed as pillow {said}; "
              f"wheel kept in {args.cache}")
        return 0
    except NotBuilt as e:
        reason = str(e)
    except Exception as e:  # noqa: BLE001 - an optional speed-up: any failure leaves pillow
        reason = f"{type(e).__name__}: {e}"
    if touched and not works()[0]:
        put_back(previous, log)
    print(NOTE.format(reason=reason, plain=installed_pillow() or "(not installed)"))
    return 0


if __name__ == "__main__":
    sys.exit(main())
