"""fedtune: honest hyperparameter studies of federated domain generalisation / adaptation on Ray.

Importing ``fedtune`` is light (no torch, no Ray): the heavy parts load where they run.

>>> import fedtune
>>> cfg = fedtune.FederatedRunConfig.from_dict({"rounds": 2, "backend": "local"})
>>> cfg.algorithm, cfg.dataset
('fedavg', 'rotated-digits')
"""

from fedtune.config import FederatedRunConfig
from fedtune.errors import ConfigError

__version__ = "0.1.0"


def run(cfg: "FederatedRunConfig", **kwargs):
    """Run one federated run; see :func:`fedtune.runtime.driver.run`."""
    from fedtune.runtime.driver import run as _run

    return _run(cfg, **kwargs)


def search_space(algorithm: str) -> dict:
    """Ray Tune ``param_space`` of ``search_spaces/<algorithm>.yaml``; see
    :func:`fedtune.spaces.lookup.search_space`."""
    from fedtune.spaces.lookup import search_space as _search_space

    return _search_space(algorithm)


__all__ = ["ConfigError", "FederatedRunConfig", "run", "search_space", "__version__"]
