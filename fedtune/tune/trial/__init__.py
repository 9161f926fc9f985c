"""One trial inside Ray Tune: the trainable and the Tune callbacks that watch and record trials.

``trainable`` (one run = one Tune trial, one round = one ``step()``) · ``callback`` (``ArrowCallback``,
the Arrow store's single writer) · ``loggers`` (``--logger`` sinks) · ``progress`` (the live view) ·
``scale_up`` (trials waiting for the autoscaler).
"""
