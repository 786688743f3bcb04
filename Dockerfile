# syntax=docker/dockerfile:1
# turbotrain's GPU image: PyTorch on CUDA 13, DALI (JPEG decode on the GPU), FFCV and pillow-simd.
#
#   docker build -t turbotrain .
#   docker run --gpus all --ipc=host -v /data:/data turbotrain train --data /data/ds --pipeline dali
#
# Two stages on the same base image. "builder" adds compilers and -dev headers and builds three
# wheels: FFCV and pillow-simd (C/C++ extensions, built from source) and turbotrain (with its
# compiled decode kernel, linked against libjpeg-turbo: setup.py). The final
# stage installs those wheels plus the shared libraries they link, so g++, pkg-config and the
# OpenCV/turbojpeg/image -dev headers stay out of it. The builder uses the runtime image, not the
# -devel one: nothing here needs nvcc (FFCV and Pillow are CPU code; torch and DALI bring their
# CUDA code in their wheels), and the wheels get built against the exact Python the final stage runs.
#
# tests/test_docker.py runs hadolint on this file and checks every version pinned here against
# pyproject.toml: change a pin in both places.

# CUDA 13.0 because DALI's wheel is nvidia-dali-cuda130 (built for CUDA 13; pyproject's dali
# extra). torch 2.14.1 is the release `make install` pins, so the image trains with the torch
# used in development (pytorch/pytorch tags are <torch>-cuda<X.Y>-cudnn<N>-<runtime|devel>). The
# image is Ubuntu 24.04 with its system Python 3.12, which is "externally managed" (PEP 668):
# PIP_BREAK_SYSTEM_PACKAGES lets pip install into it. The host needs an NVIDIA driver for
# CUDA 13.0 (R580 or newer) and the NVIDIA Container Toolkit (`docker run --gpus`).
ARG BASE_IMAGE=pytorch/pytorch:2.14.1-cuda13.0-cudnn9-runtime
# FFCV compiles against numpy's headers, so both stages install the same numpy.
ARG NUMPY_VERSION=2.4.6
ARG FFCV_VERSION=1.0.2
ARG NUMBA_VERSION=0.68.1
ARG DALI_VERSION=2.4.0

FROM ${BASE_IMAGE} AS builder
ARG NUMPY_VERSION
ARG FFCV_VERSION
ENV PIP_BREAK_SYSTEM_PACKAGES=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1

# Both extensions need Python.h. FFCV: pkg-config finds OpenCV and libturbojpeg. pillow-simd:
# libjpeg and zlib are required, TIFF and WebP because prepare-dataset reads those with Pillow.
# Apt versions are not pinned: the base image tag fixes the Ubuntu release, and within it the
# archive keeps only the current (security-updated) version, so a pinned one stops resolving.
# hadolint ignore=DL3008
RUN apt-get update \
 && DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends \
        build-essential pkg-config python3-dev \
        libopencv-dev libturbojpeg0-dev \
        libjpeg-dev zlib1g-dev libtiff-dev libwebp-dev \
 && rm -rf /var/lib/apt/lists/*

# FFCV's setup.py imports numpy and calls pkg-config, so (as in the Makefile) it is built without
# build isolation, against the numpy installed here.
RUN pip install --no-cache-dir "numpy==${NUMPY_VERSION}" "setuptools==84.2.1" "wheel==0.48.0" \
 && pip wheel --no-cache-dir --no-deps --no-build-isolation --wheel-dir /wheels "ffcv==${FFCV_VERSION}"

# pillow-simd: Pillow with SSE4/AVX2 resampling and colour conversion, built by the script
# `make install` uses (its docstring has the why and the numbers). It renames the sdist to
# "pillow" so that pip keeps it (pillow-simd and pillow overwrite each other's PIL/, and
# everything here requires "pillow"), compiles with CC="cc -mavx2" when the build machine has
# AVX2, and leaves the wheel in --cache. It falls back to plain pillow rather than fail, so the
# `ls` makes a missing AVX2 wheel fail the build here. The image then needs an AVX2 CPU: every
# x86-64 server CPU since 2013 (Haswell, Zen).
COPY scripts/build_pillow_simd.py /tmp/
RUN python3 /tmp/build_pillow_simd.py --cache /wheels \
 && ls /wheels/pillow-*+avx2-*.whl

# turbotrain: only what its wheel is built from (.dockerignore keeps the context small too).
# setup.py builds the decode kernel (turbotrain/pipeline/csrc) against libjpeg-dev's headers;
# it is an optional extension, so the check makes a wheel without it fail the build here.
WORKDIR /src
COPY pyproject.toml setup.py README.md ./
COPY turbotrain/ turbotrain/
RUN pip wheel --no-cache-dir --no-deps --no-build-isolation --wheel-dir /wheels . \
 && python3 -c "import glob, sys, zipfile; \
wheel = zipfile.ZipFile(glob.glob('/wheels/turbotrain-*.whl')[0]); \
sys.exit(not any(n.startswith('turbotrain/pipeline/_native') for n in wheel.namelist()))"


FROM ${BASE_IMAGE}
ARG NUMPY_VERSION
ARG NUMBA_VERSION
ARG DALI_VERSION
# The container's user; build with --build-arg USER_UID="$(id -u)" to write to your own files.
ARG USER_UID=1000
ENV PIP_BREAK_SYSTEM_PACKAGES=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    PYTHONUNBUFFERED=1 \
    NVIDIA_DRIVER_CAPABILITIES=compute,utility,video
# (video: the driver's video-engine libraries, which nvJPEG's hardware JPEG decoder on A100/H100
# uses when DALI picks it; the base image exposes only compute,utility.)

# Only shared libraries (names as in Ubuntu 24.04, the base image's release):
#   libopencv-core406t64 libopencv-imgproc406t64 libturbojpeg: what FFCV's extension links
#   libjpeg-turbo8 libtiff6 libwebp7 libwebpmux3 libwebpdemux2: Pillow's JPEG, TIFF and WebP codecs
#     (libjpeg-turbo8 is also what turbotrain's decode kernel links)
#   libfreetype6 libxcb1: the other libraries Pillow's build finds and links (fonts, screen grab)
#   libgl1 libglib2.0-0t64: opencv-python's cv2 loads libGL and GLib at import
#   gcc libc6-dev python3-dev: torch.compile (on by default on CUDA) has Triton compile a small C
#     launcher against Python.h at run time; C only, no g++.
# (Apt versions unpinned for the reason given in the builder stage.)
# hadolint ignore=DL3008
RUN apt-get update \
 && DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends \
        libopencv-core406t64 libopencv-imgproc406t64 libturbojpeg \
        libjpeg-turbo8 libtiff6 libwebp7 libwebpmux3 libwebpdemux2 libfreetype6 libxcb1 \
        libgl1 libglib2.0-0t64 \
        gcc libc6-dev python3-dev \
 && rm -rf /var/lib/apt/lists/*

# The three wheels by path, so pip cannot take FFCV's sdist or stock Pillow from PyPI instead;
# DALI, numba and the rest of turbotrain's dependencies from PyPI. torch and torchvision come with
# the base image and already satisfy pyproject's ranges, so pip leaves them alone. The check
# fails the build if Pillow is not the AVX2 pillow-simd or lacks a codec, if any compiled
# module of Pillow or FFCV cannot load a library (a package missing from the list above), or if
# turbotrain's decode kernel does not load.
RUN --mount=type=bind,from=builder,source=/wheels,target=/wheels \
    pip install --no-cache-dir \
        "numpy==${NUMPY_VERSION}" "numba==${NUMBA_VERSION}" "nvidia-dali-cuda130==${DALI_VERSION}" \
        /wheels/ffcv-*.whl /wheels/pillow-*.whl "$(echo /wheels/turbotrain-*.whl)[dali,ffcv,export,timm,tensorboard,remote,hf,lightning,ray]" \
 && python -c "import ctypes, pathlib, PIL, cv2, ffcv, nvidia.dali, turbotrain.cli; \
from PIL import features; import lightning, obstore, onnxruntime, pyarrow, ray, safetensors, tensorboard, timm; \
assert PIL.__version__.endswith('+avx2'), PIL.__version__; \
missing = [f for f in ('jpg', 'zlib', 'libtiff', 'webp') if not features.check(f)]; \
assert not missing, f'Pillow lacks {missing}'; \
from turbotrain.pipeline import kernel; assert kernel.NATIVE, kernel.STATUS; \
[ctypes.CDLL(str(so)) for pkg in (PIL, ffcv) for so in pathlib.Path(pkg.__file__).parent.rglob('*.so')]"

# Ubuntu 24.04 images come with a user "ubuntu" holding uid 1000: make room for ours.
RUN if id -u ubuntu >/dev/null 2>&1; then userdel ubuntu; fi \
 && useradd --create-home --uid "${USER_UID}" --user-group turbotrain \
 && mkdir -p /workspace \
 && chown turbotrain:turbotrain /workspace
# Numeric, so that Kubernetes' runAsNonRoot can verify it is not root.
USER ${USER_UID}
WORKDIR /workspace

ENTRYPOINT ["turbotrain"]
CMD ["--help"]
