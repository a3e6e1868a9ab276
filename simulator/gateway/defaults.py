"""The names a request without a tenant or SLO class goes by (stdlib only: every gateway module
and the summary read them)."""

DEFAULT_TENANT = "default"  # a request without a tenant belongs to this one
DEFAULT_CLASS = "default"  # ... and without an SLO class to this one (judged by the run's `slo` targets)
