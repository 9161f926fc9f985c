import os
import sys

import pytest

import atexit
import shutil
import tempfile
from pathlib import Path

# Keep Ray quiet and local in tests.
os.environ.setdefault("RAY_DEDUP_LOGS", "0")
# Everything a test session writes to the temporary directory goes into one folder of its own,
# removed when the session ends: what libraries make there (wandb's media folders, the
# doctests' ``mkdtemp``, multiprocessing's ``pymp-*``) and Ray's session folders (logs, sockets:
# hundreds of MB over many runs), in this process and in the Ray workers and CLI subprocesses
# the tests start (they inherit TMPDIR). pytest's own ``tmp_path`` folders stay where they were
# (PYTEST_DEBUG_TEMPROOT), so a failed test's folder is kept (tmp_path_retention_policy).
# pytest-xdist's workers inherit the folder their controller made (one folder, not nested ones:
# Ray's socket paths must stay under 107 bytes); its maker removes it.
if not os.environ.get("FEDTUNE_TEST_TMP"):
    os.environ.setdefault("PYTEST_DEBUG_TEMPROOT", tempfile.gettempdir())
    os.environ["FEDTUNE_TEST_TMP"] = tempfile.mkdtemp(prefix="ftt-")
    atexit.register(shutil.rmtree, os.environ["FEDTUNE_TEST_TMP"], True)
os.environ["TMPDIR"] = tempfile.tempdir = os.environ["FEDTUNE_TEST_TMP"]
# The key that signs a study's Ray Tune state (fedtune.tune.common.state_signatures): one per test
# session, in that folder, never the user's own ~/.config/fedtune/state-key.
os.environ["XDG_CONFIG_HOME"] = os.path.join(os.environ["FEDTUNE_TEST_TMP"], "config")
# Image-folder datasets decode into a cache: one per test session, never the user's own
# (inherited by the Ray workers and CLI subprocesses the tests start).
if not os.environ.get("FEDTUNE_CACHE_DIR"):
    os.environ["FEDTUNE_CACHE_DIR"] = tempfile.mkdtemp(prefix="fedtune-test-cache-")
    atexit.register(shutil.rmtree, os.environ["FEDTUNE_CACHE_DIR"], True)


# The slow tier is a folder: every test under tests/slow/ is marked ``slow`` here, and a module with a
# test marked ``slow`` anywhere else fails its collection, so ``-m "not slow"`` and ``--ignore=tests/slow``
# always select the same tests (the quick tier: tests/<area>/, mirroring fedtune/<area>/).
SLOW_FOLDER = Path(__file__).resolve().parent / "slow"


@pytest.hookimpl(wrapper=True)
def pytest_make_collect_report(collector):
    """Mark the slow folder's tests ``slow``; fail the collection of a module (or class) outside it that
    marks a test ``slow``. In the collection report, so that pytest-xdist's workers report it too."""
    report = yield
    if report.outcome != "passed" or not isinstance(collector, (pytest.Module, pytest.Class)):
        return report
    items = [i for i in report.result if isinstance(i, pytest.Item)]
    if SLOW_FOLDER in Path(collector.path).resolve().parents:
        for item in items:
            item.add_marker(pytest.mark.slow)
    elif misplaced := [i.name for i in items if i.get_closest_marker("slow") is not None]:
        report.outcome, report.result = "failed", []
        report.longrepr = (f"tests marked slow outside tests/slow/: {', '.join(misplaced)} (move them to "
                           f"tests/slow/<area>/{Path(collector.path).name}, where every test is marked slow)")
    return report


def pytest_collection_modifyitems(config, items):
    """The slow tests first, in their collection order: under pytest-xdist (the README's command
    runs ``-n auto``) they then start at once on every worker instead of ending the run one by one
    on a worker while the others idle. Sequential runs only change order."""
    items[:] = sorted(items, key=lambda item: item.get_closest_marker("slow") is None)


@pytest.fixture(scope="session")
def ray_session():
    """One real local Ray for the session (for each pytest-xdist worker): 2 CPUs and a *fake* GPU
    (for packing tests). ``address="local"``: always a new instance of its own, never a cluster
    another test or worker started on this machine."""
    import ray

    ray.init(address="local", num_cpus=2, num_gpus=1, include_dashboard=False, log_to_driver=False)
    yield ray
    ray.shutdown()


@pytest.fixture(scope="module")
def one_torch_thread():
    """One intra-op torch thread for a module of tiny-tensor tests: faster, and far faster on busy
    cores (no OpenMP spinning); the local backend's worker sets the same (client_cpus=1 -> 1
    thread). Use it with ``pytestmark = pytest.mark.usefixtures("one_torch_thread")``."""
    import torch

    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


@pytest.fixture
def registries_isolated():
    """What the test registers (a plugin it loads, a component, a preset, a dataset) is gone after it:
    every registry and the plugin core's records as they were (:func:`fedtune.plugins.isolated`).
    A test that registers anything uses it; :func:`_nothing_left_registered` fails one that does not."""
    from fedtune.plugins import isolated

    with isolated():
        yield


def registered_from_outside() -> set[tuple[str, str]]:
    """``(kind, name)`` of every component, algorithm and dataset registered in this process from
    outside fedtune (by a test, a plugin, a README example), but not by an installed package's entry
    point (loaded once per process, on the first use of a registry). Reads the registries without
    importing them: a process that has not imported one has registered nothing there."""
    out: set[tuple[str, str]] = set()
    if (algorithms := sys.modules.get("fedtune.algorithms")) is not None:
        out |= {key for key, owner in algorithms._OWNERS.items()
                if owner != algorithms._BUILT_IN and not owner.startswith("plugin entry point")}
    if (datasets := sys.modules.get("fedtune.data.registry")) is not None:
        out |= {("dataset", name) for name, (_, owner) in datasets._PLUGIN_DATASETS.items()
                if not owner.startswith("plugin entry point")}
    return out


@pytest.fixture(autouse=True)
def _nothing_left_registered():
    """A test leaves the registries as it found them: a component it registers and keeps would be
    seen by the tests that run after it in the same process (pytest-xdist worker), and fail them
    in an order that depends on how the tests are spread over the workers (the README's
    ``fedtune.register(Clipped)`` example once added the algorithm ``clipped`` to the contract
    tests' presets). Use ``registries_isolated`` (or :func:`fedtune.plugins.isolated`). A
    module-scoped fixture's registrations, made before its tests start, are not the test's."""
    before = registered_from_outside()
    yield
    if left := sorted(registered_from_outside() - before):
        pytest.fail(f"the test left registered: {', '.join(f'{kind} {name}' for kind, name in left)} "
                    "(use the registries_isolated fixture, or fedtune.plugins.isolated())", pytrace=False)


@pytest.fixture(autouse=True)
def _signal_handlers_put_back():
    """Each test starts with the signal handlers the worker had: a test that calls ``Tuner.fit``
    itself leaves Ray Tune's SIGINT handler installed (Tune never removes it), and a later test's
    SIGTERM would then only set the finished fit's stop flag (``sigterm_as_interrupt`` calls the
    SIGINT handler). The same guard fedtune's own sweeps put around every fit."""
    from fedtune.tune.tuner.env import signal_handlers_kept

    with signal_handlers_kept():
        yield
