"""slopilot: keeps LLM serving inside its latency SLOs."""

__version__ = "0.1.0"
