"""vLLM 0.19.1's OffloadingConnector with a CPU tier, scheduler side: the tier's manager and its
LRU / ARC policies (manager.py, policies.py), the connector (connector.py), its settings
(config.py), and the oracle's fake worker (fake_worker.py) with the replay that uses it (replay.py)."""

from servesim.scheduler.kv_offload.config import KV_CONNECTORS, OffloadConfig, make_offloading_connector
from servesim.scheduler.kv_offload.connector import OffloadingConnectorMetadata, OffloadingConnectorScheduler
from servesim.scheduler.kv_offload.manager import CPUOffloadingManager

__all__ = ["KV_CONNECTORS", "CPUOffloadingManager", "OffloadConfig", "OffloadingConnectorMetadata", "OffloadingConnectorScheduler",
           "make_offloading_connector"]
