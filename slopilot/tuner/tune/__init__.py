"""``slopilot tune``: settings, the study run, the capacity answer, progress and output."""
