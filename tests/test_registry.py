"""scheduler.registry.Registry: one registry type; duplicates refused; unknown names get a did-you-mean."""

from __future__ import annotations

import pytest

from servesim.scheduler.registry import Registry, UnknownNameError, did_you_mean
from servesim.traces.errors import InputError, field_error


def test_register_get_names_and_duplicates():
    reg: Registry[int] = Registry("widget")
    reg.add("alpha", 1)
    reg.register("beta")(2)
    reg.add("alpha", 1)  # the same entry again: a no-op (modules may be imported twice)
    assert reg.names() == ["alpha", "beta"] and reg.get("beta") == 2 and "alpha" in reg
    with pytest.raises(ValueError, match="widget 'alpha' is already registered"):
        reg.add("alpha", 3)


def test_unknown_name_lists_valid_names_and_suggests():
    reg: Registry[int] = Registry("widget")
    reg.add("round_robin", 1)
    reg.add("least_loaded", 2)
    with pytest.raises(UnknownNameError) as e:
        reg.get("round-robn", extra=("auto",))
    assert "did you mean 'round_robin'?" in str(e.value)
    assert e.value.allowed == "auto, least_loaded, round_robin"
    with pytest.raises(UnknownNameError) as e:
        reg.get("zzz")
    assert "did you mean" not in str(e.value)


def test_error_factory_and_lazy_loader():
    calls = []
    reg: Registry[int] = Registry("gadget", loader=lambda: calls.append(reg.add("late", 7)),
                                  error=field_error("--gadget"))
    assert calls == []
    assert reg.get("late") == 7 and len(calls) == 1
    with pytest.raises(InputError, match="--gadget.*unknown gadget 'lat'; did you mean 'late'"):
        reg.get("lat")


@pytest.mark.parametrize("lookup, name, guess", [
    ("servesim.simulator.cost_model:make_cost_model", "roofine", "roofline"),
    ("servesim.simulator.scheduler_kinds:make_engine_scheduler", "sglng", "sglang"),
    ("servesim.simulator.specs:resolve_gpu", "h10O", "h100"),
    ("servesim.simulator.specs:resolve_model", "llama-3.1-8c", "llama-3.1-8b"),
    ("servesim.traces.registry:get_format", "mooncak", "mooncake"),
    ("servesim.simulator.cluster.routers:make_router", "round_robn", "round_robin"),
    ("servesim.scenario.backends:get_backend", "rey", "ray"),
    ("servesim.scheduler.policies:SCHEDULING_POLICIES", "priorty", "priority"),
])
def test_every_registry_suggests(lookup, name, guess):
    import importlib

    module, fn = lookup.split(":")
    with pytest.raises(ValueError) as e:
        f = getattr(importlib.import_module(module), fn)
        f = f.get if isinstance(f, Registry) else f
        f(name, None, None) if fn == "make_engine_scheduler" else f(name)
    assert f"did you mean {guess!r}" in str(e.value)


def test_did_you_mean_is_case_insensitive():
    assert did_you_mean("H100", ["h100", "a100"]) == "h100"


def test_kv_cache_group_kinds_are_a_registry_with_did_you_mean():
    from servesim.scheduler.kv.coordinator import KVCacheCoordinator
    from servesim.scheduler.kv.kinds import MANAGERS
    from servesim.scheduler.kv.single_type import KVCacheGroupSpec

    assert {"full", "sliding_window"} <= set(MANAGERS.names())
    with pytest.raises(ValueError, match="unknown KV cache group kind 'slidng_window'; did you mean 'sliding_window'"):
        KVCacheCoordinator([KVCacheGroupSpec(kind="slidng_window", block_size=16, sliding_window=64)], 10,
                           enable_caching=True, use_eagle=False, enable_kv_cache_events=False)
