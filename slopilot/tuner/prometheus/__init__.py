"""Prometheus: alert rules, firing alerts, PromQL queries, workload profiling, window adapters."""
