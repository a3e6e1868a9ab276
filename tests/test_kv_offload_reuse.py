"""store_threshold: vLLM 0.19.1's FilterReusedOffloadingManager (v1/kv_offload/reuse_manager.py),
composed into the CPU tier's manager (scheduler/kv_offload/reuse.py). Parity with the real one:
tests/golden/offload_reuse*. And the pinned-memory ceiling: a tier larger than the host's memory."""

from __future__ import annotations

import pytest

from servesim.scheduler.kv_offload.config import OffloadConfig, make_offloading_connector
from servesim.scheduler.kv_offload.manager import CPUOffloadingManager
from servesim.scheduler.kv_offload.reuse import ReuseTracker
from servesim.simulator.config import SimConfig
from servesim.overrides import apply_overrides
from servesim.traces.errors import InputError

A, B, C, D = (bytes([i]) for i in range(4))


def test_lookups_count_every_given_hash_and_stores_keep_those_seen_threshold_times():
    m = CPUOffloadingManager(block_size=16, num_blocks=4, reuse=ReuseTracker(2))
    assert m.lookup([A, B, C]) == 0  # counted A, B, C once each (not only up to the first miss)
    out = m.prepare_store([A, B, C])
    assert out.block_hashes_to_store == [] and out.store_block_ids == []  # none seen twice yet
    assert m.lookup([A, B]) == 0
    out = m.prepare_store([A, B, C])  # A and B seen twice: stored; C once: skipped, takes no room
    assert (out.block_hashes_to_store, out.store_block_ids) == ([A, B], [0, 1])
    m.complete_store([A, B])
    assert m.lookup([A, B, C]) == 2 and m.reuse.counts == {A: 3, B: 3, C: 2}


def test_the_tracker_forgets_the_least_recently_counted_hash_first():
    t = ReuseTracker(2, max_tracker_size=2)
    t.record([A, B])
    t.record([A])  # A most recent: B is the least recently counted
    t.record([C])  # full: B leaves
    assert list(t.counts.items()) == [(A, 2), (C, 1)]
    assert t.eligible([C, B, A]) == [A]


def test_a_filtered_block_is_not_protected_from_the_stores_eviction():
    # vLLM's filter runs before the backing prepare_store, so only eligible hashes are protected: a
    # held block whose count the tracker forgot can be evicted by the very store that names it.
    m = CPUOffloadingManager(block_size=16, num_blocks=1, reuse=ReuseTracker(2, max_tracker_size=2))
    m.lookup([A])
    m.lookup([A])
    m.complete_store(m.prepare_store([A]).block_hashes_to_store)  # A held
    m.lookup([B])
    m.lookup([B])
    m.lookup([C])  # the tracker is full: A, least recently counted, is forgotten
    out = m.prepare_store([A, B])  # only B is eligible; A is not protected and makes room for it
    assert (out.block_hashes_to_store, out.block_hashes_evicted) == ([B], [A])
    plain = CPUOffloadingManager(block_size=16, num_blocks=1)
    plain.complete_store(plain.prepare_store([A]).block_hashes_to_store)
    assert plain.prepare_store([A, B]) is None  # without the filter A is protected: no room


@pytest.mark.parametrize("threshold, filtered", [(0, False), (1, False), (2, True), (5, True)])
def test_vllm_builds_the_filter_only_from_two(threshold, filtered):
    cfg = OffloadConfig(num_cpu_blocks=8, store_threshold=threshold)
    conn = make_offloading_connector(cfg, 16, True)
    assert (conn.manager.reuse is not None) == filtered
    if filtered:
        assert conn.manager.reuse.store_threshold == threshold and conn.manager.reuse.max_tracker_size == 64_000


def test_bad_thresholds_are_refused_with_vllms_reason():
    with pytest.raises(ValueError, match="max_tracker_size must be >= 1, got 0"):
        OffloadConfig(num_cpu_blocks=8, store_threshold=2, max_tracker_size=0)
    OffloadConfig(num_cpu_blocks=8, store_threshold=0, max_tracker_size=0)  # no filter: vLLM never checks it
    with pytest.raises(ValueError, match="store_threshold must be >= 0"):
        OffloadConfig(num_cpu_blocks=8, store_threshold=-1)
    with pytest.raises(ValueError, match="must be >= 2"):
        ReuseTracker(1)
    with pytest.raises(InputError) as err:
        apply_overrides(SimConfig(), {"kv_offload.kv_offloading_size": "8", "kv_offload.store_threshold": "2",
                                      "kv_offload.max_tracker_size": "0"})
    assert "max_tracker_size" in str(err.value)
    cfg = apply_overrides(SimConfig(), {"kv_offload.kv_offloading_size": "8", "kv_offload.store_threshold": "3"})
    assert cfg.kv_offload.offload_config().reuse_tracker().store_threshold == 3


def test_a_tier_larger_than_the_hosts_memory_is_refused():
    # h100-hgx: the DGX H100's 2 TB (2048 GiB) of system memory; Llama-3.1-8B's tier in GiB as given.
    from servesim.simulator.kv_offload import check_kv_offload  # simulator/startup.py runs it for every run

    ok = apply_overrides(SimConfig(), {"kv_offload.kv_offloading_size": "2048"})

    assert check_kv_offload(ok, ok.cache) == 2048 * 2**30 // (131072 * 16)
    with pytest.raises(InputError) as err:  # refused as the config is built (--set, YAML and the API alike)
        apply_overrides(SimConfig(), {"kv_offload.kv_offloading_size": "2049"})
    assert err.value.field == "kv_offload" and "h100-hgx" in str(err.value) and "2048" in err.value.allowed
    # a host whose memory is not cited is not checked
    pcie = apply_overrides(SimConfig(), {"kv_offload.kv_offloading_size": "4096", "hardware.gpu": "h100-pcie"})
    assert check_kv_offload(pcie, pcie.cache) > 0
