"""The Optuna study: search space and bounds, objective, evaluator interface, storage, report.

The ground floor of the tuner: it imports nothing from the rest of it.
"""
