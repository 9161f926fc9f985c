"""The driver's own work between two rounds (fedtune.runtime.driver.run, issue 47 item 5): what does
not change from round to round is computed once a run, and the rows stay what they were."""

from __future__ import annotations

from fedtune.config import FederatedRunConfig
from fedtune.runtime.driver import hp_columns, round_row, run


def _count_hyperparameters(monkeypatch) -> list[int]:
    calls = [0]
    real = FederatedRunConfig.hyperparameters

    def counted(self):
        calls[0] += 1
        return real(self)

    monkeypatch.setattr(FederatedRunConfig, "hyperparameters", counted)
    return calls


def test_the_hyperparameter_columns_are_computed_once_a_run_not_every_round(tmp_path, monkeypatch):
    calls = _count_hyperparameters(monkeypatch)
    counts, rows = {}, {}
    for rounds in (1, 4):
        cfg = FederatedRunConfig.from_dict({"dataset": "rect4", "rounds": rounds, "local_steps": 1, "backend": "local",
                                            "output": str(tmp_path), "name": f"r{rounds}"})
        calls[0] = 0
        rows[rounds] = run(cfg, progress=False).rows
        counts[rounds] = calls[0]
    assert counts[4] == counts[1] == 1, counts
    want = {f"hp.{k}": v for k, v in cfg.hyperparameters().items()}
    assert want and all({k: v for k, v in r.items() if k.startswith("hp.")} == want for r in rows[4])


def test_a_row_without_given_columns_computes_them_as_the_run_does(tmp_path):
    from fedtune.runtime.coordinator import RoundResult
    from fedtune.runtime.driver import FederatedRun

    cfg = FederatedRunConfig.from_dict({"dataset": "rect4", "rounds": 1, "backend": "local", "output": str(tmp_path),
                                        "local_lr": 0.2})
    fr = FederatedRun(cfg)
    result = RoundResult(1, {"train_loss": 0.5, "wall_s": 0.1}, "ok")
    given = round_row(cfg, fr, "t", result, hp_columns(cfg))
    assert round_row(cfg, fr, "t", result) == given
    assert list(given) == list(round_row(cfg, fr, "t", result))  # the same column order
    assert given["hp.local_lr"] == 0.2 and given["train_loss"] == 0.5
