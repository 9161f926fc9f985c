"""The server side of a client method: state the coordinator keeps for the method, whatever
the server rule is.

Some client methods need the server to keep something between rounds and send it back with the
weights: Scaffold's server control variate ``c``, FedDyn's ``h``, FedIIR's running mean gradient
of the classifier, Fishr's mean gradient variance. That belongs to the client method, not to the
server rule (FedIIR + OMG runs FedIIR's clients under FedOMG's rule), so it lives in a
:class:`ServerSide` registered under the client method's name in
:data:`fedtune.algorithms.SERVER_SIDES`. The coordinator builds it beside the server rule and,
each round:

1. merges :meth:`ServerSide.payload` into the broadcast payload (keys must not clash with the
   server rule's payload);
2. after the server rule's ``aggregate``, lets :meth:`ServerSide.proposal` replace the rule's
   result the server optimiser steps from (FedDyn's ``feddyn_mean: uniform``; everyone else keeps
   the rule's), and after the server optimiser's step calls :meth:`ServerSide.update` with the old
   and new parameters, the updates, the weights and the clients' extras: the side updates its
   state from the extras and returns the parameters the round ends with (unchanged for every
   method but FedDyn, whose server model is the mean of the clients' models minus ``h/α``).
3. when :meth:`ServerSide.wants_probe`, after the new model is published: calls the round's
   participants again at it (their client method's ``probe``) and hands their arrays to
   :meth:`ServerSide.after_probe` (AFL's domain losses at the aggregated model).

A side whose round needs only weighted sums of the updates or of one extra (FedDyn's ``Σ Δ_u``,
Scaffold's mean ``Δc_i``) declares them (:meth:`ServerSide.streamed_sums`); with a server rule
that streams too (FedAvg), the coordinator adds each client's rows as they arrive and calls
:meth:`ServerSide.streamed_proposal` / :meth:`ServerSide.streamed_update` with the sums: the
round never holds its ``[U, M]`` updates or extras, and the bits are the whole-matrix path's.

Server sides are NumPy only, like server rules: the coordinator never imports torch. Their
state is in the coordinator's checkpoint (:meth:`ServerSide.state_dict`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar

import numpy as np

from fedtune.algorithms import SERVER_SIDES
from fedtune.algorithms.base import RunConfig
from fedtune.algorithms.server.rule import AggregateResult, RoundInfo


@dataclass(frozen=True)
class StreamedSum:
    """A float64 sum the coordinator makes as the clients' replies arrive:
    ``Σ_u weight · row_u`` over the participants, ascending client id
    (:class:`~fedtune.algorithms.server.blocked.RowSum`), ``row_u`` the update ``θ_u − θ``
    (``source="update"``) or the client's extra ``source`` (its float32 copy, as the whole-matrix
    path stacks it). ``mean``: the weight is ``1/U`` of the ``U`` sampled participants; when a
    failed worker's clients are skipped the sum is rescaled to the mean of those that arrived."""

    source: str
    mean: bool = False

    def weight(self, participants: int) -> float:
        return 1.0 / participants if self.mean else 1.0


class ServerSide:
    """Base class: no payload, no state, the server rule's parameters unchanged.

    ``cfg`` is the validated run config, ``layout`` the flat layout (``layout.num_params``
    parameters first), ``num_clients`` the run's number of logical clients (Scaffold's and
    FedDyn's ``|S|/N`` scaling)."""

    name: ClassVar[str]  # the client method's name
    # Set by :func:`server_side_of` before the first round (empty for a side built by hand): the
    # dataset's domains in order (a domain's id is its position; the ids clients see in their
    # examples) and the ids of the domains the source clients train on (AFL's mixture weights).
    domains: tuple[str, ...] = ()
    train_domains: tuple[int, ...] = ()

    def __init__(self, cfg: RunConfig, layout: Any, num_clients: int):
        self.cfg = cfg
        self.layout = layout
        self.num_clients = int(num_clients)

    def payload(self, round: int) -> dict[str, np.ndarray]:
        """Arrays sent to every participant with the weights of round ``round``."""
        return {}

    def proposal(self, old: np.ndarray, result: AggregateResult, updates: np.ndarray, *,
                 info: RoundInfo) -> AggregateResult:
        """The round's step the server optimiser takes (``params`` and its float64 ``direction``),
        from the server rule's ``result``: the rule's own by default. ``old`` are the round's
        starting parameters, ``updates`` the rows ``θ_u − θ`` as the rule saw them."""
        return result

    def update(self, old: np.ndarray, new: np.ndarray, updates: np.ndarray, weights: np.ndarray, *,
               extras: list[dict[str, np.ndarray]], round: int,
               info: RoundInfo) -> tuple[np.ndarray, dict[str, Any]]:
        """After the server rule's ``aggregate``: update this side's state from the round and return
        ``(parameters the round ends with, diagnostics)``.

        ``old`` are the round's starting parameters θ, ``new`` the server optimiser's result (the
        step of :meth:`proposal`, through ``server_optimizer``),
        ``updates``/``weights``/``extras``/``info`` as the rule saw them (``updates`` is a scratch
        buffer valid during this call only). The default changes nothing."""
        return new, {}

    def streamed_sums(self) -> dict[str, StreamedSum] | None:
        """The sums this side's round needs, by name, when that is all it needs; ``None`` (the
        default) for a side that needs the whole ``[U, M]`` updates or extras."""
        return None

    def streamed_proposal(self, old: np.ndarray, result: AggregateResult, sums: dict[str, np.ndarray], *,
                          info: RoundInfo) -> AggregateResult:
        """:meth:`proposal` from the streamed ``sums`` (:meth:`streamed_sums`' names)."""
        return result

    def streamed_update(self, old: np.ndarray, new: np.ndarray, sums: dict[str, np.ndarray], *, round: int,
                        info: RoundInfo) -> tuple[np.ndarray, dict[str, Any]]:
        """:meth:`update` from the streamed ``sums``."""
        return new, {}

    def wants_probe(self) -> bool:
        """Whether, after this round's aggregation, the round's participants are called again at
        the new global model (their client method's ``probe``; AFL's losses at the aggregated model)."""
        return False

    def after_probe(self, extras: list[dict[str, np.ndarray]], round: int) -> dict[str, Any]:
        """The participants' ``probe`` arrays (ascending client id) at the round's new global model,
        when :meth:`wants_probe`; update this side's state; return diagnostics."""
        return {}

    def state_dict(self) -> dict[str, Any]:
        """Everything needed to resume (the coordinator's checkpoint)."""
        return {}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        pass


def server_side_of(cfg: RunConfig, layout: Any, num_clients: int, *, domains: tuple[str, ...] = (),
                   train_domains: tuple[int, ...] = ()) -> ServerSide | None:
    """The server side of ``cfg``'s client method, built (with the run's ``domains`` and
    ``train_domains``, see :class:`ServerSide`), or None when the method keeps no server state
    (looked up in :data:`~fedtune.algorithms.SERVER_SIDES` by the client method's name: the
    client method itself, and torch, stay unimported)."""
    name = cfg.resolved.client_method_name
    if name not in SERVER_SIDES:
        return None
    side = SERVER_SIDES[name](cfg, layout, num_clients)
    side.domains, side.train_domains = tuple(domains), tuple(int(k) for k in train_domains)
    return side


__all__ = ["ServerSide", "server_side_of"]
