"""Search spaces: which hyperparameters a study samples, and how.

``lookup`` (the file format, the lookup by name: :func:`~fedtune.spaces.lookup.load_space`,
:func:`~fedtune.spaces.lookup.search_space`, :func:`~fedtune.spaces.lookup.list_spaces`) ·
``derive`` (an algorithm's space from the declarations, and a file's override merged in) ·
``shared`` (the knobs every algorithm shares and the server optimiser, declared once) ·
``model`` (a validated space: :class:`~fedtune.spaces.model.SearchSpace`, its Ray Tune
``param_space`` and Optuna define-by-run function, :func:`~fedtune.spaces.model.strip_switches`) ·
``yaml_files`` (reading one file and checking it against the algorithm it names) ·
``show`` (``fedtune spaces show NAME``, and the complete copy a study keeps of each space).

The overrides are in the repository's ``search_spaces/`` folder (docs/search-spaces.md).
This package never imports the sweep layer, :mod:`fedtune.tune` (which uses it).
"""
