# turbotrain developer entry points. The README quick start is `make demo` then `make test`.
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
PIP := $(PY) -m pip
STAMP := $(VENV)/.installed
NATIVE_STAMP := $(VENV)/.native
NATIVE_SOURCES := setup.py $(wildcard turbotrain/pipeline/csrc/*.c turbotrain/pipeline/csrc/*.h)
# apt packages: FFCV's build needs pkg-config, OpenCV and libturbojpeg headers; opencv-python
# needs libGL/glib at import; Fashion-MNIST from Debian is the real dataset our tests train on;
# pillow-simd's build (scripts/build_pillow_simd.py) and our decode kernel (setup.py) need the
# jpeg headers; pillow-simd also zlib, WebP and TIFF.
APT_PACKAGES := pkg-config libopencv-dev libturbojpeg0-dev libgl1 libglib2.0-0 dataset-fashion-mnist \
	libjpeg-dev zlib1g-dev libwebp-dev libtiff-dev

.PHONY: install demo test test-fast bench bench-deps gpu-check bf16-probe apt-deps clean

# When make read this file: `install took N s` counts from here (make parses the Makefile once,
# just before the first recipe runs). The install steps print what they do and roughly how long
# it takes (issue 32: a newcomer's first `make demo` is silent for minutes otherwise).
INSTALL_T0 := $(shell date +%s)
INSTALL_TOOK = @echo "install took $$(( $$(date +%s) - $(INSTALL_T0) )) s"

install: $(STAMP) $(NATIVE_STAMP)

$(STAMP): pyproject.toml scripts/build_pillow_simd.py
	@echo "install 1/6: apt packages for the FFCV, pillow-simd and kernel builds (0 s when present, ~1-2 min otherwise)"
	@$(MAKE) --no-print-directory apt-deps
	@echo "install 2/6: virtual environment in $(VENV) (~10 s)"
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PIP) install -q --upgrade setuptools wheel
	# torch first, pinned to the release this machine caps at (its wheels are on local disk).
	@echo "install 3/6: torch + torchvision (~1-3 min from local wheels, longer downloading ~1 GB)"
	$(PIP) install -q "torch==2.14.1" "torchvision==0.29.1" || $(PIP) install -q "torch>=2.4" torchvision
	# FFCV's setup.py imports numpy and pkg-config at build time: build it against the venv's numpy.
	@echo "install 4/6: FFCV, compiled from source (~1-2 min)"
	$(PIP) install -q numpy
	$(PIP) install -q --no-build-isolation "ffcv==1.0.2" || echo "warning: FFCV did not build; --pipeline ffcv will be unavailable"
	@echo "install 5/6: turbotrain and its extras: DALI, timm, ONNX, TensorBoard, Ray, ... (~1-3 min)"
	$(PIP) install -q -e ".[dali,ffcv,export,timm,tensorboard,remote,hf,lightning,ray,dev]"
	# Last, after every line that can pull pillow in: pillow-simd built under the name pillow, so
	# later pip installs keep it (~1.8x faster PIL decode + resize); a one-line note and pillow
	# when it cannot build. A rerun reuses the wheel cached in $(VENV)/pillow-simd/.
	@echo "install 6/6: pillow-simd, compiled from source (~1-2 min; a rerun reuses the cached wheel)"
	$(PY) scripts/build_pillow_simd.py
	touch $(STAMP)
	$(INSTALL_TOOK)

# The compiled decode kernel (turbotrain/pipeline/csrc): pip install -e built it in place; this
# rebuilds it when its sources change. pip treats it as optional (a user without libjpeg's
# headers still gets turbotrain, on the Python path), so here a missing kernel is an error.
$(NATIVE_STAMP): $(STAMP) $(NATIVE_SOURCES)
	@echo "install: the decode kernel (turbotrain/pipeline/csrc, ~10-30 s)"
	$(PY) setup.py -q build_ext --inplace
	$(PY) -c "from turbotrain.pipeline import kernel; assert kernel.NATIVE, kernel.STATUS; print(kernel.STATUS)"
	touch $(NATIVE_STAMP)
	$(INSTALL_TOOK)

# Installs FFCV's build deps when we are root on a Debian/Ubuntu machine; otherwise says what to do.
apt-deps:
	@if [ "$$(id -u)" = "0" ] && command -v apt-get >/dev/null; then \
		missing=$$(for p in $(APT_PACKAGES); do dpkg -s $$p >/dev/null 2>&1 || echo $$p; done); \
		if [ -n "$$missing" ]; then \
			echo "apt-get install $$missing"; \
			apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends $$missing >/dev/null; \
		fi; \
	else \
		echo "not root or no apt-get: make sure these are installed: $(APT_PACKAGES)"; \
	fi

demo: install
	$(VENV)/bin/turbotrain demo

# The suite, then the pipeline contract and error tests again on the Python decode path (what
# runs where the kernel could not be built), forced by TURBOTRAIN_NATIVE=0; not ffcv's (FFCV
# decodes with its own code either way).
FALLBACK_TESTS := tests/pipeline/test_contract.py tests/pipeline/test_errors_and_choice.py

# Two pytest workers (pytest-xdist): most tests run one torch thread or wait on a child process,
# so one serial pytest left a core of the 2-core CI box idle (the suite took 43 min serial).
# loadgroup: a module marked xdist_group runs on one worker, so its module-scoped fixture (a
# training run, ~50 s for DDP's) runs once, not once per worker; no reorder keeps the slow tests
# first (tests/conftest.py).
TEST_JOBS ?= 2
# What `make install` installed, so a test that needs one of them fails when it is missing
# instead of skipping (tests/expect.py). Without DALI, say: make test TEST_EXPECT=ray,timm,...
TEST_EXPECT ?= ray,timm,dali,ffcv,fashion_mnist,native
test test-fast: export TURBOTRAIN_EXPECT = $(TEST_EXPECT)
test: install
	$(PY) -m pytest -q -n $(TEST_JOBS) --dist loadgroup --no-loadscope-reorder --durations=30
	TURBOTRAIN_NATIVE=0 $(PY) -m pytest -q $(FALLBACK_TESTS) -n $(TEST_JOBS) -k "not ffcv"

# A contributor's inner loop: the tests that neither train nor start a child process, chosen
# from the fixtures each test uses (tests/fast_lane.py); ~700 of the suite's ~1,400 tests.
test-fast:
	test -x $(PY) || $(MAKE) install
	$(PY) -m pytest -q --fast -n $(TEST_JOBS) --dist loadgroup --durations=10

bench: install bench-deps
	$(PY) bench/run_all.py

# What only the benchmarks use, never a dependency of turbotrain: the contenders' own packages
# (bench/requirements.txt: SPDL) and SPDL's FFmpeg libraries (Debian 12's FFmpeg 5.1), from apt
# when we are root on Debian/Ubuntu.
BENCH_APT_PACKAGES := libavdevice59 libavfilter8 libavformat59 libavcodec59 libavutil57 libswscale6
bench-deps: $(STAMP)
	@$(MAKE) --no-print-directory apt-deps APT_PACKAGES="$(BENCH_APT_PACKAGES)"
	$(PIP) install -q -r bench/requirements.txt

# On a GPU machine: `pytest -m cuda`, the speed table, one verdict line per goal, <= 8 minutes.
# Installs nothing (no `install` prerequisite): the venv's python if there is one, else
# $(PYTHON); `make gpu-check WHEELHOUSE=DIR` pip-installs missing engines from wheels in DIR.
GPU_PY := $(if $(wildcard $(PY)),$(PY),$(PYTHON))
gpu-check:
	$(GPU_PY) bench/gpu_check.py --all $(if $(WHEELHOUSE),--wheelhouse $(WHEELHOUSE))

# On a CPU with native bf16 (the GPU machine's Xeon): how often the bf16 step goes non-finite,
# under which oneDNN ISA, and in which module (issue 22; bench/bf16_probe.py, ~2 minutes there).
bf16-probe:
	$(GPU_PY) bench/bf16_probe.py

clean:
	rm -rf $(VENV) build *.egg-info .pytest_cache turbotrain/pipeline/_native*.so
