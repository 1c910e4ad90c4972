"""Discrete-event simulation: GPU and model cost profiles, workloads, trace replay."""
