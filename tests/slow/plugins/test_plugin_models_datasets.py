"""Your own model and dataset (issue 45, item 4): ``model: MODULE:FUNCTION`` (a factory of input
shape and class count, through the same pre-launch checks as the built-ins) and a plugin's
``DatasetSpec`` of named domains (``fedtune partition``, ``fedtune datasets``, every setting, both
backends, the image cache where it yields image files).

The slow tier (the tests/slow/ folder: every test here is marked slow by tests/conftest.py);
the quick tests of the same subject are in tests/plugins/test_plugin_models_datasets.py."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.plugins.test_plugin_models_datasets import RAY_DRIVER, RAY_PLUGIN
from tests.plugins.test_plugin_models_datasets import _isolated  # noqa: F401 - autouse: its registrations are gone after the module


pytestmark = pytest.mark.usefixtures("one_torch_thread")


@pytest.mark.ray
def test_on_ray_a_plugin_only_the_driver_can_import_reaches_the_workers_and_gives_the_local_rows(tmp_path):
    # A fresh process (its own local Ray, started by fedtune with the plugin's folder on its workers'
    # path), run from a folder that is not the plugin's: Ray's workers can import the module only because
    # fedtune gives them its folder (a cluster's nodes get a shipped copy: tests/slow/cluster/test_cluster_local.py).
    # Every process that builds the dataset or the model writes where it imported the module from.
    src, elsewhere = tmp_path / "src", tmp_path / "elsewhere"
    src.mkdir(), elsewhere.mkdir()
    (src / "ft_md_ray.py").write_text(RAY_PLUGIN)
    (tmp_path / "driver.py").write_text(RAY_DRIVER)
    marker = tmp_path / "imported_from.txt"
    env = {**os.environ, "FT_MD_MARKER": str(marker), "PYTHONPATH": str(Path(__file__).resolve().parents[3])}
    done = subprocess.run([sys.executable, str(tmp_path / "driver.py"), str(src), str(tmp_path / "out")], cwd=elsewhere,
                          env=env, capture_output=True, text=True, timeout=400)
    result = next((line for line in done.stdout.splitlines() if line.startswith("RESULT ")), None)
    assert result is not None, done.stdout[-2000:] + done.stderr[-4000:]
    got = json.loads(result[len("RESULT "):])
    assert got["local"]["status"] == got["ray"]["status"] == "completed"
    assert got["ray"]["plugins"] == ["ft_md_ray"]
    assert len(got["ray"]["rows"]) == 2 and got["ray"]["rows"] == got["local"]["rows"]
    seen = [line.split(" ", 1) for line in marker.read_text().splitlines()]
    assert len({pid for pid, _ in seen}) >= 3  # the driver, and the client actors (two here)
    assert {path for _, path in seen} == {str(src / "ft_md_ray.py")}
