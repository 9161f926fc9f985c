"""benchmarks/gpu_check.py off the GPU: the one-line answer without CUDA, one-line refusals of bad
options, and its CPU smoke mode, which runs the whole harness (cache, runs, packed processes,
bit-identity, report) on a tiny PACS-shaped folder with Ray and Optuna unimportable.

The slow tier (the tests/slow/ folder: every test here is marked slow by tests/conftest.py);
the quick tests of the same subject are in tests/benchmarks/test_gpu_check.py."""

from __future__ import annotations

import subprocess
import sys

from tests.benchmarks.test_gpu_check import BLOCKER, CLASSES, DOMAINS, REPO, SCRIPT, _env
from tests.benchmarks.test_gpu_check import tiny_pacs  # noqa: F401 - fixtures, used by name


def test_smoke_cpu_runs_the_whole_harness_without_ray_or_optuna(tiny_pacs, tmp_path):
    (tmp_path / "block").mkdir()
    (tmp_path / "block" / "sitecustomize.py").write_text(BLOCKER)
    log, md = tmp_path / "imports.log", tmp_path / "report.md"
    # the smoke's runs, smaller still (one local step of 4 images per client): what is checked is the
    # harness (processes, cache, packing, bit-identity, report), not the training
    out = subprocess.run([sys.executable, str(SCRIPT), "--smoke-cpu", "--local-steps", "1", "--batch-size", "4",
                          "--data-root", str(tiny_pacs), "--out", str(md), "--work-dir", str(tmp_path / "work")],
                         cwd=REPO, capture_output=True, text=True, timeout=600,
                         env=_env(PYTHONPATH=str(tmp_path / "block"), GPU_CHECK_TEST_LOG=str(log)))
    assert out.returncode == 0, out.stdout + out.stderr
    report = md.read_text()
    assert out.stdout.endswith(report)
    assert "CPU smoke run (--smoke-cpu): no GPU numbers" in report
    assert f"{len(DOMAINS) * len(CLASSES) * 6} images" in report and "3 of 3 runs completed" in report
    assert "1 round(s) x 1 local steps of 4 images" in report  # the sizes given, not the smoke's own
    tables = {line.split("|")[1].strip(): [c.strip() for c in line.split("|")[1:-1]]
              for line in report.splitlines() if line.startswith("| ")}
    columns = tables["run"]
    rows = {key: dict(zip(columns, cells)) for key, cells in tables.items() if key.startswith(("resnet18-", "pack"))}
    assert set(rows) == {"resnet18-fp32", "pack2", "resnet18-fp32-again"}
    for row in rows.values():
        assert row["status"] == "completed", row
        assert set(row["alloc GiB"] + row["reserved GiB"]) <= set("-/ "), row  # no GPU memory claimed
        assert row["paths"] == "-" and row["cudnn.benchmark"] == "-", row  # no CUDA path claimed
        assert float(row["images/s"].split()[0]) > 0 and "host" in row["input stall"], row
    assert rows["pack2"]["procs"] == "2" and len(rows["pack2"]["input stall"].split(" / ")) == 2
    identity = dict(zip(tables["check"], tables["resnet18 fp32, cudnn_benchmark=True"]))
    assert identity["stored rows"] == "same" and identity["final weights"] == "same", identity
    # the blocker ran in the script and in its 4 children (one run, 2 packed, one repeat); none held Ray or Optuna
    lines = log.read_text().splitlines()
    assert len(lines) == 5, lines
    assert sum("--child" in ln for ln in lines) == 4
    assert all(ln.endswith("held=[]") for ln in lines), lines
