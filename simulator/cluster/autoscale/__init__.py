"""Autoscaling of a cluster's replica pools: policies, cold starts, the controller, cost (docs/AUTOSCALING.md).

    autoscale: {interval_s: 15, pools: [{group: both, min_replicas: 2, max_replicas: 16,
                                         policy: {name: target_utilization, params: {metric: outstanding, target: 32}}}]}
"""

# The controller (controller.Autoscaler) is imported where a cluster is autoscaled, not here: a
# fixed cluster reads only the config and the cost (cost.py).
from servesim.simulator.cluster.autoscale.cold_start import ColdStart, cold_start_of
from servesim.simulator.cluster.autoscale.config import (
    AutoscaleConfig, ColdStartConfig, PolicyConfig, PoolConfig, autoscale_config_from_dict,
)
from servesim.simulator.cluster.autoscale.cost import Lifetime
from servesim.simulator.cluster.autoscale.policies import (
    METRICS, AutoscalePolicy, PoolMetrics, available_policies, make_policy, register_policy,
)

__all__ = [
    "METRICS", "AutoscaleConfig", "AutoscalePolicy", "ColdStart", "ColdStartConfig", "Lifetime",
    "PolicyConfig", "PoolConfig", "PoolMetrics", "autoscale_config_from_dict", "available_policies", "cold_start_of",
    "make_policy", "register_policy",
]
