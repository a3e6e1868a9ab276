"""servesim's vLLM V1 scheduler and KV cache manager (pure Python, standard library only)."""

from scheduler.async_scheduler import AsyncScheduler, make_scheduler
from scheduler.config import CacheConfig, SchedulerConfig
from scheduler.hashing import make_block_hasher
from scheduler.interface import SchedulerCapabilities, SchedulerInterface
from scheduler.invariants import InvariantError, check_invariants
from scheduler.kv.manager import KVCacheBlocks, KVCacheManager, PrefixCacheStats
from scheduler.output import (
    CachedRequestData, EngineCoreOutputs, ModelRunnerOutput, NewRequestData, RequestOutput,
    SchedulerOutput, SchedulerStats, SpecDecodingStats,
)
from scheduler.request import Request, RequestStatus, SamplingParams, check_stop
from scheduler.scheduler import Scheduler

__all__ = [
    "AsyncScheduler", "CacheConfig", "CachedRequestData", "EngineCoreOutputs", "InvariantError",
    "KVCacheBlocks", "KVCacheManager", "ModelRunnerOutput", "NewRequestData", "PrefixCacheStats",
    "Request", "RequestOutput", "RequestStatus", "SamplingParams", "Scheduler", "SchedulerCapabilities",
    "SchedulerConfig", "SchedulerInterface", "SchedulerOutput", "SchedulerStats", "SpecDecodingStats", "check_invariants", "check_stop",
    "make_block_hasher", "make_scheduler",
]
