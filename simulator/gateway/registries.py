"""The gateway's two pluggable kinds, each one Registry (scheduler/registry.py): admission rules
(gateway/rules.py registers them) and queuing disciplines (gateway/queues.py). An unknown name is an
InputError naming the config field, with the valid names and a did-you-mean."""

from __future__ import annotations

from servesim.scheduler.registry import Registry
from servesim.traces.errors import field_error

ADMISSION_RULES: Registry = Registry("admission rule", plugins="servesim.simulator.gateway.rules",
                                     error=field_error("gateway.rules[].name"))
QUEUE_DISCIPLINES: Registry = Registry("queuing discipline", plugins="servesim.simulator.gateway.queues",
                                       error=field_error("gateway.queuing.name"))
