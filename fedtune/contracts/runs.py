"""Contracts a component keeps when it runs, each checked on tiny runs (:mod:`fedtune.contracts.tiny`):

* **finite first step**: 4 rounds of its form, each status ok with a finite training loss;
* **determinism**: the same config twice gives identical rows (every loss, accuracy and diagnostic);
* **checkpoint and resume**: 2 rounds, a checkpoint written to disk and read back into a fresh run,
  then 2 rounds, equal 4 straight rounds; where the state carries something beyond the weights
  (clients' ``ctx.state``, a server side, the rule's or the server optimiser's state), dropping it
  changes the continuation (it is what makes the run continue);
* **keeps_client_state** (a client method): over 4 rounds of half the clients every client trains;
  those that keep ``ctx.state`` are all of them when the method declares ``keeps_client_state``
  and none when it does not (the declaration decides whether a client may roam between actors);
* **ray = local**: the Ray backend with 1 and 2 client actors gives the local backend's rounds bit
  for bit, a client that keeps state staying with its owner (:func:`ray_for_checks` starts a Ray of
  its own when none is connected: 2 CPUs, no dashboard, shut down afterwards).
"""

from __future__ import annotations

import contextlib
import logging
import math
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from fedtune.algorithms import CLIENT_METHODS
from fedtune.contracts.result import (CLIENT_STATE, DETERMINISM, FIRST_STEP, RAY, RESUME, CheckResult, exception_line,
                                      failed, passed, skipped)
from fedtune.contracts.tiny import ROUNDS, Form, carried, first_difference, preferred_setting, rounds, tiny_config
from fedtune.data.partition import sample_participants
from fedtune.plugins import plugin_runtime_env
from fedtune.runtime.checkpoint import read_checkpoint, write_checkpoint
from fedtune.runtime.driver import FederatedRun
from fedtune.runtime.placement import keeps_client_state

if TYPE_CHECKING:
    from fedtune.config import FederatedRunConfig

__all__ = ["check_form_runs", "check_client_state", "check_ray", "ray_for_checks", "FIX_DETERMINISM", "FIX_RESUME"]

FIX_FIRST_STEP = "keep its loss and step finite on a tiny MLP (2 local steps of 8 examples, local_lr 0.05)"
FIX_DETERMINISM = ("draw randomness only from torch's global generator (fedtune seeds it for each client and round) "
                   "or from a generator seeded from the run's seed; never NumPy's or Python's global RNG or the clock")
FIX_RESUME = ("return everything it keeps between rounds from state_dict() and restore it in load_state_dict() "
              "(a client method: in ctx.state)")


def _rows(results: list[Any]) -> list[dict]:
    return [r.metrics for r in results]


def _first_step(who: str, results: list[Any]) -> CheckResult:
    for r in results:
        loss = r.metrics.get("train_loss")
        if r.status != "ok" or not isinstance(loss, float) or not math.isfinite(loss):
            return failed(who, FIRST_STEP, f"round {r.round} is {r.status} with train_loss {loss!r}", FIX_FIRST_STEP)
    return passed(who, FIRST_STEP, f"{len(results)} rounds ok, finite losses")


def check_form_runs(form: Form, out: str | Path | None = None, *,
                    keep: dict[Form, dict[str, Any]] | None = None) -> list[CheckResult]:
    """Finite first step, determinism, checkpoint and resume of ``form`` (module docstring); ``keep``
    receives the checkpoint read back from disk (``keep[form]``)."""
    who = f"algorithm {form.id}"
    with tempfile.TemporaryDirectory(prefix="fedtune-check-") as tmp:
        directory = Path(out or tmp)
        try:
            cfg = form.config(directory)
            with FederatedRun(cfg) as fr:
                straight = rounds(fr, ROUNDS)
        except Exception as exc:  # noqa: BLE001 - a run that fails is the finding
            return [failed(who, FIRST_STEP, f"a tiny run raises {exception_line(exc)}",
                           "fix the error where it was raised (the file and line above)"),
                    skipped(who, DETERMINISM, "the run fails"), skipped(who, RESUME, "the run fails")]
        first = _first_step(who, straight)
        if not first.passed:
            return [first, skipped(who, DETERMINISM, "the run does not train"),
                    skipped(who, RESUME, "the run does not train")]
        try:
            with FederatedRun(cfg) as fr:
                again = rounds(fr, 2)
                write_checkpoint(directory / "ckpt", fr.get_state())  # what a killed trial leaves on disk
                again += rounds(fr, ROUNDS - 2)
        except Exception as exc:  # noqa: BLE001
            return [first, failed(who, DETERMINISM, f"a second run with a checkpoint after round 2 raises "
                                                    f"{exception_line(exc)}", FIX_RESUME),
                    skipped(who, RESUME, "no checkpoint")]
        difference = first_difference(_rows(straight), _rows(again))
        if difference:
            return [first, failed(who, DETERMINISM, f"two runs of the same config differ at {difference}",
                                  FIX_DETERMINISM), skipped(who, RESUME, "the runs are not deterministic")]
        same = passed(who, DETERMINISM, f"two runs of {ROUNDS} rounds give identical rows")
        return [first, same, _resume(who, form, cfg, directory / "ckpt", straight, keep)]


def _resume(who: str, form: Form, cfg: FederatedRunConfig, ckpt: Path, straight: list[Any],
            keep: dict[Form, dict[str, Any]] | None) -> CheckResult:
    try:
        state = read_checkpoint(ckpt)
        if keep is not None:
            keep[form] = state
        if np.asarray(state["weights"]).dtype != np.float32:
            return failed(who, RESUME, f"its checkpoint holds {np.asarray(state['weights']).dtype} weights",
                          "keep the global weights float32")
        has_side = CLIENT_METHODS.spec(form.client_method).server_side is not None
        if (state["side"] is not None) != has_side:
            return failed(who, RESUME, f"its checkpoint {'holds' if state['side'] is not None else 'lacks'} a "
                                       "client-method server side", "declare server_side exactly")
        with FederatedRun(cfg) as fr:
            fresh = fr.get_state()  # what a new run starts from
            fr.set_state(state)
            resumed = rounds(fr, ROUNDS - 2)
        difference = first_difference(_rows(straight[2:]), _rows(resumed), first_round=3)
        if difference:
            return failed(who, RESUME, f"resumed from the round-2 checkpoint, {difference} (straight vs resumed)",
                          FIX_RESUME)
        parts = carried(state)
        if parts:  # the state is what makes it continue: the weights alone do not
            with FederatedRun(cfg) as fr:
                fr.set_state({**state, "clients": {}, "side": fresh["side"], "rule": fresh["rule"],
                              "optimizer": fresh["optimizer"]})
                weights_only = rounds(fr, ROUNDS - 2)
            if not first_difference(_rows(straight[2:]), _rows(weights_only)):
                return failed(who, RESUME, f"its checkpoint carries {', '.join(parts)}, yet the weights alone "
                                           "continue the same", "keep in its state only what the next rounds read")
    except Exception as exc:  # noqa: BLE001 - a checkpoint that fails is the finding
        return failed(who, RESUME, f"checkpoint and resume raises {exception_line(exc)}", FIX_RESUME)
    carries = f" (it carries {', '.join(parts)})" if parts else ""
    return passed(who, RESUME, f"2 + 2 rounds through a checkpoint on disk equal {ROUNDS} straight rounds{carries}")


def check_client_state(client: str, out: str | Path | None = None,
                       params: dict[str, Any] | None = None) -> CheckResult:
    """A client keeps ``ctx.state`` exactly when ``client`` declares ``keeps_client_state`` (under
    ``params``): 4 rounds of FedAvg, half the clients each round, every client trains."""
    who = f"client method {client}" + "".join(f" ({k}={v})" for k, v in (params or {}).items())
    setting = preferred_setting("fedavg", client, "fedavg")
    if setting is None:
        return skipped(who, CLIENT_STATE, "runs in no setting under fedavg")
    with tempfile.TemporaryDirectory(prefix="fedtune-check-") as tmp:
        try:
            cfg = tiny_config(out or tmp, "fedavg", setting, client_method=client, rounds=ROUNDS, params=params or {})
            with FederatedRun(cfg) as fr:
                trained: set[int] = set()
                for r in range(1, ROUNDS + 1):
                    fr.step()
                    trained |= set(sample_participants(fr.plan.num_clients, cfg.participation, cfg.seed, r).tolist())
                kept = sorted(cid for cid, state in fr.get_state()["clients"].items() if state)
                everyone = fr.plan.num_clients
        except Exception as exc:  # noqa: BLE001 - a run that fails is the finding
            return failed(who, CLIENT_STATE, f"a tiny run raises {exception_line(exc)}",
                          "fix the error where it was raised (the file and line above)")
    if trained != set(range(everyone)):  # pragma: no cover - the tiny run's sampling, not the component
        return failed(who, CLIENT_STATE, f"the tiny run trained clients {sorted(trained)} only", "report this")
    if keeps_client_state(cfg):
        if kept != sorted(trained):
            return failed(who, CLIENT_STATE, f"declares keeps_client_state, but clients {kept} of {sorted(trained)} "
                                             "kept ctx.state", "declare keeps_client_state=False (or a function of "
                                                               "the config that is False where it keeps none)")
        return passed(who, CLIENT_STATE, "declared, and every client keeps ctx.state")
    if kept:
        return failed(who, CLIENT_STATE, f"declares keeps_client_state=False, but clients {kept} kept ctx.state "
                                         "between rounds", "declare keeps_client_state=True in its ClientMethodSpec "
                                                           "(so its clients never roam between actors)")
    return passed(who, CLIENT_STATE, "not declared, and no client keeps ctx.state")


@contextlib.contextmanager
def ray_for_checks(num_cpus: int = 2) -> Iterator[None]:
    """A connected Ray for :func:`check_ray`: the one this process has, else a new local one
    (``num_cpus`` CPUs, no dashboard, the plugins shipped as ``runtime_env``), shut down on exit."""
    import ray  # lazy: keeps ray out of this module's import

    if ray.is_initialized():
        yield
        return

    ray.init(address="local", num_cpus=num_cpus, include_dashboard=False, log_to_driver=False,
             logging_level=logging.WARNING, runtime_env=plugin_runtime_env())
    try:
        yield
    finally:
        ray.shutdown()


def check_ray(form: Form, out: str | Path | None = None, *, runs: dict[int, FederatedRun] | None = None,
              n: int = 3) -> CheckResult:
    """``n`` rounds on the Ray backend with 1 and 2 client actors equal the local backend's; a client
    that keeps state stays with its owner. ``runs`` (actor count -> a started run) are re-configured
    in place for the next form (no actor restarts); without it, runs of its own, closed after."""
    who = f"algorithm {form.id}"
    own = runs is None
    runs = {} if runs is None else runs
    with tempfile.TemporaryDirectory(prefix="fedtune-check-") as tmp, ray_for_checks():
        try:
            with FederatedRun(form.config(out or tmp, rounds=n, name="local")) as fr:
                expected = _rows(rounds(fr, n))
            for actors in (1, 2):
                problem = _on_ray(form, Path(out or tmp), runs, actors, expected, n)
                if problem is not None:
                    return failed(who, RAY, problem, "keep every draw and sum independent of the process it runs "
                                                     "in (" + FIX_DETERMINISM.split("; ")[0] + ")")
        except Exception as exc:  # noqa: BLE001 - a run that fails is the finding
            return failed(who, RAY, f"a tiny Ray run raises {exception_line(exc)}",
                          "fix the error where it was raised; a module Ray's workers cannot import: make it a file "
                          "or an installed module")
        finally:
            if own:
                for fr in runs.values():
                    fr.close()
    return passed(who, RAY, f"{n} rounds with 1 and 2 client actors equal the local backend's")


def _on_ray(form: Form, out: Path, runs: dict[int, FederatedRun], actors: int, expected: list[dict],
            n: int) -> str | None:
    cfg = form.config(out, rounds=n, backend="ray", client_cpus=0.5, max_client_actors=actors, name=f"ray{actors}")
    fr = runs.get(actors)
    if fr is None:
        fr = runs[actors] = FederatedRun(cfg)
        fr.start()
    else:
        fr.reconfigure(cfg)  # what Tune's reuse_actors does: the same rounds as a fresh run
    if len(fr.client_handles()) != actors:
        return f"{len(fr.client_handles())} client actors run where {actors} were asked for"
    # two actors and sampled clients: a method without per-client state roams (each round's clients
    # dealt out afresh, fedtune.runtime.placement), one with it stays with its owners
    roaming = actors == 2 and not keeps_client_state(cfg)
    placement = fr.describe()["client_placement"]
    if placement != ("roaming" if roaming else "fixed"):
        return f"with {actors} actors its clients are {placement}, not {'roaming' if roaming else 'fixed'}"
    difference = first_difference(expected, _rows(rounds(fr, n)))
    return None if not difference else f"with {actors} client actor(s), {difference} (local vs ray)"
