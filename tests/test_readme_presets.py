"""The README's table of algorithms is the registry's: every preset is a row with its client
method, server rule and settings, and each row names its own hyperparameters with their defaults."""

from __future__ import annotations

import re
from pathlib import Path

from fedtune.algorithms import CLIENT_METHODS, PRESETS, SERVER_RULES, all_hparams

README = Path(__file__).resolve().parents[1] / "README.md"
HEADER = "| algorithm | client method | server rule | settings | hyperparameters (default) |"


def table_rows() -> dict[str, list[str]]:
    lines = README.read_text().splitlines()
    start = lines.index(HEADER) + 2
    rows: dict[str, list[str]] = {}
    for line in lines[start:]:
        if not line.startswith("|"):
            break
        cells = [c.strip() for c in re.split(r"(?<!\\)\|", line.strip())[1:-1]]
        name = cells[0].strip("`")
        assert name not in rows, f"README lists {name} twice"
        rows[name] = cells
    return rows


def ticked(cell: str) -> list[str]:
    return re.findall(r"`([^`]+)`", cell)


def test_the_readme_table_lists_every_preset_with_its_parts_and_settings():
    rows = table_rows()
    assert sorted(rows) == sorted(PRESETS)  # every preset, and nothing else
    for name, (algo, client, rule, settings, _) in rows.items():
        p = PRESETS[name]
        want_client = [p.client_method] + ([p.unsupervised_client_method] if p.unsupervised_client_method else [])
        assert ticked(client) == want_client, name
        assert ticked(rule) == [p.server_rule], name
        want_settings = list(p.settings) + (["ufdg"] if p.unsupervised_client_method else [])
        assert [s.strip() for s in settings.split(",")] == want_settings, name


def test_each_row_names_the_presets_own_hyperparameters_with_their_defaults():
    specs = {name: spec for name, (_, spec) in all_hparams().items()}
    rows = table_rows()
    for name, cells in rows.items():
        text = cells[4]
        if text.startswith("as `"):  # "as `gfm` without `sam_rho`", "as `fedsr` and `fedomg`"
            parts = [t for t in ticked(text) if t in PRESETS]
            assert parts and all(t in rows for t in parts), (name, text)
            continue
        named = [t for t in ticked(text) if t in specs]
        p = PRESETS[name]  # the supervised pair's own hyperparameters (fedgala's ufdg SimCLR knobs: its row's note)
        own = {h.name for part in (CLIENT_METHODS[p.client_method], SERVER_RULES[p.server_rule]) for h in part.hparams}
        assert own <= set(named), (name, own, named)
        for hp in named:
            default = dict(p.defaults).get(hp, specs[hp].default)  # a preset's own default comes first
            shown = re.search(rf"`{re.escape(hp)}` \(([^)]*)\)", text)
            assert shown is not None, (name, hp)
            first = shown.group(1).split(",")[0].split(" ")[0].strip("`")
            if specs[hp].kind in ("float", "int", "float_or_choice") and not isinstance(default, str):
                assert float(first) == float(default), (name, hp, first, default)
            else:
                assert first == str(default).lower() or first == str(default), (name, hp, first, default)
