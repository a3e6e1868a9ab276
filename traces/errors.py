"""`InputError` and `field_error`, re-exported from the lowest layer (servesim.scheduler.errors).

Loaders, generators and every package above import them from here; the class is defined once.
"""

from servesim.scheduler.errors import InputError, field_error

__all__ = ["InputError", "field_error"]
