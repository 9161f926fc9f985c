"""``fedtune check MODULE[:NAME] [--ray] [--plugin ...]``: the contract checks of fedtune's own
components run on yours (:mod:`fedtune.contracts`), printed as a table of what passed, what failed
and what to fix. Exit 0 when every check passes, 1 when any fails, 2 on bad input (a module that
does not import, a name it does not register: one line)."""

from __future__ import annotations

import argparse
import sys
import time

from fedtune.cli_sweep import add_plugin_argument

STYLE = {"passed": "green", "failed": "bold red", "skipped": "yellow"}


def add_check_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "check", help="run fedtune's contract checks on your own components (a plugin module)",
        description="Import MODULE as --plugin does and run, on every component it registers (or on NAME), the "
                    "checks every built-in passes: its hyperparameters' bounds, kinds, choices and search; one-line "
                    "errors; composition with every server rule, client method and server optimiser; a finite first "
                    "step; determinism; checkpoint and resume; keeps_client_state declared exactly; with --ray, the "
                    "Ray backend's rounds equal the local backend's. Tiny runs on the local backend. Exit 0: all pass; "
                    "1: a check failed; 2: bad input. fedtune:NAME checks a built-in.")
    add_plugin_argument(p)
    p.add_argument("target", metavar="MODULE[:NAME]",
                   help="a module name or a path to a .py file, optionally :NAME, a component it registers (or the "
                        "attribute holding it); fedtune:NAME for a built-in")
    p.add_argument("--ray", action="store_true",
                   help="also check that the Ray backend (1 and 2 client actors) gives the local backend's rounds "
                        "(starts a local Ray with 2 CPUs when none is connected)")


def cmd_check(args: argparse.Namespace) -> int:
    # lazy: keeps rich, fedtune.contracts.suite out of the CLI's start
    from rich.console import Console
    from rich.table import Table

    from fedtune.contracts.suite import check_components, plugin_components

    components = plugin_components(args.target)  # a PluginError (exit 2) before anything runs
    console = Console()
    start = time.perf_counter()
    with console.status("checking") as status:
        results = check_components(components, ray=args.ray, progress=lambda who: status.update(f"checking {who}"))
    table = Table(title=f"fedtune check {args.target}")
    for col in ("component", "check", "result", "why", "what to fix"):
        table.add_column(col, overflow="fold")
    for r in results:
        table.add_row(r.component, r.check, f"[{STYLE.get(r.status, '')}]{r.status}[/]", r.reason, r.fix)
    console.print(table)
    failed = sum(r.failed for r in results)
    counts = ", ".join(f"{sum(r.status == s for r in results)} {s}" for s in STYLE)
    print(f"{len(results)} checks of {len(components)} components: {counts} ({time.perf_counter() - start:.0f} s)")
    if failed:
        for r in results:  # plain lines too: a log or CI output that cuts the table still says what failed
            if r.failed:
                print(f"FAILED {r.line()}", file=sys.stderr)
        return 1
    return 0
