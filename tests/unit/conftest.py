"""Hypothesis settings for the unit tests: no per-example deadline and no "too slow" health check.

The unit tests run in CI next to lanes that boot QEMU/TCG guests on every core; one stalled example would
otherwise fail a property test for its timing ("Unreliable test timings"), not for its property.
"""

from hypothesis import HealthCheck, settings

settings.register_profile("zjusct-loaded-machine", deadline=None, suppress_health_check=[HealthCheck.too_slow])
settings.load_profile("zjusct-loaded-machine")
