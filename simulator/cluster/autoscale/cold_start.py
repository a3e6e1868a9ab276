"""A new replica's cold start, term by term: what the controller waits for before routing to it.

    provision_s + image_bytes / image_pull_bytes_per_s + container_start_s
      + weight_bytes / weight_load_bytes_per_s + compile_s + graph_capture_s + warmup_s

weight_bytes is every GPU's weight shard of the replica (the model spec's weight_bytes at the
replica's TP, times TP x PP), all loaded over the one storage or network path of its node.
"""

from __future__ import annotations

from dataclasses import dataclass

from servesim.simulator.cluster.autoscale.config import ColdStartConfig
from servesim.simulator.config import SimConfig

PHASES = ("provision_s", "image_pull_s", "container_start_s", "weight_load_s", "compile_s", "graph_capture_s",
          "warmup_s")


@dataclass(slots=True, frozen=True)
class ColdStart:
    """One replica's cold start in seconds, by phase (PHASES, in order)."""

    provision_s: float
    image_pull_s: float
    container_start_s: float
    weight_load_s: float
    compile_s: float
    graph_capture_s: float
    warmup_s: float
    weight_bytes: int  # what weight_load_s loads

    @property
    def total_s(self) -> float:
        return (self.provision_s + self.image_pull_s + self.container_start_s + self.weight_load_s
                + self.compile_s + self.graph_capture_s + self.warmup_s)


def replica_weight_bytes(sim: SimConfig) -> int:
    """Bytes of weights one replica loads: every GPU's shard (TP x PP GPUs)."""
    from servesim.simulator.specs import resolve_model, weight_bytes

    hw = sim.hardware
    return weight_bytes(resolve_model(hw.model), hw.tp) * hw.tp * hw.pp


def cold_start_of(cfg: ColdStartConfig, sim: SimConfig) -> ColdStart:
    """The phases for a replica built from `sim` under `cfg`."""
    wb = replica_weight_bytes(sim)
    return ColdStart(cfg.provision_s, cfg.image_bytes / cfg.image_pull_bytes_per_s, cfg.container_start_s,
                     wb / cfg.weight_load_bytes_per_s, cfg.compile_s, cfg.graph_capture_s, cfg.warmup_s, wb)
