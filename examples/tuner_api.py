"""Ray Tune's own API on fedtune: ``ray.tune.Tuner`` + ``fedtune.fedtune_trainable()`` + ``fedtune.ArrowCallback``.

You own Tune's configuration (``TuneConfig``: searcher, scheduler, samples, concurrency, actor
reuse; ``RunConfig``: storage, checkpoints, failures); fedtune gives the trainable (one
federated run per trial, one round per step, each trial in its own placement group), the
search space of an algorithm and the callback that writes every round and every trial to the
Arrow store, exactly as ``fedtune run`` does.

    python examples/tuner_api.py                        # 4 FedOMG trials on rotated-digits, ~1 minute on 2 cores
    python examples/tuner_api.py --algorithm fedavg --num-samples 8 --output /tmp/fedtune-results
    python examples/tuner_api.py --logger csv --logger mlflow   # also Tune's CSV / MLflow loggers

Results: ``OUTPUT/STUDY/rounds/<trial_id>.parquet`` and ``OUTPUT/STUDY/trials.parquet`` (read them
with ``fedtune.load``); Tune's own files (checkpoints, logs, ``--logger csv|tensorboard``)
under ``OUTPUT/.tune/STUDY``; ``--logger mlflow``: ``OUTPUT/STUDY/mlflow.db`` (or ``$MLFLOW_TRACKING_URI``).
"""

from __future__ import annotations

import argparse
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from ray import tune

import fedtune
from fedtune.tune.trial.loggers import logger_callbacks

# What every trial shares (any FederatedRunConfig field): the budget, and the resources. One client actor
# of 1 CPU per trial (its 5 clients train in turn), so two trials run side by side on 2 cores.
# A small MLP keeps the example at about a minute; drop "model" for the dataset's CNN.
BASE: dict[str, Any] = {
    "dataset": "rotated-digits", "model": "mlp", "mlp_hidden": [128], "rounds": 4, "local_steps": 10,
    "batch_size": 32, "client_cpus": 1, "max_client_actors": 1, "checkpoint_every": 2,
}


def main(output: str = "fedtune_results", study: str = "tuner-api", algorithm: str = "fedomg", *,
         num_samples: int = 4, max_concurrent_trials: int = 2, reuse_actors: bool = True,
         overrides: dict[str, Any] | None = None, scheduler: Any = None,
         storage_path: str | None = None, loggers: Sequence[str] = ()) -> tune.ResultGrid:
    """Tune ``algorithm``'s search space on :data:`BASE` (+ ``overrides``, which may hold Tune
    sampling objects such as ``tune.grid_search``) and return Tune's ``ResultGrid``.

    Trials are compared by source-validation accuracy (``val_acc``, the honest selection
    metric; never ``target_acc``). ``loggers``: any of ``csv``, ``tensorboard``, ``mlflow`` (Ray
    Tune's logger callbacks, each round once; :mod:`fedtune.tune.trial.loggers`)."""
    output = str(Path(output).resolve())
    param_space = {**fedtune.search_space(algorithm), **BASE, **(overrides or {})}
    tuner = tune.Tuner(
        fedtune.fedtune_trainable(),
        param_space=param_space,
        tune_config=tune.TuneConfig(metric="val_acc", mode="max", num_samples=num_samples, scheduler=scheduler,
                                    max_concurrent_trials=max_concurrent_trials, reuse_actors=reuse_actors),
        run_config=tune.RunConfig(
            name=study,
            storage_path=storage_path or str(Path(output) / ".tune"),
            # fedtune's subclasses of Tune's CSV/TensorBoard/MLflow loggers: Tune then adds no automatic
            # logger of the same kind, and a round a restarted trial reports again is logged once.
            callbacks=[fedtune.ArrowCallback(output, study),
                       *logger_callbacks(loggers, Path(output) / study, study, algorithm)],
            # Checkpoints every `checkpoint_every` rounds (BASE), none at the end: Tune's default for
            # class trainables would save every finished trial, whose results are in the store already.
            checkpoint_config=tune.CheckpointConfig(num_to_keep=2, checkpoint_at_end=False),
            failure_config=tune.FailureConfig(max_failures=1),  # a crashed trial resumes from its checkpoint
            verbose=0,
        ),
    )
    return tuner.fit()


def _cli() -> None:
    import ray

    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--output", default="fedtune_results")
    ap.add_argument("--study", default="tuner-api")
    ap.add_argument("--algorithm", default="fedomg")
    ap.add_argument("--num-samples", type=int, default=4)
    ap.add_argument("--max-concurrent", type=int, default=2)
    ap.add_argument("--logger", action="append", default=[], choices=["csv", "tensorboard", "mlflow"])
    args = ap.parse_args()
    ray.init(include_dashboard=False, log_to_driver=False)  # the example's own Ray; trials never call ray.init
    grid = main(args.output, args.study, args.algorithm, num_samples=args.num_samples,
                max_concurrent_trials=args.max_concurrent, loggers=args.logger)
    errors = [r.error for r in grid if r.error is not None]
    trials = fedtune.load(Path(args.output) / args.study, "trials").to_pandas()
    trials = trials.sort_values("best_val_acc", ascending=False)
    print(trials[["trial_id", "status", "rounds_done", "best_val_acc", "target_acc_at_best_val"]].to_string(index=False))
    print(f"{len(trials)} trials, {len(errors)} failed; best by source validation: {trials.iloc[0]['trial_id']}")


if __name__ == "__main__":
    _cli()
