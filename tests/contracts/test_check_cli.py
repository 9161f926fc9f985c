"""``fedtune check MODULE[:NAME]`` and its Python face (issue 45): the contract checks every built-in
passes (:mod:`fedtune.contracts`; tests/contracts/test_contracts.py runs them on every built-in) run on a
plugin's components. Both plugin examples pass (exit 0); seven components broken on purpose
(tests/contracts/broken_plugins/) each fail the check that names their fault (exit 1) and pass the others; a
module that does not import, a name it does not register and a bare ``fedtune`` are one line (exit 2);
``fedtune:NAME`` checks a built-in; ``fedtune.assert_component_ok`` raises one line per failure."""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
from pathlib import Path

import pytest

import fedtune
from fedtune.cli import main
from fedtune.contracts.result import CHECKS, PASSED
from fedtune.contracts.suite import plugin_components, split_target

pytestmark = pytest.mark.usefixtures("one_torch_thread")

ROOT = Path(__file__).resolve().parents[2]
EXAMPLES = ROOT / "examples" / "plugins"
BROKEN = ROOT / "tests" / "contracts" / "broken_plugins"
PLUGIN_MODULES = {p.stem for p in (*EXAMPLES.glob("*.py"), *BROKEN.glob("*.py"))}


@contextlib.contextmanager
def registries_restored():
    """Every registry and the plugin core's bookkeeping as they were before
    (:func:`fedtune.plugins.isolated`), and the plugin modules a test imports gone from ``sys.modules``
    (so no other test of this process sees the plugins a test loads)."""
    from fedtune.plugins import isolated

    modules = set(sys.modules)
    try:
        with isolated():
            yield
    finally:
        for name in set(sys.modules) - modules:
            if name in PLUGIN_MODULES:
                sys.modules.pop(name)


def check(*args: str, capsys) -> tuple[int, str, str]:
    """``fedtune check ARGS`` in this process (registries restored after): exit code, stdout, stderr."""
    with registries_restored():
        code = main(["check", *args])
    out, err = capsys.readouterr()
    return code, out, err


def failed_lines(err: str) -> dict[str, str]:
    """``{check: its line}`` of the ``FAILED ...`` lines on stderr."""
    out = {}
    for line in err.splitlines():
        if line.startswith("FAILED "):
            check_name = next(c for c in CHECKS if f": {c} failed: " in line)
            out[check_name] = line
    return out


def cli(*args: str, timeout: float = 300) -> subprocess.CompletedProcess:
    """``fedtune check ARGS`` in a process of its own, its table one row a line (250 columns)."""
    return subprocess.run([sys.executable, "-m", "fedtune.cli", "check", *args], cwd=ROOT, capture_output=True,
                          text=True, timeout=timeout, env={**os.environ, "COLUMNS": "250"})


# ============================================================================ the examples pass
@pytest.mark.parametrize("name,components", [("feddecorr", "2 components"), ("fednova", "2 components")])
def test_fedtune_check_passes_both_plugin_examples(name, components):
    res = cli(f"examples/plugins/{name}.py")
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    summary = res.stdout.strip().splitlines()[-1]
    assert f"checks of {components}" in summary and " 0 failed, 0 skipped" in summary, summary
    rows = [line for line in res.stdout.splitlines() if " passed " in line]
    for check_name in ("hyperparameters", "one-line errors", "composition", "finite first step", "determinism",
                       "checkpoint and resume", "preset parts"):
        assert any(check_name in row for row in rows), (check_name, res.stdout)


# ============================================================================ broken on purpose
BROKEN_CASES = {
    "bad_default": ({"hyperparameters"}, "its default 5.0 is refused by its own declaration"),
    "bad_search": ({"hyperparameters"}, "search high 2.0: field 'bad_search_weight' (search): 2.0 is out of range; "
                                        "allowed: >= 0 and <= 1"),
    "undeclared_state": ({"keeps_client_state", "checkpoint and resume"},
                         "declares keeps_client_state=False, but clients [0, 1, 2, 3] kept ctx.state"),
    "global_rng": ({"determinism"}, "two runs of the same config differ at round 1: train_loss"),
    "forgetful_rule": ({"checkpoint and resume"}, "resumed from the round-2 checkpoint, round 4: train_loss"),
    "nan_step": ({"finite first step", "composition"}, "round 1 is diverged with train_loss nan"),
    "traceback_rule": ({"hyperparameters"}, "value 0.0, which its declaration allows, is refused: ZeroDivisionError: "
                                            "float division by zero (traceback_rule.py:"),
}
"""Each broken component: the checks it fails, and the reason its first-named fault gives."""


@pytest.mark.parametrize("name", list(BROKEN_CASES))
def test_a_broken_component_fails_the_check_that_names_its_fault(name, capsys):
    fails, reason = BROKEN_CASES[name]
    code, out, err = check(str(BROKEN / f"{name}.py"), capsys=capsys)
    assert code == 1, out + err
    lines = failed_lines(err)
    assert set(lines) == fails, lines  # the other checks pass (or are skipped after a failure)
    assert any(reason in line for line in lines.values()), lines
    assert all("(fix: " in line for line in lines.values()), lines  # each says what to fix


def test_the_keeps_client_state_fix_says_what_to_declare(capsys):
    _, _, err = check(str(BROKEN / "undeclared_state.py"), capsys=capsys)
    assert "fix: declare keeps_client_state=True in its ClientMethodSpec" in failed_lines(err)["keeps_client_state"]


def test_a_component_fails_in_a_users_pytest_suite_with_one_line_per_failure():
    with registries_restored():
        from fedtune.plugins import load_plugins

        load_plugins([str(BROKEN / "global_rng.py")])
        results = fedtune.check_component("global-rng")
        assert [r.check for r in results] == ["hyperparameters", "one-line errors", "composition", "finite first step",
                                              "determinism", "checkpoint and resume", "keeps_client_state",
                                              "preset parts"]
        assert {r.check: r.status for r in results}["determinism"] == "failed"
        assert {r.check: r.status for r in results}["checkpoint and resume"] == "skipped"
        with pytest.raises(AssertionError) as err:  # the class itself: its client method, not its algorithm
            fedtune.assert_component_ok(sys.modules["global_rng"].GlobalRng)
    lines = str(err.value).splitlines()
    assert lines[0] == "1 of 7 contract checks failed:", lines
    assert lines[1].startswith("client method global-rng: determinism failed: two runs of the same config differ")
    assert len(lines) == 2


def test_a_built_in_passes_through_the_python_face():
    results = fedtune.assert_component_ok("avgm", "server optimizer")
    assert [r.check for r in results] == ["hyperparameters", "one-line errors", "composition", "finite first step",
                                          "determinism", "checkpoint and resume"]
    assert all(r.status == PASSED for r in results)
    assert "carries optimizer" in results[-1].reason  # FedAvgM's momentum is what makes its runs continue


# ============================================================================ naming what to check
def test_module_name_picks_one_component_and_its_algorithm(capsys):
    with registries_restored():
        by_attr = plugin_components(f"{EXAMPLES / 'feddecorr.py'}:FedDecorr")
        by_name = plugin_components(f"{EXAMPLES / 'feddecorr.py'}:feddecorr")
    assert by_attr == by_name == [("client method", "feddecorr"), ("algorithm", "feddecorr")]
    assert split_target("C:\\plugins\\x.py") == ("C:\\plugins\\x.py", None)


def test_fedtune_name_checks_a_built_in(capsys):
    code, out, err = check("fedtune:fedprox", capsys=capsys)
    assert code == 0, out + err
    assert "1 components: " in out.splitlines()[-1] and "0 failed" in out.splitlines()[-1]  # the algorithm fedprox


@pytest.mark.parametrize("target,message", [
    ("no_such_plugin_module", "fedtune check: plugin 'no_such_plugin_module' does not import: ModuleNotFoundError"),
    (f"{EXAMPLES / 'fednova.py'}:nope", "registers no component 'nope'; it registers: server rule fednova, "
                                        "algorithm fednova"),
    ("fedtune", "name one built-in component, fedtune:NAME"),
    ("fedtune:no-such-thing", "fedtune has no built-in component 'no-such-thing'"),
    ("fedtune.errors", "plugin 'fedtune.errors' registers no component"),
])
def test_bad_input_is_one_line_and_exit_2(target, message, capsys):
    code, out, err = check(target, capsys=capsys)
    assert code == 2 and out == "", out
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("fedtune: error: ") and message in lines[0], lines


def test_a_module_that_does_not_import_is_exit_2_from_the_command_line(tmp_path):
    broken = tmp_path / "syntax_error_plugin.py"
    broken.write_text("import fedtune\ndef (:\n")
    res = cli(str(broken), timeout=120)
    assert res.returncode == 2, res.stdout + res.stderr
    assert res.stderr.strip().splitlines() == [res.stderr.strip()] and "does not import: SyntaxError" in res.stderr
