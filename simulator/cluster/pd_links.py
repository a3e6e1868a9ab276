"""Which link a P/D KV transfer rides: inside a node the GPUs' own interconnect, across nodes the
network, each from one link model (link.py's KVLink) and one source of hardware figures.

Placement: a replica group may name its `node` (config.py ReplicaGroup.node); replicas of groups
naming the same node are on one machine. A transfer between a prefill and a decode replica on the
same node goes GPU to GPU over that node's interconnect (NIXL's UCX cuda_ipc transport: NVLink,
or PCIe peer-to-peer through the switch), at the host spec's per-GPU, one-direction figure
(simulator/specs/hosts.py HostSpec.interconnect_gb_s: the NVLink generation's datasheet rate, or
the PCIe generation x lanes payload rate, PCI-SIG), unless `pd.intra_node.bandwidth_bytes_per_s`
gives a measured one; a host without CUDA P2P (hosts.yaml p2p: false) stages the copy through
host memory over the same PCIe link in each direction, pipelined, so the rate is that link's (an
upper bound). Across nodes (or when a replica names no node) the transfer rides the network link
(`pd.link`: RDMA, each TP rank over its own NIC). Every decode replica has its own ingress
interconnect link (each GPU's NVLink/PCIe ports are its own); the network's scope is `pd.link.scope`.

The CPU KV tier's copies (simulator/kv_offload.py) ride the same PCIe figure (HostSpec.pcie_gb_s),
on the replica's own copy streams; they never meet a P/D transfer on one replica because a P/D
engine refuses the CPU tier (pd.py: one KV connector per engine; vLLM would need its
MultiConnector to run NixlConnector and OffloadingConnector together). Were they combined, the
contention would be on the GPU's own PCIe link only: NIXL's RDMA path reads GPU memory from the
NIC through the PCIe switch (GPUDirect RDMA, no host memory), and the tier's copies cross the same
GPU link towards the root complex, so a prefill side's RDMA reads and its tier's stores (both
GPU -> out) would share one direction, a decode side's writes and its tier's loads the other.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from servesim.simulator.cluster.config import LinkConfig, PDConfig
from servesim.simulator.cluster.link import KVLink

if TYPE_CHECKING:
    import simpy

    from servesim.simulator.cluster.cluster import Replica


def interconnect_bytes_per_s(replica: Replica) -> float:
    """Per-GPU, one-direction bytes/s of the replica's node interconnect (module doc)."""
    from servesim.simulator.specs import host_for

    hw = replica.cfg.hardware
    return host_for(hw.gpu, hw.host).link_bytes_per_s


class PDLinks:
    """Every P/D link of a cluster, and the one a transfer from a prefill replica to a decode
    replica rides."""

    def __init__(self, env: simpy.Environment, pd: PDConfig, decoders: list[Replica]) -> None:
        self._env, self._pd = env, pd
        self._shared = KVLink(env, pd.link, "shared") if pd.link.scope == "shared" else None
        self._network_of: dict[int, KVLink] = {}
        self._intra_of: dict[int, KVLink] = {}
        self.links: list[KVLink] = [] if self._shared is None else [self._shared]
        for r in decoders:
            self._add_network(r)
        for r in decoders:
            self._add_intra(r)

    def add_decoder(self, r: Replica) -> None:
        """Links for a decode replica built mid-run (an autoscaled pool's)."""
        self._add_network(r)
        self._add_intra(r)

    def _add_network(self, r: Replica) -> None:
        link = self._shared if self._shared is not None else KVLink(self._env, self._pd.link, f"to_{r.name}")
        if self._shared is None:
            self.links.append(link)
        self._network_of[r.index] = link

    def _add_intra(self, r: Replica) -> None:
        if r.node is None:
            return
        intra = self._pd.intra_node
        bw = intra.bandwidth_bytes_per_s or interconnect_bytes_per_s(r)
        link_cfg = LinkConfig(bandwidth_bytes_per_s=bw, latency_s=intra.latency_s, sharing="fair")
        self._intra_of[r.index] = link = KVLink(self._env, link_cfg, f"intra_{r.name}")
        self.links.append(link)

    def link_for(self, prefill: Replica, decode: Replica) -> KVLink:
        """The decode replica's interconnect link when both are on one node, else its network link."""
        if decode.node is not None and prefill.node == decode.node:
            return self._intra_of[decode.index]
        return self._network_of[decode.index]
