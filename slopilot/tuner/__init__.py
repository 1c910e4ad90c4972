"""SLO-driven tuning: Optuna studies, evaluators, the controller state machine."""
