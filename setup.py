"""The compiled part of turbotrain: the batch decode kernel (turbotrain/pipeline/csrc/).

Everything else is in pyproject.toml. The extension links the system libjpeg-turbo (Debian and
Ubuntu: `apt-get install libjpeg-dev`; `make install` and the Dockerfile install it). It is
optional: when it cannot build, pip still installs turbotrain, and `turbotrain info` and the
pipelines' start-up line say that the Python decode path runs instead.
"""
from setuptools import Extension, setup

NATIVE = "turbotrain/pipeline/csrc/"

setup(ext_modules=[Extension(
    "turbotrain.pipeline._native",
    sources=[NATIVE + name for name in ("module.c", "pool.c", "sample.c", "jpeg_region.c",
                                         "resample.c", "map_guard.c")],
    depends=[NATIVE + name for name in ("pool.h", "sample.h", "jpeg_region.h", "resample.h",
                                        "map_guard.h")],
    libraries=["jpeg"],
    # -O3: the resampler's row loops are written to be vectorised (resample.c).
    extra_compile_args=["-O3", "-std=gnu11", "-pthread", "-Wall", "-Wextra", "-Wno-unused-parameter",
                        "-Wno-missing-field-initializers"],
    extra_link_args=["-pthread"],
    optional=True,
)])
