"""SGLang-style scheduling (radix prefix cache, PrefillAdder, new_token_ratio, retraction) behind
the same scheduler interface as scheduler.Scheduler. Standard library only, like scheduler/."""

from servesim.scheduler.sglang.config import ORDERINGS, SGLangConfig
from servesim.scheduler.sglang.prefill_adder import AddReqResult, PrefillAdder, RoundInput
from servesim.scheduler.sglang.radix_cache import RadixCache, TokenToKVPool, TreeNode
from servesim.scheduler.sglang.scheduler import SGLangScheduler

__all__ = [
    "AddReqResult", "PrefillAdder", "RadixCache", "RoundInput", "ORDERINGS", "SGLangConfig",
    "SGLangScheduler", "TokenToKVPool", "TreeNode",
]
