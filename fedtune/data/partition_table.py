"""A federated plan as a table: how many examples of each domain each client holds.

``fedtune partition`` prints it (text, or ``--json``) so a split can be seen before anything
trains. NumPy only: it reads a :class:`~fedtune.data.base.FederatedPlan`, never a model.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from fedtune.data.base import FederatedPlan
from fedtune.errors import ConfigError, shown

CLIENT_SPLITS: tuple[str, ...] = ("train", "val", "test")
"""The splits a client holds (:class:`~fedtune.data.base.ClientSpec`)."""


def client_domain_counts(plan: FederatedPlan, split: str = "train") -> tuple[tuple[str, ...], np.ndarray]:
    """``(domains, counts)``: the plan's source domains, then any target domain a client holds (the
    fda target client), and an int64 ``(clients, domains)`` array of how many examples of each
    domain each client holds in ``split``."""
    if split not in CLIENT_SPLITS:
        raise ConfigError(f"split {shown(split, 20)} is unknown; allowed: {', '.join(CLIENT_SPLITS)}")
    held = [d for d in plan.target_domains if any(d in c.train or d in c.val for c in plan.clients)]
    domains = tuple(dict.fromkeys((*plan.source_domains, *held)))
    counts = np.array([[len(getattr(c, split).get(d, ())) for d in domains] for c in plan.clients],
                      dtype=np.int64).reshape(len(plan.clients), len(domains))
    return domains, counts


def partition_json(plan: FederatedPlan, dataset: str, homogeneity: float | None) -> dict[str, Any]:
    """The plan's train and val counts per client and domain, as one JSON-ready object."""
    domains, train = client_domain_counts(plan, "train")
    _, val = client_domain_counts(plan, "val")
    return {"dataset": dataset, "setting": plan.setting, "target_domains": list(plan.target_domains),
            "domain_homogeneity": homogeneity, "domains": list(domains),
            "clients": [{"id": c.client_id, "name": c.name, "role": c.role, "domain": c.domain} for c in plan.clients],
            "train": train.tolist(), "val": val.tolist(),
            "target_test": sum(len(v) for v in plan.target_test.values()),
            "target_oracle": sum(len(v) for v in plan.target_oracle.values()),
            "split_scheme": plan.split_scheme,
            **{name: {d: len(v) for d, v in getattr(plan, name).items()} for name in ("ood_val", "id_val", "id_test")}}


def partition_lines(plan: FederatedPlan, dataset: str, homogeneity: float | None) -> list[str]:
    """A title line, then the clients x domains table of train counts (and each client's val total)."""
    domains, train = client_domain_counts(plan, "train")
    _, val = client_domain_counts(plan, "val")
    lam = "null (clients_per_domain split)" if homogeneity is None else homogeneity
    lines = [f"{dataset}, setting {plan.setting}, target {', '.join(plan.target_domains) or '-'}, "
             f"domain_homogeneity {lam}: TRAIN examples per client (rows) and domain (columns); "
             f"val = the client's validation examples"]
    head = ["client", *domains, "train", "val"]
    rows = [[c.name, *map(str, train[i]), str(train[i].sum()), str(val[i].sum())] for i, c in enumerate(plan.clients)]
    rows.append(["total", *map(str, train.sum(axis=0)), str(train.sum()), str(val.sum())])
    widths = [max(len(r[j]) for r in [head, *rows]) for j in range(len(head))]
    for r in [head, *rows]:
        lines.append("  ".join(r[0].ljust(widths[0]) if j == 0 else r[j].rjust(widths[j]) for j in range(len(r))))
    if plan.split_scheme is not None:  # the file's coordinator-scored splits
        lines.append(f"split_scheme {plan.split_scheme!r}, scored by the coordinator: " + "; ".join(
            f"{label} " + (", ".join(f"{d} {len(v)}" for d, v in pieces.items()) or "none")
            for label, pieces in (("OOD test (target_acc)", plan.target_test), ("OOD val (ood_val_acc)", plan.ood_val),
                                  ("ID val (val_acc)", plan.id_val), ("ID test (id_test_acc)", plan.id_test))))
    return lines
