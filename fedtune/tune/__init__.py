"""Hyperparameter studies on Ray Tune: search spaces, trainable, results callback, sweeps, reports."""
