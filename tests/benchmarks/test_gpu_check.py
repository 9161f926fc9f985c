"""benchmarks/gpu_check.py off the GPU: the one-line answer without CUDA, one-line refusals of bad
options, and its CPU smoke mode, which runs the whole harness (cache, runs, packed processes,
bit-identity, report) on a tiny PACS-shaped folder with Ray and Optuna unimportable."""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

REPO = Path(__file__).resolve().parents[2]
SCRIPT = REPO / "benchmarks" / "gpu_check.py"
METHODS = REPO / "benchmarks" / "gpu_methods.py"
DOMAINS = ("art_painting", "cartoon", "photo", "sketch")
CLASSES = ("dog", "elephant", "giraffe", "guitar", "horse", "house", "person")

# Installed in every Python process of the smoke run through PYTHONPATH: Ray and Optuna cannot be
# imported (as on the GPU machine), and each process writes at exit which of them it holds.
BLOCKER = '''
import atexit, os, sys

class _Blocked:
    @staticmethod
    def find_spec(name, path=None, target=None):
        if name.split(".")[0] in ("ray", "optuna"):
            raise ModuleNotFoundError(f"No module named {name!r} (blocked by the test)", name=name)
        return None

sys.meta_path.insert(0, _Blocked)

def _report():
    held = sorted({m.split(".")[0] for m in sys.modules} & {"ray", "optuna"})
    with open(os.environ["GPU_CHECK_TEST_LOG"], "a") as f:
        f.write(f"{os.getpid()} {' '.join(sys.argv[1:3])} held={held}\\n")

atexit.register(_report)
'''


def _module():
    """The script as a module (once; its dataclasses need it in sys.modules)."""
    if "gpu_check_under_test" not in sys.modules:
        spec = importlib.util.spec_from_file_location("gpu_check_under_test", SCRIPT)
        module = sys.modules["gpu_check_under_test"] = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
    return sys.modules["gpu_check_under_test"]


def _env(**extra: str) -> dict[str, str]:
    env = {**os.environ, "CUDA_VISIBLE_DEVICES": "", **extra}
    env["PYTHONPATH"] = os.pathsep.join(p for p in (extra.get("PYTHONPATH"), str(REPO)) if p)
    return env


@pytest.fixture(scope="module")
def tiny_pacs(tmp_path_factory) -> Path:
    """PACS's layout: 4 domains x 7 classes of 6 random 40 px JPEGs."""
    from PIL import Image

    root, per_class = tmp_path_factory.mktemp("data"), 6
    rng = np.random.default_rng(0)
    for d in DOMAINS:
        for c in CLASSES:
            (root / "PACS" / d / c).mkdir(parents=True)
            for i in range(per_class):
                pixels = (rng.random((40, 40, 3)) * 255).astype("uint8")
                Image.fromarray(pixels).save(root / "PACS" / d / c / f"{i}.jpg")
    return root


def test_without_a_gpu_it_says_so_in_one_line_and_exits_0():
    out = subprocess.run([sys.executable, str(SCRIPT)], cwd=REPO, env=_env(), capture_output=True, text=True,
                         timeout=60)
    assert out.returncode == 0, out.stderr
    assert out.stdout.splitlines() == [_module().NO_GPU]
    assert out.stdout == "gpu_check: no CUDA GPU here (torch.cuda.is_available() is False); nothing to check\n"


@pytest.mark.parametrize("argv, says", [
    (["--precisions", "fp32,fp8"], "--precisions fp8: allowed: a comma list of fp32, bf16, fp16"),
    (["--budget-s", "-5"], "--budget-s -5.0: allowed: a number >= 1"),
    (["--budget-s", "nan"], "--budget-s nan: allowed"),
    (["--pack", "1"], "--pack 1: allowed: a number >= 0, not 1"),
    (["--local-steps", "many"], "argument --local-steps: invalid int value: 'many'"),
    (["--no-such-option"], "unrecognized arguments: --no-such-option"),
    (["--models", "resnet1000"], "--models: field 'model': 'resnet1000' is unknown"),
    (["--models", "cnn"], "--models: 'cnn' is not a torchvision model"),
    (["--smoke-cpu", "--out", "/no/such/folder/r.md"], "--out /no/such/folder/r.md: its folder does not exist"),
])
def test_bad_options_are_one_line_and_exit_2(argv, says, tiny_pacs, capsys):
    module = _module()
    with pytest.raises(SystemExit) as exc:
        module.check_inputs(module.parse_args(argv + ["--data-root", str(tiny_pacs)]))
    assert exc.value.code == 2
    captured = capsys.readouterr()
    assert captured.out == ""
    assert len(captured.err.splitlines()) == 1 and captured.err.startswith("gpu_check: error: ")
    assert says in captured.err


def test_a_missing_data_root_is_one_line(tmp_path):
    out = subprocess.run([sys.executable, str(SCRIPT), "--smoke-cpu", "--data-root", str(tmp_path / "none")],
                         cwd=REPO, env=_env(), capture_output=True, text=True, timeout=120)
    assert out.returncode == 2
    assert out.stdout == "" and len(out.stderr.splitlines()) == 1
    assert out.stderr.startswith(f"gpu_check: error: --data-root {tmp_path / 'none'}: ")


# ------------------------------------------------------------------ benchmarks/gpu_methods.py
def test_gpu_methods_without_a_gpu_says_so_and_on_the_cpu_runs_presets_without_ray(tiny_pacs, tmp_path):
    out = subprocess.run([sys.executable, str(METHODS)], cwd=REPO, env=_env(), capture_output=True, text=True,
                         timeout=60)
    assert (out.returncode, out.stdout) == (0, "gpu_methods: no CUDA GPU here (torch.cuda.is_available() is False); "
                                               "nothing to check\n"), out.stderr
    bad = subprocess.run([sys.executable, str(METHODS), "--presets", "fedavg,nope"], cwd=REPO, env=_env(),
                         capture_output=True, text=True, timeout=60)
    assert bad.returncode == 2 and bad.stdout.startswith("gpu_methods: --presets nope: not a preset; allowed: ")
    report = tmp_path / "methods.md"
    run = subprocess.run([sys.executable, str(METHODS), "--cpu", "--data-root", str(tiny_pacs),
                          "--image-size", "32", "--model", "cnn", "--rounds", "1", "--local-steps", "1",
                          "--presets", "feddg,afl", "--out", str(report)], cwd=REPO, env=_env(),
                         capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stdout[-2000:] + run.stderr[-2000:]
    rows = [line for line in report.read_text().splitlines() if line.startswith("| feddg") or line.startswith("| afl")]
    assert len(rows) == 2 and all("| completed | cpu |" in r for r in rows), rows
    assert report.read_text().rstrip().endswith("forbidden modules loaded: none")
