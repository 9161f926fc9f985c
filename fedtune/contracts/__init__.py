"""The contracts every fedtune component keeps, as checks you can run on your own (issue 45).

Each check is a plain function over a component's name that runs tiny federated runs (rect4 or
rotated-digits, an MLP with 8 hidden units, 2 local steps, 4 clients, 4 rounds, the local backend)
and returns :class:`~fedtune.contracts.result.CheckResult` values (the check, passed / failed /
skipped, one line saying why, one line saying what to fix) instead of asserting. The same functions
check every built-in component (``tests/contracts/test_contracts.py`` parametrises them over the registries),
a plugin (``fedtune check MODULE[:NAME]``) and your own component in your own pytest suite
(:func:`fedtune.check_component`, :func:`fedtune.assert_component_ok`).

* :mod:`~fedtune.contracts.result`: :class:`CheckResult`, the check names, one line of an exception;
* :mod:`~fedtune.contracts.tiny`: the tiny runs (configs, forms, the rows they compare);
* :mod:`~fedtune.contracts.declared`: every declared hyperparameter (defaults, bounds, kinds,
  choices, search distributions), a preset's parts, a hyperparameter of an unused component;
* :mod:`~fedtune.contracts.compose`: a component with every server rule, client method and server
  optimiser: validates or is one ConfigError line, and where it validates a tiny run trains;
* :mod:`~fedtune.contracts.runs`: a finite first step, determinism, checkpoint and resume,
  ``keeps_client_state`` declared exactly, the Ray backend's rounds equal the local backend's;
* :mod:`~fedtune.contracts.suite`: every check of a component, a plugin module's components
  (:func:`~fedtune.contracts.suite.check_component`, ``check_plugin``, ``assert_component_ok``).
"""
