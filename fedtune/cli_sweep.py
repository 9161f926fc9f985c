"""``fedtune sweep`` on the command line: its parser, its options from the parsed arguments
(``--config FILE.yaml`` as the base of every trial) and its handler. :mod:`fedtune.cli` builds the
``fedtune`` parser from it and dispatches ``sweep`` here."""

from __future__ import annotations

import copy
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

from fedtune.config import ROLES, FederatedRunConfig, parse_set_options, read_config_file
from fedtune.errors import ConfigError
from fedtune.results import status
from fedtune.results.optuna_url import shown
from fedtune.results.study_dir import StudyDir

if TYPE_CHECKING:
    from fedtune.tune.study.options import SweepOptions


def add_plugin_argument(p: Any) -> None:
    """``--plugin MODULE`` (repeatable) on a ``fedtune`` subcommand: components from outside fedtune
    (:mod:`fedtune.plugins`), imported before anything reads a registry."""
    p.add_argument("--plugin", action="append", dest="plugins", default=[], metavar="MODULE",
                   help="import a plugin first (repeatable): a module (pkg.mod), MODULE:NAME or a .py file that "
                        "registers your own client methods, server rules, optimisers or datasets (docs/extending.md)")


def _add_scheduler_options(p: Any) -> None:
    """``fedtune sweep``'s scheduler and its options: ASHA's rungs and multi-fidelity over clients
    along them, PBT's perturbation interval."""
    from fedtune.tune.study.options import SCHEDULERS  # lazy: keeps fedtune.tune.study.options out of the CLI's start

    p.add_argument("--scheduler", choices=SCHEDULERS, default=None,
                   help="fifo (all rounds; default), asha (early stop at rungs), hyperband (Optuna's HyperBand "
                        "pruner: brackets of successive halving, one trial at a time), pbt or pb2 (Ray Tune's "
                        "population-based training: --num-samples members exploit and explore every "
                        "--perturbation-interval rounds, each cloning a better member's whole federated state)")
    p.add_argument("--grace-period", type=int, default=None, metavar="N",
                   help="ASHA and HyperBand: rounds before a trial may stop (default 1; before the last round)")
    p.add_argument("--reduction-factor", type=float, default=None, metavar="F",
                   help="ASHA and HyperBand: rung reduction factor (default 2)")
    p.add_argument("--client-fidelity", type=float, default=None, metavar="P",
                   help="ASHA: multi-fidelity over clients as well as rounds: the first rung runs with participation "
                        "P, each later rung with reduction-factor times more (at most the trials' participation)")
    p.add_argument("--perturbation-interval", type=int, default=None, metavar="N",
                   help="PBT/PB2: exploit and explore every N rounds (default: a quarter of the rounds)")


def _add_resume_options(p: Any) -> None:
    """``--resume``, and ``--trust-study-files`` for a study whose Ray Tune state is not signed
    (:mod:`fedtune.tune.common.state_signatures`)."""
    p.add_argument("--resume", action="store_true", help="continue an interrupted study (its saved options)")
    p.add_argument("--trust-study-files", action="store_true",
                   help="with --resume: continue a study whose Ray Tune state (pickles, which run code when loaded) "
                        "your fedtune key did not sign, e.g. one from before fedtune signed it or one you were given; "
                        "only for a folder you trust (it is then signed with your key)")


def add_sweep_parser(sub: Any) -> Any:
    """Add ``fedtune sweep`` to the subcommands ``sub`` of the ``fedtune`` parser."""
    # lazy: keeps fedtune.tune.study.default_study, fedtune.tune.common.searches out of the CLI's start
    from fedtune.tune.study.default_study import DEFAULT_ALGORITHMS
    from fedtune.tune.common.searches import SAMPLERS
    from fedtune.tune.study.options import SELECTIONS

    p = sub.add_parser(
        "sweep", help="hyperparameter study: Ray Tune + Optuna over search spaces, with resume and seeds",
        description="Search each algorithm's hyperparameters (its space derived from the declarations, "
                    "search_spaces/<algorithm>.yaml or SPACE files overriding it; `fedtune spaces show NAME`) with "
                    "Ray Tune + Optuna; every round goes to OUTPUT/STUDY/. Without arguments: a small default "
                    "study on rotated-digits comparing " + ", ".join(DEFAULT_ALGORITHMS) + ".")
    p.add_argument("spaces", nargs="*", metavar="SPACE.yaml", help="search-space files (one per algorithm)")
    add_plugin_argument(p)
    p.add_argument("--algorithm", action="append", dest="algorithms", default=[], metavar="NAME",
                   help="algorithm to search (repeatable); default: the SPACE files' algorithms, else fedavg")
    p.add_argument("--dataset", help="dataset (see `fedtune datasets`); default rotated-digits (embedded)")
    p.add_argument("--data-root", metavar="DIR", help="directory holding the dataset's files")
    p.add_argument("--target-domain", metavar="NAME|all",
                   help="held-out target domain; 'all': leave-one-domain-out, one search per target domain")
    p.add_argument("--rounds", type=int, metavar="N", help="federated rounds per trial")
    p.add_argument("--num-samples", type=int, default=None, metavar="N",
                   help="trials per search (default 8; the default study: 4)")
    p.add_argument("--seeds", type=int, default=None, metavar="K",
                   help="re-run each search's selected configuration with K seeds (mean ± standard error over the "
                        "re-runs; excludes selection variance: see --trial-seeds)")
    p.add_argument("--max-concurrent", type=int, metavar="N", help="trials at once (default: as many as fit)")
    p.add_argument("--sampler", choices=SAMPLERS, default=None,
                   help="Optuna sampler (seeded; nsga2: multi-objective; gp: Gaussian-process BO; qmc: "
                        "scrambled Sobol points); default tpe")
    p.add_argument("--metric", metavar="NAME[,NAME]",
                   help="objective metric(s), first = selection metric (its protocol: val_acc/val_loss -> val, "
                        "target_val_acc/target_val_loss -> target-val, ood_val_acc/ood_val_loss -> ood-val, "
                        "val_macro_f1 -> val-f1, ood_val_macro_f1 -> ood-val-f1, "
                        "oracle_acc/oracle_loss -> oracle); default the protocol's accuracy, with nsga2 also server_s")
    p.add_argument("--selection", choices=SELECTIONS, default=None,
                   help="val (default): by source validation (honest); target-val (fda only): by the target "
                        "client's held-out labels; ood-val (split_scheme): by the split file's OOD validation "
                        "domain; val-f1 / ood-val-f1 (split_scheme): by macro-F1 instead of accuracy; oracle: by a "
                        "held-out slice of the target domain, last round "
                        "(DomainBed's test-domain validation; labelled oracle)")
    p.add_argument("--trial-seeds", type=int, default=None, metavar="K",
                   help="repeat every search K times with other seeds, data seeds and sampler seeds; the report's "
                        "± is then over the K searches (includes selection variance)")
    _add_scheduler_options(p)
    p.add_argument("--knobs", choices=("all", "own"), default=None,
                   help="all (default): search every parameter of each space; own: only each algorithm's own knobs "
                        "(`fedtune algorithms` lists them), every shared one (local_lr, momentum, ...) fixed at one "
                        "value for every method (the default study: own)")
    p.add_argument("--sampler-seed", type=int, default=None, metavar="S", help="seed of the Optuna sampler (default 0; 0 to 2**32-1)")
    p.add_argument("--address", metavar="ADDR", help="Ray cluster to join ('auto' for the running one)")
    p.add_argument("--max-failures", type=int, default=None, metavar="N",
                   help="restart a failed trial up to N times (-1: no limit), from its last checkpoint "
                        "(--set checkpoint_every=K), e.g. after its node was preempted; default 0")
    p.add_argument("--storage-path", metavar="DIR|URI",
                   help="Ray Tune's storage for experiment state and trial checkpoints, reachable from every node: "
                        "a shared directory or a URI (s3://bucket/dir, gs://...); default OUTPUT/STUDY/tune")
    p.add_argument("--scale-up-timeout", type=float, default=None, metavar="SECONDS",
                   help="how long trials may wait for the autoscaler to add nodes before the study stops "
                        "(default 900)")
    p.add_argument("--optuna-storage", metavar="URL",
                   help="keep the Optuna studies in this shared storage instead of OUTPUT/STUDY/optuna.db: a "
                        "database URL (sqlite:///PATH, postgresql://USER@HOST/DB, mysql+pymysql://...) or "
                        "journal:///ABSOLUTE/PATH.log (Optuna's journal file, fine on NFS)")
    p.add_argument("--output", metavar="DIR", default="fedtune_results", help="results directory")
    p.add_argument("--name", metavar="STUDY", help="study name (default sweep-<UTC time>; --resume: the latest)")
    _add_resume_options(p)
    p.add_argument("--no-report", action="store_true", help="do not write report.md and plots at the end")
    p.add_argument("--verbose", action="store_true", help="Ray Tune's own tables and logs instead of the live view")
    p.add_argument("--set", action="append", default=[], metavar="FIELD=VALUE",
                   help="set a run field for every trial, e.g. --set local_steps=2 (see `fedtune fields`)")
    p.add_argument("--config", metavar="FILE.yaml",
                   help="YAML mapping of run fields (as for fedtune run), the base of every trial; "
                        "precedence: --config FILE < flags < --set")
    p.add_argument("--logger", action="append", dest="loggers", default=[], metavar="csv|tensorboard|mlflow|wandb",
                   help="also log every round with Ray Tune's logger callback (repeatable): csv and tensorboard "
                        "into each trial's folder under OUTPUT/STUDY/tune/, mlflow to OUTPUT/STUDY/mlflow.db "
                        "(or $MLFLOW_TRACKING_URI), wandb to one W&B project per study, offline into "
                        "OUTPUT/STUDY/wandb/ (upload later with `wandb sync`) unless WANDB_API_KEY or WANDB_MODE is set")
    return p


def options_from_args(args: Any) -> SweepOptions:
    """:class:`~fedtune.tune.study.options.SweepOptions` from parsed ``fedtune sweep`` arguments."""
    from fedtune.tune.study.options import SweepOptions  # lazy: keeps fedtune.tune.study.options out of the CLI's start

    metric = None
    if args.metric:
        metric = [m.strip() for m in str(args.metric).split(",") if m.strip()]
    def given(name: str) -> Any:  # the flag's value, else SweepOptions' default
        value = getattr(args, name)
        return getattr(SweepOptions, name) if value is None else value

    opts = SweepOptions(
        spaces=list(args.spaces), algorithms=list(args.algorithms), dataset=args.dataset, data_root=args.data_root,
        target_domain=args.target_domain, rounds=args.rounds, num_samples=given("num_samples"),
        seeds=given("seeds"), max_concurrent=args.max_concurrent, scheduler=given("scheduler"),
        sampler=given("sampler"), metric=metric, selection=args.selection, trial_seeds=given("trial_seeds"),
        address=args.address, output=args.output, name=args.name,
        verbose=args.verbose, overrides=parse_set_options(args.set), sampler_seed=given("sampler_seed"),
        grace_period=given("grace_period"), reduction_factor=given("reduction_factor"), report=not args.no_report,
        client_fidelity=args.client_fidelity, perturbation_interval=args.perturbation_interval,
        knobs=given("knobs"))
    opts.loggers = tuple(args.loggers)
    opts.optuna_storage = args.optuna_storage
    if args.max_failures is not None:
        opts.max_failures = args.max_failures
    opts.storage_path = args.storage_path
    if args.scale_up_timeout is not None:
        opts.scale_up_timeout_s = args.scale_up_timeout
    if args.config:
        opts = with_config_file(opts, args.config)
    if getattr(args, "trust_study_files", False) and not args.resume:
        raise ConfigError("--trust-study-files only applies with --resume (a new study's files are its own)")
    if args.resume:
        # lazy: keeps fedtune.tune.study.resume out of the CLI's start
        from fedtune.tune.study.resume import RESUME_FIXED, check_resume_flags

        check_resume_flags({k: getattr(args, k, None) for k in RESUME_FIXED}, opts)
    else:  # a scheduler option given with a scheduler that does not read it, even at its default value
        opts.check_scheduler_options(given=[k for k in ("grace_period", "reduction_factor", "perturbation_interval")
                                            if getattr(args, k) is not None])
    return opts


def with_config_file(opts: SweepOptions, path: str) -> SweepOptions:
    """``opts`` with ``fedtune sweep --config FILE.yaml`` applied: the file is read and checked by
    ``fedtune run --config``'s loader (:func:`~fedtune.config.read_config_file`, then
    :meth:`FederatedRunConfig.from_dict`: YAML errors, unknown fields and bad values name the file);
    the run fields a resume keeps as sweep options (declared ``sweep_option`` and ``resume_fixed``:
    ``algorithm``, ``dataset``, ``data_root``, ``target_domain``, ``rounds``) fill those options
    unless the flag (or a SPACE file, for the algorithm) is given; every other field becomes
    ``opts.config_fields``, the base of every trial, which ``--set`` overrides. The other sweep
    options' fields (``output``, ``name``, ``address``) say where a study goes and are refused: use
    the flags."""
    read = read_config_file(path)
    try:
        cfg = FederatedRunConfig.from_dict(dict(read), source=str(path))
    except ConfigError as exc:  # value errors of the loader name the field, not always the file
        if str(path) in str(exc):
            raise
        raise ConfigError(f"config file '{path}': {exc}") from None
    for key in ROLES.study_place:
        if key in read:
            raise ConfigError(f"config file '{path}': field '{key}' is not allowed in fedtune sweep --config "
                              f"(it says where the study goes); use the option --{key} instead")
    out = copy.deepcopy(opts)
    for key in ROLES.resume_fixed:
        if key not in read:
            continue
        read.pop(key)
        value = getattr(cfg, key)  # as the loader coerced it (target_domain: 30 -> "30")
        if key == "algorithm":
            if not out.algorithms and not out.spaces:
                out.algorithms = [value]
        elif getattr(out, ROLES.sweep_options[key]) is None:
            setattr(out, ROLES.sweep_options[key], value)
    out.config, out.config_fields = str(path), read
    return out


def cmd_sweep(args: Any) -> int:
    """``fedtune sweep``: run the study, print the results table and the paths."""
    from rich.console import Console  # lazy: keeps rich out of this module's import

    # lazy: keeps fedtune.reports.importances out of the CLI's start
    from fedtune.reports.importances import study_optuna_url
    # lazy: keeps pyarrow, fedtune.tune.study.sweep out of the CLI's start
    from fedtune.tune.study.sweep import StudyInterrupted, run_sweep

    console = Console()
    opts = options_from_args(args)
    try:
        result = run_sweep(opts, resume=args.resume, console=console,
                           trust_study_files=getattr(args, "trust_study_files", False))
    except StudyInterrupted as exc:
        print(f"fedtune: {exc}", file=sys.stderr)
        return 130
    except KeyboardInterrupt:  # while the study was being planned (run_sweep turns later ones into StudyInterrupted)
        print("fedtune: interrupted before the study started; nothing ran", file=sys.stderr)
        return 130
    if result.report is not None:
        result.report.print(console)
    study = StudyDir(result.study_dir)
    print(f"study:   {result.study_dir}")
    print(f"rounds:  {study.rounds_dir}")
    print(f"trials:  {study.trials}")
    print(f"optuna:  {shown(study_optuna_url(result.study_dir))} (studies {result.name}/...)")
    if result.report_path is not None:
        print(f"report:  {result.report_path}")
    print(f"elapsed: {result.elapsed_s:.0f}s")
    if not _any_completed(result.study_dir):
        print("fedtune: no trial of the study completed (see the status and error columns of trials.parquet)",
              file=sys.stderr)
        return 3
    return 0


def _any_completed(study_dir: Path) -> bool:
    from fedtune.results.store import load  # lazy: keeps pyarrow, fedtune.results.store out of the CLI's start

    if not StudyDir(study_dir).trials.is_file():
        return False
    return status.COMPLETED in set(load(study_dir, "trials").column("status").to_pylist())


# ------------------------------------------------------------------------------------------------
