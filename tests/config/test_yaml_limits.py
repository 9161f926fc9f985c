"""Every YAML a user writes (config file, ``--set`` value, search-space file) is read within limits.

A "billion laughs" document (nine anchors of nine aliases: 9**9 values once expanded) used to be
built, then printed into an error message: minutes of CPU and a MemoryError. Deep nesting was a
RecursionError. The bomb tests run in a subprocess under a wall-clock timeout and a memory cap, so
a regression fails (TimeoutExpired) instead of hanging the suite or eating the machine.
"""

from __future__ import annotations

import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from fedtune.errors import ConfigError
from fedtune.config import FederatedRunConfig, parse_set_options

ROOT = Path(__file__).resolve().parents[2]
MEMORY_CAP = 8 << 30  # bytes of address space a subprocess may map


def bomb(levels: int = 9, width: int = 9) -> str:
    """A flow list whose last item expands to ``width ** levels`` strings."""
    parts = ["&a0 [" + ", ".join(["x"] * width) + "]"]
    for i in range(1, levels):
        parts.append(f"&a{i} [" + ", ".join([f"*a{i - 1}"] * width) + "]")
    return "[" + ", ".join(parts) + "]"


def _cap_memory() -> None:
    import resource

    resource.setrlimit(resource.RLIMIT_AS, (MEMORY_CAP, MEMORY_CAP))


def run_cli(args: list[str], cwd: Path, timeout: float = 30) -> tuple[subprocess.CompletedProcess, float]:
    t0 = time.monotonic()
    proc = subprocess.run([sys.executable, "-m", "fedtune", *args], capture_output=True, text=True, cwd=cwd,
                          timeout=timeout, preexec_fn=_cap_memory)
    return proc, time.monotonic() - t0


def run_python(code: str, cwd: Path, timeout: float = 30) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", textwrap.dedent(code)], capture_output=True, text=True, cwd=cwd,
                          timeout=timeout, preexec_fn=_cap_memory)


def one_error_line(proc: subprocess.CompletedProcess) -> str:
    lines = proc.stderr.strip().splitlines()
    assert proc.returncode == 2 and len(lines) == 1, (proc.returncode, proc.stderr[-2000:])
    assert lines[0].startswith("fedtune: error: ") and len(lines[0]) < 500, lines[0][:1000]
    return lines[0]


# ------------------------------------------------------------------------------ the bomb, end to end
def test_alias_bomb_in_a_config_file_is_refused_at_once(tmp_path):
    config = tmp_path / "bomb.yaml"
    config.write_text(f"rounds: {bomb()}\n")
    proc, seconds = run_cli(["run", "--backend", "local", "--no-progress", "--config", str(config)], tmp_path)
    line = one_error_line(proc)
    assert str(config) in line and "100000" in line and "alias" in line.lower()
    assert seconds < 15
    assert not (tmp_path / "fedtune_results").exists()  # refused before anything was written


def test_alias_bomb_in_a_set_value_is_refused_at_once(tmp_path):
    proc, seconds = run_cli(["run", "--backend", "local", "--no-progress", "--set", f"mlp_hidden={bomb()}"],
                            tmp_path)
    line = one_error_line(proc)
    assert "--set 'mlp_hidden'" in line and "100000" in line
    assert seconds < 15


def test_alias_bomb_in_a_search_space_file_is_refused_at_once(tmp_path):
    space = tmp_path / "space.yaml"
    space.write_text(f"algorithm: fedavg\ndescription: {bomb()}\n"
                     "params:\n  local_lr: {distribution: fixed, value: 0.1}\n")
    proc = run_python(f"""
        import time
        from fedtune.errors import ConfigError
        from fedtune.spaces.lookup import load_space
        t0 = time.monotonic()
        try:
            load_space({str(space)!r})
        except ConfigError as exc:
            print(len(str(exc)), round(time.monotonic() - t0, 2), str(exc)[:300])
    """, tmp_path)
    assert proc.returncode == 0, proc.stderr[-2000:]
    length, seconds, message = proc.stdout.split(" ", 2)
    assert int(length) < 500 and float(seconds) < 5
    assert message.startswith(f"{space}: ") and "100000" in message


def test_the_bomb_is_refused_before_it_is_built(tmp_path):
    """The refusal allocates next to nothing: the expansion (387 million references) never exists."""
    config = tmp_path / "bomb.yaml"
    config.write_text(f"rounds: {bomb()}\n")
    proc = run_python(f"""
        import tracemalloc
        from fedtune.errors import ConfigError
        from fedtune.config import FederatedRunConfig
        tracemalloc.start()
        try:
            FederatedRunConfig.from_yaml({str(config)!r})
        except ConfigError as exc:
            print(tracemalloc.get_traced_memory()[1])
    """, tmp_path)
    assert proc.returncode == 0 and proc.stdout.strip(), proc.stderr[-2000:]
    assert int(proc.stdout) < 20 << 20  # peak bytes


def test_a_merge_key_bomb_is_refused_at_once(tmp_path):
    """``<<: [*a, *a, ...]`` merges copy mappings while the document is built: 9 levels are 9**8
    copies inside yaml.safe_load itself."""
    lines = ["a0: &a0 {" + ", ".join(f"k{i}: 1" for i in range(9)) + "}"]
    lines += [f"a{i}: &a{i} {{<<: [" + ", ".join([f"*a{i - 1}"] * 9) + "]}" for i in range(1, 9)]
    config = tmp_path / "merge.yaml"
    config.write_text("\n".join(lines) + "\n")
    proc, seconds = run_cli(["run", "--backend", "local", "--no-progress", "--config", str(config)], tmp_path)
    line = one_error_line(proc)
    assert str(config) in line and "aliases expand to more than 100000 values" in line
    assert seconds < 15


# ------------------------------------------------------------------------------ nesting, cycles, size
@pytest.mark.parametrize("depth", [101, 10_000])
def test_deep_nesting_is_one_config_error_not_a_recursion_error(tmp_path, depth):
    config = tmp_path / "deep.yaml"
    config.write_text("mlp_hidden: " + "[" * depth + "]" * depth + "\n")
    with pytest.raises(ConfigError, match=r"nested deeper than 100 levels; allowed: at most 100") as exc:
        FederatedRunConfig.from_yaml(config)
    assert str(config) in str(exc.value) and len(str(exc.value)) < 300
    with pytest.raises(ConfigError, match=r"--set 'mlp_hidden': YAML nested deeper than 100"):
        parse_set_options(["mlp_hidden=" + "[" * depth + "]" * depth])


def test_aliases_that_nest_deep_are_refused_too(tmp_path):
    # Each anchor is 20 levels deep and holds the one before: 10 anchors make 200 levels once expanded.
    lines = ["- &a0 " + "[" * 20 + "]" * 20]
    lines += [f"- &a{i} " + "[" * 19 + f"*a{i - 1}" + "]" * 19 for i in range(1, 10)]
    config = tmp_path / "chain.yaml"
    config.write_text("mlp_hidden:\n" + "\n".join("  " + line for line in lines) + "\n")
    with pytest.raises(ConfigError, match="aliases nest deeper than 100 levels"):
        FederatedRunConfig.from_yaml(config)


def test_a_recursive_alias_is_refused(tmp_path):
    config = tmp_path / "cycle.yaml"
    config.write_text("mlp_hidden: &a [1, *a]\n")
    with pytest.raises(ConfigError, match="recursive YAML alias") as exc:
        FederatedRunConfig.from_yaml(config)
    assert str(config) in str(exc.value)


def test_an_oversized_file_is_refused_before_it_is_read(tmp_path):
    config = tmp_path / "big.yaml"
    config.write_text("rounds: 3\n" + "#" * (1 << 20) + "\n")
    with pytest.raises(ConfigError, match=r"more than 1048576 bytes of YAML; allowed: at most 1048576") as exc:
        FederatedRunConfig.from_yaml(config)
    assert str(config) in str(exc.value)


def test_ordinary_anchors_and_aliases_still_load(tmp_path):
    config = tmp_path / "ok.yaml"
    config.write_text("mlp_hidden: &w [16, 8]\nparams: {}\nrounds: 2\n")
    cfg = FederatedRunConfig.from_yaml(config)
    assert cfg.mlp_hidden == [16, 8] and cfg.rounds == 2
    assert parse_set_options(["mlp_hidden=[&w 4, *w]"]) == {"mlp_hidden": [4, 4]}


# ------------------------------------------------------------------------------ values YAML cannot build
def test_a_value_yaml_cannot_build_is_one_line_naming_the_file(tmp_path):
    config = tmp_path / "date.yaml"
    config.write_text("rounds: 2\nname: 2001-02-30\n")
    with pytest.raises(ConfigError, match="is not valid YAML: .*day is out of range.*line 2") as exc:
        FederatedRunConfig.from_yaml(config)
    assert str(config) in str(exc.value) and "\n" not in str(exc.value)


def test_set_values_yaml_cannot_build_stay_text_or_are_refused_by_the_field():
    assert parse_set_options(["name=2001-02-30"]) == {"name": "2001-02-30"}  # like any text YAML cannot read
    assert FederatedRunConfig.from_dict(parse_set_options(["name=2001-02-30"])).name == "2001-02-30"
    digits = "9" * 5000  # more digits than Python turns into an int
    with pytest.raises(ConfigError, match=r"field 'rounds': '9999.*\.\.\. is out of range; allowed: an integer") as exc:
        FederatedRunConfig.from_dict(parse_set_options([f"rounds={digits}"]))
    assert len(str(exc.value)) < 200


def test_a_config_file_that_is_not_utf8_is_one_config_error(tmp_path):
    config = tmp_path / "latin1.yaml"
    config.write_bytes("name: caf\xe9\n".encode("latin-1"))
    with pytest.raises(ConfigError, match="not UTF-8 text") as exc:
        FederatedRunConfig.from_yaml(config)
    assert str(config) in str(exc.value)


def test_every_yaml_read_of_the_package_goes_through_the_bounded_loader():
    offenders = []
    for path in sorted((ROOT / "fedtune").rglob("*.py")):
        if path.name == "yaml_safe.py":
            continue
        for n, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
            code = line.split("#", 1)[0]
            if any(call in code for call in ("yaml.safe_load(", "yaml.load(", "yaml.full_load(", "yaml.unsafe_load(",
                                             "yaml.compose(", "yaml.load_all(", "yaml.safe_load_all(")):
                offenders.append(f"{path.relative_to(ROOT)}:{n}")
    assert not offenders, f"read YAML with fedtune.yaml_safe.load / load_file: {offenders}"


# ------------------------------------------------------------------------------ a key given twice
DUPLICATED = "rounds: 3\nlocal_steps: 2\nrounds: 5\n"


def test_a_duplicated_key_in_a_config_file_is_one_line_naming_the_key_and_both_lines(tmp_path):
    config = tmp_path / "twice.yaml"
    config.write_text(DUPLICATED)
    with pytest.raises(ConfigError) as exc:
        FederatedRunConfig.from_yaml(config)
    assert str(exc.value) == (f"config file '{config}': key 'rounds' is given twice (lines 1 and 3); allowed: each "
                              "key once")
    proc, _ = run_cli(["run", "--backend", "local", "--no-progress", "--config", str(config)], tmp_path)
    assert "key 'rounds' is given twice (lines 1 and 3)" in one_error_line(proc)


def test_a_duplicated_key_is_refused_at_every_depth_and_in_flow_style(tmp_path):
    nested = tmp_path / "nested.yaml"
    nested.write_text("algorithm: fedprox\nparams:\n  prox_mu: 0.1\n  prox_mu: 0.5\n")
    with pytest.raises(ConfigError, match=r"key 'prox_mu' is given twice \(lines 3 and 4\)"):
        FederatedRunConfig.from_yaml(nested)
    flow = tmp_path / "flow.yaml"
    flow.write_text("params: {prox_mu: 0.1, prox_mu: 0.5}\n")
    with pytest.raises(ConfigError, match=r"key 'prox_mu' is given twice \(both on line 1\)"):
        FederatedRunConfig.from_yaml(flow)
    same = tmp_path / "same.yaml"  # two spellings of one value are one key, as the mapping would keep one
    same.write_text("mlp_hidden: [8]\nparams: {1: a, 0x1: b}\n")
    with pytest.raises(ConfigError, match=r"key 1 is given twice"):
        FederatedRunConfig.from_yaml(same)


def test_a_duplicated_key_in_a_set_value_is_refused_not_kept_as_text():
    with pytest.raises(ConfigError, match=r"--set 'params': key 'prox_mu' is given twice \(both on line 1\)"):
        parse_set_options(["params={prox_mu: 0.1, prox_mu: 0.5}"])


def test_a_duplicated_key_in_a_search_space_and_a_sweep_config_file_is_refused(tmp_path):
    from fedtune.cli import build_parser
    from fedtune.cli_sweep import options_from_args
    from fedtune.spaces.lookup import load_space

    space = tmp_path / "fedavg.yaml"
    space.write_text("algorithm: fedavg\nparams:\n  local_lr: {distribution: loguniform, low: 0.01, high: 0.1}\n"
                     "  local_lr: {distribution: uniform, low: 0.01, high: 0.1}\n")
    with pytest.raises(ConfigError, match=rf"{space}: key 'local_lr' is given twice \(lines 3 and 4\)"):
        load_space(str(space))
    base = tmp_path / "base.yaml"
    base.write_text(DUPLICATED)
    with pytest.raises(ConfigError, match=rf"config file '{base}': key 'rounds' is given twice"):
        options_from_args(build_parser().parse_args(["sweep", "--config", str(base), "--output", str(tmp_path)]))


def test_a_merge_is_not_a_duplicate_and_a_key_beside_it_overrides_as_yaml_says(tmp_path):
    config = tmp_path / "merge.yaml"
    config.write_text("params: &base {prox_mu: 0.1}\nalgorithm: fedprox\nmlp_hidden: [8]\n")
    assert FederatedRunConfig.from_yaml(config).params["prox_mu"] == 0.1
    from fedtune import yaml_safe

    import yaml

    text = "base: &b {x: 1, y: 2}\nmore: &m {<<: *b, x: 3}\nlast: {<<: [*m, *b], y: 4}\nlist: [{a: 1}, {a: 2}]\n"
    doc = yaml_safe.load(text, "inline")
    assert doc["more"] == {"x": 3, "y": 2} and doc["last"]["y"] == 4 and doc["list"] == [{"a": 1}, {"a": 2}]
    assert doc == yaml.safe_load(text)  # each key once: what SafeLoader builds, merges included


def test_every_yaml_file_the_project_ships_has_each_key_once():
    from fedtune import yaml_safe

    files = sorted(ROOT.glob("*.yaml")) + sorted((ROOT / "examples").rglob("*.yaml")) + \
        sorted((ROOT / "search_spaces").glob("*.yaml"))
    assert len(files) > 20 and (ROOT / "cluster.yaml") in files
    for path in files:
        yaml_safe.load_file(path)  # cluster.yaml, the examples, the search spaces
