"""Every KV cache group kind and its manager: the one registry the coordinator builds from.

Each manager lives in its own module; this module imports them all and registers each by the name
``KVCacheGroupSpec.kind`` uses. Registered here, after the classes, rather than by a class
decorator: a decorated class would not compile to a native class under mypyc.
"""

from __future__ import annotations

from servesim.scheduler.kv.cross_attention import CrossAttentionManager
from servesim.scheduler.kv.single_type import FullAttentionManager, SingleTypeKVCacheManager, SlidingWindowManager
from servesim.scheduler.registry import Registry

MANAGERS: Registry[type[SingleTypeKVCacheManager]] = Registry("KV cache group kind")
MANAGERS.add("full", FullAttentionManager)
MANAGERS.add("sliding_window", SlidingWindowManager)
MANAGERS.add("cross_attention", CrossAttentionManager)
