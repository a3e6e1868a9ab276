"""What an autoscaled cluster config must satisfy (ClusterConfig.__post_init__ calls check_autoscale)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from servesim.traces.errors import InputError

if TYPE_CHECKING:
    from servesim.simulator.cluster.config import ClusterConfig


def check_autoscale(cfg: ClusterConfig) -> None:
    """Each pool names one replica group, not a lockstep (DP) one, whose initial count is within
    the pool's min/max; the policies build (their parameters are checked here, not mid-run)."""
    from servesim.simulator.cluster.autoscale.cold_start import replica_weight_bytes
    from servesim.simulator.cluster.autoscale.policies import make_policy

    labels = [g.name or g.role for g in cfg.replicas]
    for i, pool in enumerate(cfg.autoscale.pools):
        where = f"autoscale.pools[{i}]"
        if labels.count(pool.group) != 1:
            from servesim.scheduler.registry import unknown_name_message

            detail = f"{pool.group!r} names {labels.count(pool.group)} groups" if pool.group in labels \
                else unknown_name_message("replica group", pool.group, labels)
            raise InputError(detail, field=f"{where}.group",
                             allowed="one replica group's name (its `name`, else its role): " + ", ".join(labels))
        group = cfg.replicas[labels.index(pool.group)]
        if group.lockstep:
            raise InputError("a lockstep (DP) group steps as one: it is not scaled replica by replica",
                             field=f"{where}.group", allowed="a group without lockstep")
        if not pool.min_replicas <= group.count <= pool.max_replicas:
            raise InputError(f"the group starts with {group.count} replica(s), outside [{pool.min_replicas}, "
                             f"{pool.max_replicas}]", field=f"replicas[{labels.index(pool.group)}].count",
                             allowed="min_replicas <= count <= max_replicas")
        if pool.min_replicas < 1:  # scale to zero: the activator holds requests (autoscale/activator.py)
            fronts = [g for g in cfg.replicas if g.role != "decode"]
            if group.role != "both" or len(fronts) != 1:
                raise InputError("a pool scales to zero only when it is the one group the router picks from "
                                 "(colocated, no other group, no P/D)", field=f"{where}.min_replicas",
                                 allowed="an integer >= 1 here")
        make_policy(pool.policy.name, pool.policy.params, f"{where}.policy", cfg.slo)
        replica_weight_bytes(group.sim)  # the model resolves (its weights are what a cold start loads)
