import os

from hypothesis import HealthCheck, settings

# CI runs with CI=true: a fixed, derandomised profile keeps runs reproducible.
settings.register_profile("ci", derandomize=True, deadline=None,
                          suppress_health_check=[HealthCheck.too_slow])
settings.register_profile("dev", deadline=None, suppress_health_check=[HealthCheck.too_slow])
settings.load_profile("ci" if os.environ.get("CI") else "dev")
