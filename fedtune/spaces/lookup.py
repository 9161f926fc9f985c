"""Search spaces: which hyperparameters a study samples, and how.

Every named algorithm has a space, derived from the declarations (:mod:`fedtune.spaces.derive`):
its client method's and server rule's hyperparameters (each ``HParam.search``), the shared knobs
(:mod:`fedtune.spaces.shared`) and the server optimiser's block. ``search_spaces/<algorithm>.yaml``
is an *override* of that space, read with ``yaml.safe_load`` within :mod:`fedtune.yaml_safe`'s
limits (1 MiB, 100 levels, 100000 values with aliases expanded); it names only what it changes::

    algorithm: fedgp               # required: a named algorithm (`fedtune algorithms`)
    setting: fda                   # optional: client_method / server_rule / setting, passed on
    description: FedGP, ...        # optional free text (else the algorithm's own)
    switches:                      # optional: sampled choices that only steer conditions
      gp_beta_mode: {default: auto}          # merged into the rule's declared switch
    params:                        # optional: hyperparameter name -> what changes
      local_lr:    {low: 0.01}               # one key: the rest of the shared range stays
      gp_align:    {distribution: fixed, value: true}    # a new distribution: a pinned variant
      local_steps: {distribution: int, low: 1, high: 5, default: 2}   # added: a budget field

An entry merges into the derived one key by key; a ``distribution`` other than the derived one
drops the derived distribution's keys (``low``, ``high``, ``default``, ``log``, ``choices``,
``value``) and keeps ``when``, ``otherwise`` and ``help``; ``when: null`` removes the derived
condition and its ``otherwise``. A name the derivation does not have (a budget field such as
``local_steps``) is added after the derived ones. The merged space is validated as a whole, as
below. ``complete: true`` says the file is the whole space (nothing derived; ``params``
required): what a study's snapshot of its spaces and ``fedtune spaces show NAME --yaml`` write,
so a resumed study keeps its spaces when the declarations change. A file's entries, like a
complete file's, use this format:

Distributions and their keys (every sampled parameter needs a ``default``):

* ``uniform`` / ``loguniform``: ``low``, ``high`` (``low < high``; loguniform needs
  ``low > 0``), ``default`` in ``[low, high]``; float hyperparameters only.
* ``int``: integer ``low``, ``high`` (both inclusive), ``default``, optional ``log: true``
  (then ``low >= 1``); integer hyperparameters only.
* ``categorical``: ``choices`` (a non-empty list without repeats), ``default`` among them.
* ``fixed``: ``value`` (the study never varies it).

Every parameter may also carry ``help`` (free text) and a condition: ``when`` maps a switch,
or an unconditional ``categorical``/``fixed`` parameter of the same file, to one allowed
value or a list of them (all entries must hold). When the condition fails the parameter
takes ``otherwise`` if given, else the algorithm's own default, so every sampled
configuration names every parameter of the space; except a server optimiser's hyperparameter
(``server_beta1`` ...), which has no value without its optimiser: it is left out
(:data:`~fedtune.spaces.model.OMITTED`), and its ``when`` on ``server_optimizer`` may list only
optimisers that use it. A condition on a ``fixed`` parameter may name values it does not take
(a pinned knob): it never holds.

Switches are *not* hyperparameters of a run: they appear in sampled configurations under
the key ``switch.<name>`` (:data:`~fedtune.spaces.model.SWITCH_PREFIX`) so that Optuna can learn
from them, and :func:`~fedtune.spaces.model.strip_switches` removes them before a configuration
becomes a :class:`~fedtune.config.FederatedRunConfig`. A switch a file declares and no condition
uses is an error; a declared one (FedDA/FedGP's ``gp_beta_mode``) no condition uses any more is dropped.

Names a file may tune: the ``hp=True`` fields of :class:`~fedtune.config.FederatedRunConfig`
(``local_lr``, ``global_lr``, ``server_optimizer``, ...), the hyperparameters (``HParam``) of the
algorithm's client method and server rule, and those of the server optimisers. Every value a file can produce (range ends, defaults,
choices, fixed values, ``otherwise``) is checked by building a ``FederatedRunConfig`` with it, so
the allowed ranges are exactly the ones a run enforces. All errors are
:class:`~fedtune.errors.ConfigError` naming the file, the key and the problem, raised
before anything launches.

This module is the entry: the lookup by name and :func:`load_space` /
:func:`search_space` / :func:`list_spaces`. The model (:class:`~fedtune.spaces.model.SearchSpace`,
:class:`~fedtune.spaces.model.ParamSpec`, :class:`~fedtune.spaces.model.Switch`,
:func:`~fedtune.spaces.model.strip_switches`) lives in :mod:`fedtune.spaces.model` and reading and
validating a file in :mod:`fedtune.spaces.yaml_files`; ``fedtune spaces show NAME`` prints the
effective space (:mod:`fedtune.spaces.show`).

Where a name is looked up (:func:`load_space`): an existing path is read as is; a bare
name ``fedomg`` is looked up as ``search_spaces/fedomg.yaml`` first under the current
directory, then in the repository's own ``search_spaces/`` folder, and the file's
``algorithm`` must then equal that name; a named algorithm with no file there has its derived
space (its ``source`` is then the name).

>>> space = load_space("fedavg")
>>> space.algorithm, sorted(space.defaults())[:3]
('fedavg', ['algorithm', 'client_weighting', 'global_lr'])
>>> from fedtune.spaces.model import strip_switches
>>> strip_switches({"switch.gp_beta_mode": "auto", "gp_beta": "auto"})
{'gp_beta': 'auto'}
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from fedtune.algorithms.presets import PRESETS
from fedtune.errors import ConfigError
from fedtune.spaces.model import SearchSpace
from fedtune.spaces.yaml_files import build_space, read_space_file

__all__ = ["SPACES_DIR", "list_spaces", "load_space", "search_space"]

_REPO_SPACES = Path(__file__).resolve().parents[2] / "search_spaces"  # a source checkout / editable install
_WHEEL_SPACES = Path(__file__).resolve().parents[1] / "search_spaces"  # `pip install .`: shipped as package data
SPACES_DIR: Path = _REPO_SPACES if _REPO_SPACES.is_dir() else _WHEEL_SPACES
"""fedtune's own search spaces (the repository's ``search_spaces/``, packaged as ``fedtune/search_spaces``)."""


def _search_dirs() -> list[Path]:
    dirs: list[Path] = []
    for d in (Path.cwd() / "search_spaces", SPACES_DIR):
        if d.resolve() not in [x.resolve() for x in dirs]:
            dirs.append(d)
    return dirs


def list_spaces() -> list[str]:
    """Names of the search spaces a name lookup finds: every named algorithm (its space is derived
    from the declarations, with or without a file) and the files of ``search_spaces/`` (current
    directory, then built-in).

    >>> "fedavg" in list_spaces(), "simclr" in list_spaces()
    (True, True)
    """
    names = {p.stem for d in _search_dirs() if d.is_dir() for p in d.glob("*.yaml")}
    return sorted(names | set(PRESETS))


def search_space(algorithm: str) -> dict[str, Any]:
    """The Ray Tune ``param_space`` of an algorithm's search space:
    ``load_space(algorithm).tune_space()``.

    >>> sorted(search_space("fedavg"))[:2]
    ['algorithm', 'client_weighting']
    """
    return load_space(algorithm).tune_space()


def load_space(path_or_name: str | os.PathLike[str]) -> SearchSpace:
    """Read and validate a search space: a YAML path, or an algorithm name looked up as
    ``search_spaces/<name>.yaml`` (see the module docstring). Raises ConfigError naming
    the file, the key and the problem.

    >>> load_space("no-such-algorithm")
    Traceback (most recent call last):
    ...
    fedtune.errors.ConfigError: no search space named 'no-such-algorithm' ...
    """
    text = os.fspath(path_or_name)
    as_path = Path(text)
    expected: str | None = None
    if as_path.is_file():
        path = as_path
    elif os.sep in text or "/" in text or as_path.suffix in (".yaml", ".yml"):
        raise ConfigError(f"search space file '{text}' does not exist")
    else:
        expected = text
        found = [d / f"{text}.yaml" for d in _search_dirs() if (d / f"{text}.yaml").is_file()]
        if not found and text in PRESETS:
            return build_space({"algorithm": text}, text, text)  # no override: the declarations alone
        if not found:
            where = " or ".join(f"'{d}'" for d in _search_dirs())
            raise ConfigError(
                f"no search space named '{text}' (looked for {text}.yaml in {where}); "
                f"available: {', '.join(list_spaces()) or 'none'}")
        path = found[0]
    return read_space_file(path, expected)
