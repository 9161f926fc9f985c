"""The effective search space, shown and written out: ``fedtune spaces show NAME`` and the
complete copy a study keeps of each space (``<study>/spaces/<algorithm>.yaml``); ``fedtune spaces
show`` alone lists every algorithm's space as *derived* (from the declarations, no file) or
*overridden* (by which file, and what the file changes: :func:`space_kind`).

:func:`show_space` prints a space as a table (every switch and parameter in sampling order of
declaration: distribution, range / choices / value, default, condition, and where it comes from:
``declared: ...`` by a component, ``shared`` (:mod:`fedtune.spaces.shared`), ``preset ...'s
default``, ``+ file (keys)`` where a file changed it, ``file`` where a file added it), or with
``as_yaml`` as the complete document :func:`space_text` writes.

>>> from fedtune.spaces.lookup import load_space
>>> rows = space_rows(load_space("fedomg"))
>>> rows[0]
['omg_kappa', 'uniform', '[0.0, 1.0]', '0.5', '', 'declared: server rule fedomg']
>>> [r[5] for r in rows if r[0] == "global_lr"]
['shared']
"""

from __future__ import annotations

from typing import Any

from fedtune.errors import ConfigError
from fedtune.spaces.model import OMITTED, ParamSpec, SearchSpace

__all__ = ["overridden_names", "show_space", "space_kind", "space_rows", "space_text"]


def space_text(space: SearchSpace, note: str = "") -> str:
    """``space`` as a complete YAML document (:meth:`SearchSpace.to_document`) under a comment
    saying where it came from (and ``note``, one more comment line)."""
    import yaml  # lazy: keeps yaml out of this module's import

    def flow(value: Any) -> str:
        return yaml.safe_dump(value, default_flow_style=True, sort_keys=False, allow_unicode=True, width=10**6).strip()

    lines = [f"# The search space {space.source}, complete: read again, nothing is derived from the declarations."]
    if note:
        lines.append(f"# {note}")
    doc = space.to_document()
    for key, value in doc.items():
        if key in ("switches", "params"):
            lines.append(f"{key}:")
            lines.extend(f"  {flow({name: entry})[1:-1]}" for name, entry in value.items())
        else:
            lines.append(flow({key: value})[1:-1])
    return "\n".join(lines) + "\n"


def _text(value: Any) -> str:
    if value is OMITTED:
        return "left out"
    if isinstance(value, bool) or value is None:
        return str(value).lower() if value is not None else "null"
    return str(value)


def _condition(p: ParamSpec) -> str:
    if not p.when:
        return ""
    parts = [f"{ref} in [{', '.join(_text(v) for v in values)}]" if len(values) > 1 else f"{ref} = {_text(values[0])}"
             for ref, values in p.when.items()]
    return " and ".join(parts) + f"; else {_text(p.fallback)}"


def space_rows(space: SearchSpace) -> list[list[str]]:
    """One row per switch and parameter: name, distribution, range / choices / value, default,
    condition, source."""
    rows = []
    for s in space.switches.values():
        rows.append([f"switch.{s.name}", "switch", f"[{', '.join(_text(c) for c in s.choices)}]", _text(s.default), "",
                     space.origins.get(s.name, "file")])
    for p in space.params.values():
        if p.distribution in ("uniform", "loguniform", "int"):
            what = f"[{_text(p.low)}, {_text(p.high)}]" + (" log" if p.log else "")
        elif p.distribution == "categorical":
            what = f"[{', '.join(_text(c) for c in p.choices)}]"
        else:
            what = _text(p.value)
        default = "" if p.distribution == "fixed" else _text(p.default)
        rows.append([p.name, p.distribution, what, default, _condition(p), space.origins.get(p.name, "file")])
    return rows


def overridden_names(space: SearchSpace) -> list[str]:
    """What a file changes of its algorithm's derived space (``search_spaces/<algorithm>.yaml``, or
    any override): the constants, switches and parameters that differ from the space the
    declarations alone give, in the space's order; parameters it drops last.

    >>> from fedtune.spaces.lookup import load_space
    >>> overridden_names(load_space("fediir-omg")), overridden_names(load_space("fedavg"))
    (['fediir_penalty'], [])
    """
    from fedtune.spaces.yaml_files import build_space  # lazy: keeps numpy out of this module's import

    base = build_space({"algorithm": space.algorithm}, space.algorithm, None)
    names = [k for k in {**base.constants, **space.constants} if base.constants.get(k) != space.constants.get(k)]
    for mine, theirs in ((space.switches, base.switches), (space.params, base.params)):
        names += [n for n in mine if theirs.get(n) != mine[n]] + [n for n in theirs if n not in mine]
    return names


def space_kind(space: SearchSpace) -> str:
    """Where ``space`` comes from, in words: ``derived`` (the declarations alone), ``overridden by
    FILE (NAMES)`` (a file over the declarations, and what it changes) or ``complete: FILE``.

    >>> from fedtune.spaces.lookup import load_space
    >>> space_kind(load_space("simclr")), space_kind(load_space("fediir-omg")).split(" by ")[0]
    ('derived (from the declarations; no file)', 'overridden')
    """
    if not space.origins:
        return f"complete: {space.source} (nothing derived)"
    if space.source == space.algorithm:
        return "derived (from the declarations; no file)"
    changed = overridden_names(space)
    return f"overridden by {space.source} ({', '.join(changed) if changed else 'nothing but its description'})"


def _list_spaces(console: Any) -> int:
    """``fedtune spaces show`` without a name: every algorithm, its space derived or overridden."""
    # lazy: keeps rich, numpy out of this module's import
    from rich.table import Table

    from fedtune.algorithms.presets import PRESETS
    from fedtune.spaces.lookup import load_space

    table = Table(title="search spaces (`fedtune spaces show NAME` prints one)")
    table.add_column("algorithm")
    table.add_column("space: derived from the declarations, or overridden by a file (what it changes)",
                     overflow="fold")
    for name in sorted(PRESETS):
        table.add_row(name, space_kind(load_space(name)))
    console.print(table)
    return 0


def show_space(name: str | None, *, as_yaml: bool = False, console: Any = None) -> int:
    """Print the effective space of ``name`` (an algorithm's name or a file's path:
    :func:`~fedtune.spaces.lookup.load_space`); without a name, every algorithm's space as derived
    or overridden (:func:`space_kind`)."""
    # lazy: keeps rich, numpy out of this module's import
    from rich.console import Console
    from rich.table import Table
    from rich.text import Text

    from fedtune.spaces.lookup import load_space

    if console is None:
        console = Console()
        if not console.is_terminal:  # a pipe or a file: one row per line, not folded to 80 columns
            console = Console(width=200)
    if name is None:
        if as_yaml:
            raise ConfigError("option '--yaml' prints one space: name it (fedtune spaces show NAME --yaml)")
        return _list_spaces(console)
    space = load_space(name)
    if as_yaml:
        print(space_text(space), end="")
        return 0
    table = Table(title=f"search space of {space.algorithm}: {space_kind(space)}")
    for col in ("name", "distribution", "range / choices / value", "default", "when", "source"):
        table.add_column(col, overflow="fold")
    for row in space_rows(space):
        table.add_row(*(Text(cell) for cell in row))
    console.print(table)
    console.print(f"constants: {', '.join(f'{k}={v}' for k, v in space.constants.items())}", markup=False)
    if space.description:
        console.print(f"description: {space.description}", markup=False)
    return 0
