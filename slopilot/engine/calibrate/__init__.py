"""``slopilot calibrate``: measure the real executor and fit the twin's cost model to it."""
