"""The ``fedtune`` command line: every subcommand's parser and handler (``run``, ``partition``, ``datasets``,
``algorithms``, ``fields``, ``spaces show``, ``sweep``, ``report``, ``check``; ``sweep`` and ``check`` in modules of
their own). Heavy modules are imported by the handler that needs them, so ``fedtune --help`` and bad flags answer
at once."""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
from importlib.metadata import PackageNotFoundError, version
from typing import Any

from fedtune.config import ROLES, FederatedRunConfig, default_of, describe_fields, parse_set_options
from fedtune.config_roles import GROUPS
from fedtune.errors import ConfigError, DataError, ResourceError
from fedtune.results import status
from fedtune import __version__
from fedtune.algorithms import CLIENT_METHODS, SERVER_RULES
from fedtune.algorithms.presets import PRESETS
from fedtune.cli_check import add_check_parser, cmd_check
from fedtune.cli_sweep import add_plugin_argument, add_sweep_parser, cmd_sweep
from fedtune.data.partition_table import partition_json, partition_lines
from fedtune.data.registry import list_datasets
from fedtune.plugins import load_plugins
from fedtune.results.selection import PROTOCOLS
from fedtune.results.study_dir import StudyDir
from fedtune.runtime.signals import sigterm_as_interrupt

RUN_FLAGS = {name: name for name in ROLES.run_flags}
"""Flags of `fedtune run` that map one-to-one onto config fields (flag dest -> field): the fields
declared ``run_flag`` (:mod:`fedtune.config_roles`)."""


def installed_version() -> str:
    """fedtune's installed version (package metadata), else ``fedtune.__version__`` (a source tree)."""
    try:
        return version("fedtune")
    except PackageNotFoundError:
        return __version__


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="fedtune", description="Federated domain generalisation / adaptation studies on Ray.")
    parser.add_argument("--version", action="version", version=f"fedtune {installed_version()}")
    sub = parser.add_subparsers(dest="command", required=True)

    run = sub.add_parser("run", help="run one federated training run (one trial)",
                         description="Run one federated run and store every round in OUTPUT/STUDY/. "
                                     "Precedence: defaults < --config FILE < flags < --set.")
    add_run_config_arguments(run)
    run.add_argument("--no-progress", action="store_true", help="no progress bar")
    run.add_argument("--verbose", action="store_true", help="show Ray's logs and actor output")
    partition = sub.add_parser(
        "partition", help="show a run's federated split (clients x domains) without training",
        description="Build the data plan `fedtune run` would build (the same options) and print how many "
                    "training examples of each domain each client holds; nothing trains, Ray is not started.")
    add_run_config_arguments(partition)
    partition.add_argument("--json", action="store_true", help="print one JSON object (train and val counts)")

    add_plugin_argument(sub.add_parser("datasets", help="list datasets"))
    add_plugin_argument(sub.add_parser("algorithms", help="list algorithms, client methods and server rules"))
    add_plugin_argument(sub.add_parser("fields", help="list every config field with its default and meaning"))
    spaces = sub.add_parser("spaces", help="search spaces: show the effective space of an algorithm or file")
    show = spaces.add_subparsers(dest="spaces_command", required=True).add_parser(
        "show", help="print a space: every parameter, its distribution, default, condition and source")
    add_plugin_argument(show)
    show.add_argument("space", metavar="NAME|FILE.yaml", nargs="?",
                      help="an algorithm (`fedtune algorithms`) or a space file; none: every algorithm's space, "
                           "derived (from the declarations) or overridden (by which file)")
    show.add_argument("--yaml", action="store_true", help="print it as a complete space file instead of a table")

    add_sweep_parser(sub)
    add_check_parser(sub)

    report = sub.add_parser("report", help="tables, report.md and plots of a study (OUTPUT/STUDY)",
                            description="Summarise a study directory: per-algorithm (and per target domain) "
                                        "accuracy tables, STUDY_DIR/report.md, PNG plots in STUDY_DIR/plots/. "
                                        "Works while the study is still running.")
    report.add_argument("study_dir", metavar="STUDY_DIR", help="study directory, e.g. fedtune_results/default")

    report.add_argument("--selection", choices=list(PROTOCOLS),
                        help="val: by source validation (honest; with split_scheme the file's ID validation); "
                             "target-val (fda): by the target client's held-out labels; ood-val (split_scheme): "
                             "by the split file's OOD validation domain; val-f1 / ood-val-f1 (split_scheme): the same "
                             "by macro-F1 (Bai et al.'s iWildCam); oracle: by a held-out slice of the target, last round (labelled "
                             "oracle); default: STUDY_DIR/study.json's, else val")
    report.add_argument("--no-plots", action="store_true", help="skip the PNG plots and Optuna importances")
    return parser


def add_run_config_arguments(p: argparse.ArgumentParser) -> None:
    """The options that make a run's config (``fedtune run`` and ``fedtune partition``)."""
    add_plugin_argument(p)
    p.add_argument("--config", metavar="FILE.yaml", help="YAML mapping of config fields")
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                   help="set any config field, e.g. --set client_gpus=0.25 --set local_epochs=2 "
                        "(see `fedtune fields`)")
    by_name = {f.name: f for f in dataclasses.fields(FederatedRunConfig)}
    for name, metavar in ROLES.run_flags.items():  # the fields declared run_flag, each --NAME
        f = by_name[name]
        default = default_of(f)
        kwargs: dict[str, Any] = {"help": f.metadata["help"] + ("" if default is None else f"; default {default!r}")}
        if f.metadata["bounds"].choices:
            kwargs["choices"] = list(f.metadata["bounds"].choices)
        elif isinstance(metavar, str):
            kwargs["metavar"] = metavar
        if f.type in ("int", int):  # rounds, seed
            kwargs["type"] = int
        p.add_argument(f"--{name.replace('_', '-')}", **kwargs)


def config_from_args(args: argparse.Namespace) -> FederatedRunConfig:
    values: dict[str, Any] = {}
    for dest, field_name in RUN_FLAGS.items():
        v = getattr(args, dest, None)
        if v is not None:
            values[field_name] = v
    values.update(parse_set_options(args.set))
    if args.config:
        return FederatedRunConfig.from_yaml(args.config, overrides=values)
    return FederatedRunConfig.from_dict(values, source="command line")


def cmd_run(args: argparse.Namespace) -> int:
    # lazy: keeps rich out of this module's import
    from rich.console import Console
    from rich.table import Table

    from fedtune.runtime.driver import run  # lazy: keeps fedtune.runtime.driver out of the CLI's start

    cfg = config_from_args(args)
    console = Console()
    result = run(cfg, progress=not args.no_progress, verbose=args.verbose)
    last = result.rows[-1] if result.rows else {}
    def val(row: dict) -> float:
        v = row.get("val_acc")
        return v if isinstance(v, float) and v == v else -1.0

    validated = [row for row in result.rows if val(row) >= 0]
    best = max(validated, key=val, default={})
    table = Table(title=f"{cfg.algorithm} on {cfg.dataset} — {result.status}")
    for col in ("", "round", "train_loss", "val_acc", "target_acc"):
        table.add_column(col)
    for label, row in (("last round", last), ("best val round", best)):
        if row:
            table.add_row(label, str(row["round"]), f"{row['train_loss']:.4f}",
                          f"{row.get('val_acc', float('nan')):.4f}", f"{row.get('target_acc', float('nan')):.4f}")
    console.print(table)
    if result.rows and not validated:  # no row selected by a validation accuracy that does not exist
        evaluated = any(isinstance(r.get("target_acc"), float) and r["target_acc"] == r["target_acc"]
                        for r in result.rows)
        if cfg.split_scheme is not None and evaluated:  # WILDS' CelebA, officially: train, val, test only
            why = (f"split_scheme {cfg.split_scheme!r} has no ID validation rows (id_val), which val_acc is measured "
                   "on; its OOD validation rows (val) are ood_val_acc")
        else:
            why = "val_fraction=0: no source validation split" if not cfg.val_fraction > 0 else "no round was evaluated"
        console.print(f"no best-validation round: no round has a val_acc ({why})")
    if result.time_to_first_round_s is not None:
        i = result.info
        phases = (f" (Ray up at {i.get('ray_init_s', 0):.1f}s, actors ready at {i.get('actors_ready_s', 0):.1f}s)"
                  if cfg.backend == "ray" else "")
        console.print(f"time to the end of round 1: {result.time_to_first_round_s:.1f}s{phases}; "
                      f"client actors: {i.get('num_workers')}"
                      f"{', clients roaming' if i.get('client_placement') == 'roaming' else ''}; "
                      f"model parameters: {i.get('num_params')}")
    if result.error:
        console.print(f"[yellow]{result.status}: {result.error}[/yellow]")
    # Plain print: paths must never be wrapped (scripts and copy-paste read them).
    print(f"results: {result.rounds_path}")
    print(f"trials:  {StudyDir(result.study_dir).trials}")
    return 0 if result.status == status.COMPLETED else 3


def cmd_partition(args: argparse.Namespace) -> int:
    """``fedtune partition``: the plan ``fedtune run`` would train on, as client x domain counts."""
    from fedtune.runtime.driver import build_plan  # lazy: keeps fedtune.runtime.driver out of the CLI's start

    cfg = config_from_args(args)
    plan = build_plan(cfg)
    if args.json:
        print(json.dumps(partition_json(plan, cfg.dataset, cfg.domain_homogeneity)))
    else:
        print("\n".join(partition_lines(plan, cfg.dataset, cfg.domain_homogeneity)))
    return 0


def cmd_datasets() -> int:
    # lazy: keeps rich out of this module's import
    from rich.console import Console
    from rich.table import Table

    table = Table(title="datasets (fedtune run --dataset NAME [--data-root DIR])")
    table.add_column("name")
    table.add_column("needs --data-root")
    table.add_column("description")
    for d in list_datasets():
        table.add_row(d.name, "yes" if d.needs_root else "no (embedded)", d.description)
    Console().print(table)
    return 0


def cmd_algorithms() -> int:
    # lazy: keeps rich out of this module's import
    from rich.console import Console
    from rich.table import Table

    console = Console()
    table = Table(title="algorithms (--algorithm NAME)")
    for col in ("name", "client method", "server rule", "settings", "description"):
        table.add_column(col)
    for p in PRESETS.values():
        settings = ", ".join(p.settings)
        client = p.client_method
        if p.unsupervised_client_method:
            settings += ", ufdg"
            client += f" (ufdg: {p.unsupervised_client_method})"
        table.add_row(p.name, client, p.server_rule, settings, p.description)
    console.print(table)
    for title, registry, field_name in (("client methods", CLIENT_METHODS, "client_method"),
                                        ("server rules", SERVER_RULES, "server_rule")):
        t = Table(title=f"{title} (--set {field_name}=NAME composes with any algorithm)")
        t.add_column("name")
        t.add_column("hyperparameters")
        t.add_column("description")
        for comp in registry.specs():
            t.add_row(comp.name, ", ".join(f"{h.name}={h.default}" for h in comp.hparams) or "-", comp.description)
        console.print(t)
    return 0


def cmd_fields() -> int:
    # lazy: keeps rich out of this module's import
    from rich.console import Console
    from rich.table import Table

    console = Console()
    console.print("config fields (YAML keys and --set KEY=VALUE), by group")
    rows = {name: (default, help_) for name, default, help_ in describe_fields()}
    for group, names in ROLES.groups.items():  # each field's declared group (fedtune.config_roles)
        table = Table(title=GROUPS[group], title_justify="left")
        for col in ("field", "default", "meaning"):
            table.add_column(col)
        for name in names:
            table.add_row(name, *rows[name])
        console.print(table)
    return 0


# ------------------------------------------------------------------------------------------------
# fedtune sweep (the study itself: fedtune.tune.study.sweep)
def cmd_report(args: argparse.Namespace) -> int:
    from fedtune.reports.report import make_report  # lazy: keeps pyarrow, pandas out of this module's import

    report = make_report(args.study_dir, selection=args.selection, plots=not args.no_plots)
    report.print()
    # Plain print: paths must never be wrapped (scripts and copy-paste read them).
    print(f"report: {report.markdown_path}")
    for path in report.plots.values():
        print(f"plot:   {path}")
    return 0


def main(argv: list[str] | None = None) -> int:
    # lazy: keeps pyarrow, fedtune.runtime.pools out of the CLI's start
    from fedtune.results.arrow import CorruptResultsError
    from fedtune.runtime.pools import ClientFailure

    args = build_parser().parse_args(argv)
    try:
        # SIGTERM (kill, a scheduler's stop) ends a command like Ctrl-C: recorded as interrupted, exit 130.
        with sigterm_as_interrupt():
            if getattr(args, "plugins", None):  # before anything reads a registry

                load_plugins(args.plugins, source="--plugin")
            if args.command == "run":
                return cmd_run(args)
            if args.command == "partition":
                return cmd_partition(args)
            if args.command == "datasets":
                return cmd_datasets()
            if args.command == "algorithms":
                return cmd_algorithms()
            if args.command == "fields":
                return cmd_fields()
            if args.command == "spaces":
                from fedtune.spaces.show import show_space  # lazy: keeps fedtune.spaces.show out of the CLI's start

                return show_space(args.space, as_yaml=args.yaml)
            if args.command == "sweep":
                return cmd_sweep(args)
            if args.command == "report":
                return cmd_report(args)
            if args.command == "check":
                return cmd_check(args)
    except (ConfigError, DataError, ResourceError, ClientFailure, CorruptResultsError) as exc:
        print(f"fedtune: error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("fedtune: interrupted; finished rounds are in the results store", file=sys.stderr)
        return 130
    return 1


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
