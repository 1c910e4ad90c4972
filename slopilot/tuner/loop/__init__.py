"""The live SLO loop: the controller's state machine, its ports, capacity checks, metrics."""
