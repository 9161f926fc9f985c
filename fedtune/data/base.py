"""Dataset and federated-plan types shared by the data layer and the runtime.

A :class:`DomainDataset` is a set of named domains, each an ordered list of labelled
examples. Everything a partition needs (labels per domain) is cheap to get; pixels are
decoded only by :meth:`DomainDataset.load`, and only for the indices a process needs, so
every client actor decodes just its own clients' examples.

A :class:`FederatedPlan` says which examples each logical client trains / validates / tests
on, which examples the coordinator tests on (the held-out target domain), and nothing else.
It is computed once on the driver from labels alone and shipped to the actors.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np


from ._util import check_domain, check_indices

# A set of examples spread over domains: domain name -> sorted int64 indices into that domain.
Pieces = dict[str, np.ndarray]


@dataclass(frozen=True)
class DatasetInfo:
    """Static description of a dataset."""

    name: str
    domains: tuple[str, ...]
    classes: tuple[str, ...]
    input_shape: tuple[int, ...]  # (C, H, W) for images, (D,) for vectors
    default_model: str  # "cnn" | "mlp" | "resnet18"
    default_setting: str  # "fdg" for multi-domain datasets, "fl" for single-domain ones

    @property
    def num_classes(self) -> int:
        return len(self.classes)

    @property
    def is_image(self) -> bool:
        return len(self.input_shape) == 3


class DomainDataset(ABC):
    """A dataset made of named domains. Subclasses must be deterministic for a given seed."""

    info: DatasetInfo

    def check_domain(self, domain: str) -> None:
        """Raise a :class:`DataError` naming the choices unless ``domain`` is one of this dataset's."""
        check_domain(self.info.domains, domain, self.info.name)

    def check_indices(self, domain: str, indices: np.ndarray, size: int) -> np.ndarray:
        """``indices`` into ``domain`` (``size`` examples) as a 1-D int64 array, or a
        :class:`DataError` naming the dataset and domain (call :meth:`check_domain` first)."""
        return check_indices(indices, size, f"{self.info.name} domain {domain!r}")

    def of_domain(self, table: dict[str, np.ndarray], domain: str) -> np.ndarray:
        """A copy of ``table[domain]`` (a per-domain array: members, labels, ...), after
        :meth:`check_domain`."""
        self.check_domain(domain)
        return table[domain].copy()

    @staticmethod
    def per_domain(table: str, doc: str) -> Callable[[DomainDataset, str], np.ndarray]:
        """A method ``(domain) -> copy of self.<table>[domain]`` (:meth:`of_domain`): a dataset's
        per-domain arrays (``labels = DomainDataset.per_domain("_labels", "...")``)."""
        def method(self: DomainDataset, domain: str) -> np.ndarray:
            return self.of_domain(getattr(self, table), domain)

        method.__doc__ = doc
        return method

    @abstractmethod
    def labels(self, domain: str) -> np.ndarray:
        """int64 labels of every example of ``domain``, in the dataset's canonical order.

        Cheap: must not decode images.
        """

    @abstractmethod
    def load(self, domain: str, indices: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Decode the examples ``indices`` of ``domain``.

        Returns ``(x, y)``: ``x`` a C-contiguous float32 array of shape
        ``(len(indices), *info.input_shape)``, already normalised for the model; ``y`` int64.
        """

    def load_pieces(self, pieces: Pieces) -> tuple[np.ndarray, np.ndarray]:
        """Load and concatenate several (domain, indices) pieces, in the dict's order."""
        xs, ys = [], []
        for domain, idx in pieces.items():
            if len(idx) == 0:
                continue
            x, y = self.load(domain, np.asarray(idx, dtype=np.int64))
            xs.append(x)
            ys.append(y)
        if not xs:
            return (
                np.zeros((0, *self.info.input_shape), dtype=np.float32),
                np.zeros((0,), dtype=np.int64),
            )
        return np.ascontiguousarray(np.concatenate(xs)), np.concatenate(ys)


def pieces_size(pieces: Pieces) -> int:
    return int(sum(len(v) for v in pieces.values()))


@dataclass(frozen=True)
class ClientSpec:
    """One logical federated client: the examples it owns. Data never leaves its actor."""

    client_id: int
    name: str  # human-readable: "photo#0", "client-17", "target"
    role: str  # "source" | "target" (the FDA target client)
    domain: str | None  # its domain in fdg/fda/ufdg; None when it mixes domains (fl, domain_homogeneity)
    train: Pieces
    val: Pieces = field(default_factory=dict)
    test: Pieces = field(default_factory=dict)  # fl only: this client's share of the test data

    @property
    def num_train(self) -> int:
        return pieces_size(self.train)


@dataclass(frozen=True)
class FederatedPlan:
    """Who holds which data, for one run. Built by :func:`fedtune.data.partition.make_plan`."""

    setting: str  # "fdg" | "fl" | "fda" | "ufdg"
    clients: tuple[ClientSpec, ...]
    source_domains: tuple[str, ...]
    target_domains: tuple[str, ...]  # empty in fl
    target_test: Pieces  # evaluated by the coordinator (fdg/fda/ufdg); empty in fl
    target_probe: Pieces = field(default_factory=dict)  # ufdg: labelled probe-training split
    participation: float = 1.0  # fraction of clients sampled per round
    # fdg/fda/ufdg: the oracle slice of the target domain (data_seed-determined, never in
    # target_test), scored as oracle_acc for the "oracle" selection protocol; empty in fl
    target_oracle: Pieces = field(default_factory=dict)
    # the dataset's domains in its order: a domain's position here is the id clients see for it
    # (fedtune.runtime.examples: Examples.domains); empty for a plan built by hand
    domains: tuple[str, ...] = ()
    # split_scheme (fedtune.data.split_file): the file's name, and its splits the coordinator scores:
    # ood_val (its "val" rows: ood_val_acc, selection ood-val), id_val ("id_val": val_acc, selection
    # val) and id_test ("id_test": id_test_acc); all empty without a split file
    split_scheme: str | None = None
    ood_val: Pieces = field(default_factory=dict)
    id_val: Pieces = field(default_factory=dict)
    id_test: Pieces = field(default_factory=dict)

    @property
    def num_clients(self) -> int:
        return len(self.clients)

    def source_train_pieces(self) -> Pieces:
        """Every source client's training examples, by domain (ascending indices): the *source bank*
        a client method declaring ``needs_source_bank`` samples from (FedDG's amplitude spectra)."""
        parts: dict[str, list[np.ndarray]] = {}
        for c in self.clients:
            if c.role == "source":
                for domain, idx in c.train.items():
                    parts.setdefault(domain, []).append(np.asarray(idx, np.int64))
        return {d: np.unique(np.concatenate(v)) for d, v in parts.items()}

    def train_domain_ids(self) -> tuple[int, ...]:
        """The ids (positions in :attr:`domains`) of the domains the source clients train on, ascending."""
        held = {d for c in self.clients if c.role == "source" for d, idx in c.train.items() if len(idx)}
        return tuple(k for k, d in enumerate(self.domains) if d in held)
