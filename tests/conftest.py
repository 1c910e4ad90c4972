"""Settings for the whole suite: hypothesis's, so that no property test hangs on speed.

hypothesis's defaults time each example (a 200 ms ``deadline``) and the generation of
the first ones (the ``too_slow`` health check): a busy CI machine that takes a
microsecond body off the CPU for a quarter second fails the test as "Unreliable test
timings", whatever the code does. Its default seed changes every run, so an example
that one run finds and the next does not is a flake too. The ``deterministic`` profile,
loaded here for every test, turns the timing checks off and fixes the seed; a test's own
``@settings`` still overrides any of it. ``pytest --hypothesis-profile=explore`` hunts
new examples (a random seed each run, the ones found kept in ``.hypothesis/``).
"""

from __future__ import annotations

from hypothesis import HealthCheck, settings

settings.register_profile("deterministic", deadline=None, derandomize=True, database=None,
                          suppress_health_check=[HealthCheck.too_slow])
settings.register_profile("explore", deadline=None, derandomize=False,
                          suppress_health_check=[HealthCheck.too_slow])
settings.load_profile("deterministic")
