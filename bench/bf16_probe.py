"""Where the rare non-finite bf16 step on CPU comes from (issue 22): a probe for a CPU with
native bf16 (avx512_bf16 or AMX: the GPU machine's Xeon), where
`test_pretrained_timm_weights_from_the_hf_cache` once failed 1 run in 9.

    python bench/bf16_probe.py [--runs 12] [--jobs 8]     # make bf16-probe

It runs that test's one bf16 step many times, each in a fresh process with one torch thread as
the test does, and counts the non-finite ones, in two forms:

* `cli`: the test's own command (`train --model timm:resnet18 --pretrained --precision bf16
  --max-steps 1 ...` on its tiny 16 px dataset, the weights from a local Hugging Face cache);
* `step`: the same model, weights and batch stepped directly, with a hook on every module
  that names the first one whose output is not finite, and the parameters whose gradient
  is not.

Each form runs under oneDNN's full ISA and again with `ONEDNN_MAX_CPU_ISA=AVX512_CORE` (no
bf16 instructions), and the step also with oneDNN off. The rates say which it is: only the
full ISA fails -> a oneDNN bf16 kernel (the module names it); `step` never fails but `cli` does
-> our train path; both fail everywhere -> the numbers themselves. On a CPU without native bf16
it says so and runs anyway (every run finite is the expected answer there).
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

VARIANTS = {"full ISA": {}, "AVX512_CORE": {"ONEDNN_MAX_CPU_ISA": "AVX512_CORE"},
            "oneDNN off": {"TURBOTRAIN_PROBE_NO_MKLDNN": "1"}}
STEP = """
import json, os, sys, torch, timm
from safetensors.torch import load_file
torch.set_num_threads(1)
if os.environ.get("TURBOTRAIN_PROBE_NO_MKLDNN"):
    torch.backends.mkldnn.enabled = False
net = timm.create_model("resnet18", num_classes=1000)
net.load_state_dict(load_file(sys.argv[1]))
net.reset_classifier(4)
torch.manual_seed(int(sys.argv[2]))
x = ((torch.randint(0, 256, (16, 3, 16, 16)).float() - 70.0) / 60.0).contiguous(
    memory_format=torch.channels_last)
y = torch.randint(0, 4, (16,))
net = net.to(memory_format=torch.channels_last).train()
first = []
def check(module, _, out):
    if not first and isinstance(out, torch.Tensor) and not torch.isfinite(out).all():
        first.append(names[module])
names = {m: n or "input" for n, m in net.named_modules()}
for m in names:
    m.register_forward_hook(check)
with torch.autocast("cpu", dtype=torch.bfloat16):
    loss = torch.nn.functional.cross_entropy(net(x), y)
loss.backward()
bad = [n for n, p in net.named_parameters() if p.grad is not None and
       not torch.isfinite(p.grad).all()]
print(json.dumps({"finite": bool(torch.isfinite(loss)) and not bad, "first_forward": first,
                  "bad_grads": bad[:5]}))
"""


def native_bf16() -> str:
    flags = Path("/proc/cpuinfo").read_text().split()
    return ", ".join(f for f in ("avx512_bf16", "amx_bf16") if f in flags) or "none"


def write_inputs(folder: Path) -> tuple[Path, Path, Path]:
    """The test's tiny dataset, and resnet18 weights (seed 2) in a Hugging Face cache."""
    import timm
    import torch
    from safetensors.torch import save_file

    from tests.train.tiny_data import write_tiny_dataset
    data = write_tiny_dataset(folder / "ds")
    hub_id = timm.models.get_pretrained_cfg("resnet18").hf_hub_id
    snapshot = folder / "hf" / f"models--{hub_id.replace('/', '--')}" / "snapshots" / ("a" * 40)
    snapshot.mkdir(parents=True)
    (snapshot.parents[1] / "refs").mkdir()
    (snapshot.parents[1] / "refs" / "main").write_text("a" * 40)
    torch.manual_seed(2)
    state = {k: v.contiguous() for k, v in timm.create_model("resnet18").state_dict().items()}
    save_file(state, str(snapshot / "model.safetensors"))
    return data, folder / "hf", snapshot / "model.safetensors"


def cli_run(data: Path, hf: Path, out: Path, env: dict) -> dict:
    command = [sys.executable, "-m", "tests.train.run_with_test_pipelines", "--data", str(data),
               "--out", str(out), "--model", "timm:resnet18", "--pretrained", "--epochs", "1",
               "--max-steps", "1", "--batch-size", "16", "--precision", "bf16", "--lr",
               "1e-12", "--threads", "1", "--workers", "0", "--pipeline", "test-memory",
               "--log-every", "1", "--device", "cpu"]
    ran = subprocess.run(command, cwd=REPO, capture_output=True, text=True, timeout=600,
                         env={**os.environ, "HF_HUB_CACHE": str(hf), "HF_HUB_OFFLINE": "1",
                              **env})
    return {"finite": ran.returncode == 0, "detail": ran.stderr.strip().splitlines()[-1:]}


def step_run(weights: Path, seed: int, env: dict) -> dict:
    ran = subprocess.run([sys.executable, "-c", STEP, str(weights), str(seed)], cwd=REPO,
                         capture_output=True, text=True, timeout=600, env={**os.environ, **env})
    if ran.returncode != 0:
        return {"finite": False, "detail": ran.stderr.strip().splitlines()[-1:]}
    return json.loads(ran.stdout.strip().splitlines()[-1])


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0], allow_abbrev=False)
    parser.add_argument("--runs", type=int, default=12, help="runs per form and variant (12)")
    parser.add_argument("--jobs", type=int, default=max(1, (os.cpu_count() or 2) // 2),
                        help="runs at once, one torch thread each (half the cores)")
    args = parser.parse_args(argv)
    print(f"native bf16 on this CPU: {native_bf16()}; {args.runs} runs per line, "
          f"{args.jobs} at once", flush=True)
    failures = 0
    with tempfile.TemporaryDirectory(prefix="bf16-probe-") as tmp, \
            ThreadPoolExecutor(args.jobs) as pool:
        data, hf, weights = write_inputs(Path(tmp))
        for form in ("cli", "step"):
            for variant, env in VARIANTS.items():
                if form == "cli" and variant == "oneDNN off":
                    continue  # the flag is the step's own
                runs = [pool.submit(cli_run, data, hf, Path(tmp) / f"{form}-{variant}-{i}",
                                    env) if form == "cli" else
                        pool.submit(step_run, weights, 0, env) for i in range(args.runs)]
                results = [r.result() for r in runs]
                bad = [r for r in results if not r["finite"]]
                failures += len(bad)
                print(f"{form:4} {variant:11}: {len(bad)}/{len(results)} non-finite"
                      + (f"; first: {json.dumps({k: v for k, v in bad[0].items() if k != 'finite'})}"
                         if bad else ""), flush=True)
    print("every run finite" if not failures else f"{failures} non-finite run(s): see above")
    return 0


if __name__ == "__main__":
    sys.exit(main())
