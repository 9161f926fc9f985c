"""The effective search space, shown and written out: ``fedtune spaces show NAME`` and the
complete copy a study keeps of each space (``<study>/spaces/<algorithm>.yaml``).

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

from fedtune.spaces.model import OMITTED, ParamSpec, SearchSpace

__all__ = ["show_space", "space_rows", "space_text"]


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


def show_space(name: str, *, as_yaml: bool = False, console: Any = None) -> int:
    """Print the effective space of ``name`` (an algorithm's name or a file's path:
    :func:`~fedtune.spaces.lookup.load_space`)."""
    # lazy: keeps rich, numpy out of this module's import
    from rich.console import Console
    from rich.table import Table
    from rich.text import Text

    from fedtune.spaces.lookup import load_space

    space = load_space(name)
    if as_yaml:
        print(space_text(space), end="")
        return 0
    if console is None:
        console = Console()
        if not console.is_terminal:  # a pipe or a file: one row per line, not folded to 80 columns
            console = Console(width=200)
    if not space.origins:
        where = f"{space.source} (complete: nothing derived)"
    elif space.source == space.algorithm:
        where = "the declarations alone (no file)"
    else:
        where = f"{space.source} over the declarations"
    table = Table(title=f"search space of {space.algorithm}: {where}")
    for col in ("name", "distribution", "range / choices / value", "default", "when", "source"):
        table.add_column(col, overflow="fold")
    for row in space_rows(space):
        table.add_row(*(Text(cell) for cell in row))
    console.print(table)
    console.print(f"constants: {', '.join(f'{k}={v}' for k, v in space.constants.items())}", markup=False)
    if space.description:
        console.print(f"description: {space.description}", markup=False)
    return 0
