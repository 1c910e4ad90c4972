"""Executors run a scheduled batch: the torch model runner and the cost-model simulator."""
