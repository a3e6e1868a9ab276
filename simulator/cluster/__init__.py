"""Multi-replica serving: N engines on one SimPy clock behind a router, optionally P/D disaggregated.

    from servesim.simulator.cluster import ClusterConfig, ReplicaGroup, RouterConfig, run_cluster
    res = run_cluster(ClusterConfig(replicas=[ReplicaGroup(count=4)], router=RouterConfig("least_kv")), wl)
    res.summary["ttft_s"]["p50"], res.requests.groupby("replica").size()

See docs/CLUSTER.md.
"""

from servesim.simulator.cluster.cluster import Cluster, Replica, RouteRecord, run_cluster
from servesim.simulator.cluster.config import (
    ClusterConfig, LinkConfig, PDConfig, ReplicaGroup, RouterConfig, cluster_config_from_dict,
    cluster_config_to_dict, sim_config_from_dict,
)
from servesim.simulator.cluster.link import KVLink
from servesim.simulator.cluster.pd import DecodeEngine, PrefillEngine, RemotePrefillConnector
from servesim.simulator.cluster.pd_handoffs import PDTimeline
from servesim.simulator.cluster.results import ClusterResult, ReplicaResult, write_cluster_results
from servesim.simulator.cluster.routers import Decision, Router, available_routers, make_router, register_router

__all__ = [
    "Cluster", "ClusterConfig", "ClusterResult", "Decision", "DecodeEngine", "KVLink", "LinkConfig", "PDConfig",
    "PDTimeline", "PrefillEngine", "RemotePrefillConnector", "Replica", "ReplicaGroup", "ReplicaResult",
    "RouteRecord", "Router", "RouterConfig", "available_routers", "cluster_config_from_dict",
    "cluster_config_to_dict", "make_router", "register_router", "run_cluster", "sim_config_from_dict",
    "write_cluster_results",
]
