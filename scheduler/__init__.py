"""servesim's vLLM V1 scheduler and KV cache manager (pure Python, standard library only)."""

from servesim.scheduler.async_scheduler import AsyncScheduler, make_scheduler
from servesim.scheduler.config import CacheConfig, SchedulerConfig
from servesim.scheduler.hashing import TokenProvenance, TokenSegment, make_block_hasher
from servesim.scheduler.interface import SchedulerCapabilities, SchedulerInterface
from servesim.scheduler.invariants import InvariantError, check_invariants
from servesim.scheduler.kv.manager import KVCacheBlocks, KVCacheManager, PrefixCacheStats
from servesim.scheduler.output import (
    CachedRequestData, EngineCoreOutputs, ModelRunnerOutput, NewRequestData, RequestOutput,
    SchedulerOutput, SchedulerStats, SpecDecodingStats,
)
from servesim.scheduler.lazy_ids import LazyTokenIds
from servesim.scheduler.request import Request, RequestStatus, SamplingParams, check_stop
from servesim.scheduler.scheduler import Scheduler

__all__ = [
    "AsyncScheduler", "CacheConfig", "CachedRequestData", "EngineCoreOutputs", "InvariantError",
    "KVCacheBlocks", "KVCacheManager", "LazyTokenIds", "ModelRunnerOutput", "NewRequestData", "PrefixCacheStats",
    "Request", "RequestOutput", "RequestStatus", "SamplingParams", "Scheduler", "SchedulerCapabilities",
    "SchedulerConfig", "SchedulerInterface", "SchedulerOutput", "SchedulerStats", "SpecDecodingStats",
    "TokenProvenance", "TokenSegment",
    "check_invariants", "check_stop", "make_block_hasher", "make_scheduler",
]
