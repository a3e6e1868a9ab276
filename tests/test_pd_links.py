"""P/D transfers on the node's interconnect or the network (simulator/cluster/pd_links.py), and the
lanes link as TransferStream FIFO queues."""

from __future__ import annotations

import pytest
import simpy

from servesim.simulator.cluster import Cluster, ClusterConfig, KVLink, LinkConfig, PDConfig, ReplicaGroup, sim_config_from_dict
from servesim.simulator.cluster.config import IntraNodeLinkConfig, cluster_config_from_dict, cluster_config_to_dict
from servesim.simulator.specs import kv_bytes_per_token, resolve_model
from servesim.traces.errors import InputError
from servesim.traces.workload import RequestSpec, Workload

PER_TOKEN = kv_bytes_per_token(resolve_model("llama-3.1-8b"), 1)  # 128 KiB
NET = LinkConfig(bandwidth_bytes_per_s=1e9, latency_s=1e-3)


def _cfg(prefill_nodes, decode_node, intra=None, h100_decode_host=None) -> ClusterConfig:
    dec = {"hardware.host": h100_decode_host} if h100_decode_host else {}
    return ClusterConfig(
        replicas=[ReplicaGroup(1, sim_config_from_dict({}), role="prefill", name="p0_", node=prefill_nodes[0]),
                  ReplicaGroup(1, sim_config_from_dict({}), role="prefill", name="p1_", node=prefill_nodes[1]),
                  ReplicaGroup(1, sim_config_from_dict(dec), role="decode", node=decode_node)],
        pd=PDConfig(link=NET, intra_node=intra or IntraNodeLinkConfig()))


WL = Workload([RequestSpec("a", 0.0, prompt_len=1000, output_len=2),
               RequestSpec("b", 5.0, prompt_len=1000, output_len=2)], "two", "t")


def test_same_node_rides_the_interconnect_other_nodes_the_network():
    # a goes to p0 (node n0, with the decoder), b to p1 (node n1): round robin.
    c = Cluster(_cfg(("n0", "n1"), "n0"), WL)
    res = c.run()
    rows = res.requests.set_index("request_id")
    nvlink = 450e9  # h100-hgx: NVLink 4, 900 GB/s total per GPU, 450 a direction (hosts.yaml)
    assert rows.loc["a", "kv_link_s"] == pytest.approx(1000 * PER_TOKEN / nvlink, rel=1e-9)
    assert rows.loc["b", "kv_link_s"] == pytest.approx(1e-3 + 1000 * PER_TOKEN / 1e9, rel=1e-9)
    stats = {s["name"]: s["num_transfers"] for s in res.summary["pd"]["links"]}
    assert stats == {"to_decode0": 1, "intra_decode0": 1}


def test_no_node_named_means_every_transfer_crosses_the_network():
    c = Cluster(_cfg((None, None), None), WL)
    res = c.run()
    assert res.requests["kv_link_s"].to_numpy() == pytest.approx([1e-3 + 1000 * PER_TOKEN / 1e9] * 2)
    assert [link.name for link in c.links] == ["to_decode0"]


def test_a_pcie_host_and_a_measured_override():
    # h100-pcie-server: PCIe 5 x16 P2P, 64 GB/s a direction; a measured figure replaces it.
    pcie = ClusterConfig(replicas=[
        ReplicaGroup(1, sim_config_from_dict({"hardware.gpu": "h100-pcie"}), role="prefill", node="n"),
        ReplicaGroup(1, sim_config_from_dict({"hardware.gpu": "h100-pcie"}), role="decode", node="n")], pd=PDConfig())
    one = Workload([WL.requests[0]], "one", "t")
    assert Cluster(pcie, one).run().requests.kv_link_s.iloc[0] == pytest.approx(1000 * PER_TOKEN / 64e9, rel=1e-9)
    measured = _cfg(("n0", "n1"), "n0", intra=IntraNodeLinkConfig(bandwidth_bytes_per_s=2e9, latency_s=5e-4))
    assert Cluster(measured, one).run().requests.kv_link_s.iloc[0] == pytest.approx(5e-4 + 1000 * PER_TOKEN / 2e9)


def test_nodes_in_yaml_round_trip_and_bad_ones_are_refused():
    raw = {"replicas": [{"role": "prefill", "node": "a"}, {"role": "decode", "node": "a"}],
           "pd": {"intra_node": {"latency_s": 1e-5}}}
    cfg = cluster_config_from_dict(raw)
    assert [g.node for g in cfg.replicas] == ["a", "a"] and cfg.pd.intra_node.latency_s == 1e-5
    assert cluster_config_from_dict(cluster_config_to_dict(cfg)) == cfg
    with pytest.raises(InputError, match="replicas\\[1\\].node.*host 'h100-hgx'.*host 'a100-hgx'"):
        cluster_config_from_dict({"replicas": [{"node": "a"}, {"node": "a", "sim": {"hardware.gpu": "a100"}}]})
    with pytest.raises(InputError, match="pd.intra_node.bandwidth_bytes_per_s"):
        cluster_config_from_dict({**raw, "pd": {"intra_node": {"bandwidth_bytes_per_s": 0}}})
    with pytest.raises(InputError, match="pd.intra_node.latensy.*did you mean latency_s"):
        cluster_config_from_dict({**raw, "pd": {"intra_node": {"latensy": 0}}})
    with pytest.raises(InputError, match="replicas\\[\\].node"):
        ReplicaGroup(node="")


def _lane_times(cfg: LinkConfig, starts_bytes: list[tuple[float, int]]) -> tuple[list[float], float]:
    env = simpy.Environment()
    link = KVLink(env, cfg)
    done = [0.0] * len(starts_bytes)

    def go(i, t, b):
        yield env.timeout(t)
        link.transfer(b, lambda: done.__setitem__(i, env.now))

    for i, (t, b) in enumerate(starts_bytes):
        env.process(go(i, t, b))
    env.run()
    return done, link.busy_s


def test_lanes_are_fifo_queues_and_busy_time_is_their_union():
    two = LinkConfig(bandwidth_bytes_per_s=100.0, latency_s=0.5, sharing="lanes", lanes=2)  # 50 B/s a lane
    # 100 B at 0 -> lane 0 [0.5, 2.5]; 50 B at 0 -> lane 1 [0.5, 1.5]; 50 B at 1 -> lane 1 [1.5, 2.5];
    # 100 B at 4 -> lane 0 [4.5, 6.5]: busy 0.5..2.5 and 4.5..6.5.
    done, busy = _lane_times(two, [(0.0, 100), (0.0, 50), (1.0, 50), (4.0, 100)])
    assert done == pytest.approx([2.5, 1.5, 2.5, 6.5]) and busy == pytest.approx(4.0)


# --- pinned host memory per node ---------------------------------------------------------------------
def _tiers(gib_a: float, gib_b: float, node_b: str | None = "n") -> ClusterConfig:
    def group(name, gib, node):
        return ReplicaGroup(1, sim_config_from_dict({"kv_offload.kv_offloading_size": gib}), name=name, node=node)
    return ClusterConfig(replicas=[group("a", gib_a, "n"), group("b", gib_b, node_b)])


def test_tiers_on_one_node_share_its_host_memory():
    from servesim.simulator.cluster.host_memory import GIB_BYTES, cpu_tier_bytes

    Cluster(_tiers(1024, 1024), WL)  # h100-hgx: 2048 GiB (MLPerf v3.1 XE9680), exactly full
    with pytest.raises(InputError, match="node 'n' pin 2049.0 GiB.*a0 1024.0, b0 1025.0 GiB.*"
                                         "'h100-hgx' has \\(2048 GiB\\)"):
        Cluster(_tiers(1024, 1025), WL)
    Cluster(_tiers(1024, 1025, node_b="m"), WL)  # on two nodes: each fits
    with pytest.raises(InputError, match="2049 GiB does not fit in host h100-hgx's 2048 GiB"):
        Cluster(_tiers(1, 2049, node_b=None), WL)  # alone on its node: the replica's own start-up check
    # vLLM's CPUOffloadingSpec rounds down to whole offload blocks (2 MiB of Llama-3.1-8B at TP 1).
    cfg = sim_config_from_dict({"kv_offload.kv_offloading_size": 1.001})
    from servesim.simulator.startup import resolve_cache, resolved

    cfg = resolved(cfg)
    assert cpu_tier_bytes(cfg, resolve_cache(cfg)[0]) == 512 * 2 * 2**20 and GIB_BYTES == 2**30


def test_sglang_host_pool_counts_every_rank():
    from servesim.simulator.cluster.host_memory import cpu_tier_bytes
    from servesim.simulator.startup import resolve_cache, resolved

    cfg = resolved(sim_config_from_dict({"engine": "sglang", "hardware.tp": 2, "cache.num_gpu_blocks": 1001, "scheduler.max_model_len": 8192,
                                         "sglang.hicache.enable_hierarchical_cache": True}))
    # device pool (1001 - 1) x 16 tokens, host pool x2.0 (SGLang's default ratio), 64 KiB a token on each of 2 GPUs
    assert cpu_tier_bytes(cfg, resolve_cache(cfg)[0]) == 32000 * 65536 * 2
