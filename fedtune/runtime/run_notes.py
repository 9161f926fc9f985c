"""A run's first lines: which training augmentation runs, and what the image cache will do.

Two choices change a run's numbers without a word in its results: the augmentation (``augment:
auto`` is DomainBed's on DomainBed's own datasets, none elsewhere) and a cache reused from an
earlier run (its key is each file's path, size and modification time unless ``cache_key:
content``). ``fedtune run`` prints these lines on stderr before anything starts.

>>> from fedtune.config import FederatedRunConfig
>>> augmentation_note(FederatedRunConfig.from_dict({}))
'augmentation: none (augment=auto; rotated-digits is not an image folder)'
"""

from __future__ import annotations

import sys
from datetime import datetime, timezone

from fedtune.config import FederatedRunConfig
from fedtune.data.cache import cache_state
from fedtune.data.cache_lock import describe_owner
from fedtune.data.registry import get_dataset, is_image_folder

_DOMAINBED_AUG = "DomainBed's random resized crop, horizontal flip, colour jitter and greyscale, per image"


def augmentation_note(cfg: FederatedRunConfig) -> str:
    """Which training augmentation ``cfg`` runs, and why."""
    what = cfg.effective_augment
    if cfg.augment != "auto":
        return f"augmentation: {what} (augment={cfg.augment})" + (f": {_DOMAINBED_AUG}" if what == "domainbed" else "")
    if what == "domainbed":
        return f"augmentation: domainbed (augment=auto on DomainBed's dataset {cfg.dataset}): {_DOMAINBED_AUG}"
    if is_image_folder(cfg.dataset):
        return (f"augmentation: none (augment=auto: DomainBed's augmentation runs on DomainBed's own datasets only; "
                f"set augment=domainbed if a crop and a horizontal flip keep this folder's labels)")
    return f"augmentation: none (augment=auto; {cfg.dataset} is not an image folder)"


def _when(record: dict) -> str:
    built = record.get("built")
    if not isinstance(built, (int, float)):
        return ""
    return f" (built {datetime.fromtimestamp(built, timezone.utc):%Y-%m-%d %H:%M} UTC)"


def cache_notes(cfg: FederatedRunConfig) -> list[str]:
    """What the decoded-image cache will do for each domain of ``cfg``'s image-folder dataset:
    reuse it (and how to force a rebuild), decode it (again, saying why, when the files there are
    damaged), or wait for the process building it."""
    if not is_image_folder(cfg.dataset):
        return []
    ds = get_dataset(cfg.dataset, root=cfg.data_root, image_size=cfg.image_size, data_seed=cfg.data_seed,
                     cache_dir=cfg.cache_dir, cache_key=cfg.cache_key, cache_wait_s=cfg.cache_wait_s)
    states = {d: cache_state(ds.cache_entry(d)) for d in ds.info.domains}
    reused = [d for d, (s, _) in states.items() if s == "reused"]
    fresh = [d for d, (s, facts) in states.items() if s == "to build" and facts.get("why") == "not built"]
    lines = []
    if reused:
        key = ("each file's path, size and modification time: an image edited in place with both kept is not "
               "seen; set cache_key=content to key on the bytes" if cfg.cache_key == "stat" else "each file's bytes")
        pattern = ds.cache_entry(reused[0]).directory / f"{ds.info.name}-*-{ds.image_size}px-*"
        lines.append(f"image cache: reused for domain(s) {', '.join(reused)}{_when(states[reused[0]][1])} from "
                     f"{str(ds.cache_dir)!r} (key: {key}); to force a rebuild, delete {str(pattern)!r}")
    if fresh:
        lines.append(f"image cache: decoding domain(s) {', '.join(fresh)} into {str(ds.cache_dir)!r} (once per node)")
    for d, (s, facts) in states.items():
        if s == "to build" and d not in fresh:
            lines.append(f"image cache: decoding domain {d} again into {str(ds.cache_dir)!r}: the cache there is "
                         f"not reused because {facts.get('why')}")
        if s == "building":
            lines.append(f"image cache: domain {d} is being decoded by {describe_owner(facts or None)}; this run "
                         f"waits for it, and stops if it makes no progress for {cfg.cache_wait_s:g} s (cache_wait_s)")
    return lines


def run_notes(cfg: FederatedRunConfig) -> list[str]:
    """The lines a run prints first (:func:`augmentation_note`, :func:`cache_notes`)."""
    return [augmentation_note(cfg), *cache_notes(cfg)]


def print_run_notes(cfg: FederatedRunConfig, file=None) -> None:
    """Print :func:`run_notes` on ``file`` (stderr), one ``fedtune: ...`` line each."""
    for line in run_notes(cfg):
        print(f"fedtune: {line}", file=file or sys.stderr)
