"""The progress bar of a run on the terminal (:func:`fedtune.runtime.driver.run`): one tick per
round with its current metrics, drawn by ``rich``."""

from __future__ import annotations

from typing import Any

from fedtune.config import FederatedRunConfig


class RunProgress:
    """A rich progress bar: one tick per round with the current metrics."""

    def __init__(self, cfg: FederatedRunConfig, enabled: bool):
        self.cfg, self.enabled = cfg, enabled
        self.progress = None

    def start(self, run: Any, info: dict[str, Any]) -> None:
        if not self.enabled:
            return
        # lazy: keeps rich out of this module's import
        from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

        self.progress = Progress(TextColumn("[bold]{task.description}"), BarColumn(), MofNCompleteColumn(),
                                 TimeElapsedColumn(), TextColumn("{task.fields[metrics]}"))
        self.progress.start()
        desc = f"{self.cfg.algorithm}/{self.cfg.dataset}"
        desc += f" -> {','.join(run.plan.target_domains)}" if run.plan.target_domains else ""
        self.task = self.progress.add_task(desc, total=self.cfg.rounds, metrics="starting")

    def update(self, row: dict[str, Any]) -> None:
        if self.progress is None:
            return
        text = (f"loss {row['train_loss']:.3f} val {row.get('val_acc', float('nan')):.3f} "
                f"target {row.get('target_acc', float('nan')):.3f} {row['wall_s']:.1f}s/rd")
        self.progress.update(self.task, advance=1, metrics=text)

    def stop(self) -> None:
        if self.progress is not None:
            self.progress.stop()
            self.progress = None
