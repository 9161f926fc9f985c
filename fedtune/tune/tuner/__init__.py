"""What fedtune hands Ray Tune's ``Tuner`` besides the trainable: the Optuna searcher, storage, capacity.

``optuna_search`` (the Optuna searcher, samplers, schedulers, Optuna storages) · ``study_search``
(several searches' searchers and schedulers behind one fit) · ``storage``
(``--storage-path``, Tune's experiment storage) · ``capacity`` (how many trials run at once) ·
``env`` (muting Tune; the signal handlers it leaves behind put back).
"""
