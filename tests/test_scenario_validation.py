"""Scenario files are validated before anything runs: errors name the file, the line and the key."""

from __future__ import annotations

import textwrap
from pathlib import Path

import pytest

from servesim.scenario import load_scenario
from servesim.scenario.schema import SchemaError
from servesim.traces.errors import InputError

GEN = "workload: {generator: poisson, num_requests: 8}\n"


def write(tmp_path: Path, text: str, name: str = "s.yaml") -> Path:
    path = tmp_path / name
    path.write_text(textwrap.dedent(text))
    return path


def error_of(path_or_dict, **kw) -> InputError:
    with pytest.raises(InputError) as info:
        load_scenario(path_or_dict, **kw)
    return info.value


def test_unknown_nested_key_names_file_line_and_suggests(tmp_path):
    path = write(tmp_path, GEN + "scheduler:\n  max_num_seqs: 8\n  max_num_batchd_tokens: 64\n")
    err = error_of(path)
    assert isinstance(err, SchemaError)
    assert err.path == str(path.resolve()) and err.line == 4
    assert err.field == "scheduler.max_num_batchd_tokens"
    assert "did you mean max_num_batched_tokens" in str(err)
    assert "max_num_seqs" in err.allowed  # the valid keys are listed


def test_unknown_top_level_and_workload_keys(tmp_path):
    err = error_of(write(tmp_path, GEN + "schedular: {policy: fcfs}\n"))
    assert err.line == 2 and "did you mean scheduler" in str(err)
    err = error_of(write(tmp_path, "workload:\n  generator: poisson\n  arival: {rate_per_s: 2}\n"))
    assert err.line == 3 and err.field == "workload.arival" and "did you mean arrival" in str(err)
    err = error_of(write(tmp_path, "workload:\n  generator: poisson\n  arrival: {rate: 2}\n"))
    assert err.field == "workload.arrival.rate" and "rate_per_s" in str(err)


def test_unknown_key_in_a_sweep_points_at_the_sweep_line(tmp_path):
    path = write(tmp_path, GEN + "sweep:\n  cache.blok_size: [16, 32]\n")
    err = error_of(path)
    assert isinstance(err, SchemaError) and err.line == 3 and "did you mean block_size" in str(err)


@pytest.mark.parametrize("body, field, line, words", [
    ("scheduler:\n  max_num_seqs: lots\n", "scheduler.max_num_seqs", 3, "expected an integer"),
    ("cache:\n  block_size: 0\n", "cache.block_size", 3, "block_size must be >= 1"),
    ("scheduler:\n  max_num_seqs: 256\n  max_num_batched_tokens: 128\n", "scheduler.max_num_batched_tokens", 4,
     "max_num_batched_tokens (128) must be greater than or equal to max_num_seqs (256)"),
    ("cache:\n  num_gpu_blocks: 1\n", "cache.num_gpu_blocks", 3, "num_gpu_blocks must be >= 2"),
    ("cache:\n  num_gpu_blocks: 20\n", "cache.num_gpu_blocks", 3,
     "To serve at least one request with the model's max seq len (131072)"),
    ("hardware:\n  model: llama-9000\n", "hardware.model", 3, "llama-9000"),
    ("hardware:\n  gpu: h1000\n", "hardware.gpu", 3, "h1000"),
    ("engine: tgi\n", "engine", 2, "not available"),
    ("hardware:\n  model: llama-3.1-70b\n  gpu: rtx4090\n", "hardware", 2, "does not fit"),
    ("spec_decode:\n  acceptance: [0.5]\n", "spec_decode.acceptance", 3, "num_spec_tokens is 0"),
])
def test_impossible_values_say_which_and_why(tmp_path, body, field, line, words):
    err = error_of(write(tmp_path, GEN + body))
    assert err.field == field and err.line == line, str(err)
    assert words in str(err)


def test_workload_errors(tmp_path):
    err = error_of(write(tmp_path, "workload: {trace: nowhere.jsonl}\n"))
    assert err.field == "workload.trace" and "not found" in str(err) and err.line == 1
    err = error_of(write(tmp_path, "workload: {generator: zipfian}\n"))
    assert err.field == "workload.generator" and "poisson" in err.allowed
    err = error_of(write(tmp_path, "workload:\n  generator: poisson\n  prompt_len: {dist: uniform, low: 9, high: 3}\n"))
    assert err.field == "workload.prompt_len.high" and err.line == 3
    err = error_of(write(tmp_path, "seed: 1\n"))
    assert "needs a `workload:` section" in str(err)
    err = error_of(write(tmp_path, "workload: {trace: sharegpt-300, generator: poisson}\n"))
    assert "exactly one" in str(err)


def test_yaml_syntax_and_duplicate_keys(tmp_path):
    err = error_of(write(tmp_path, GEN + "cache: {block_size: 16\n"))
    assert "not valid YAML" in str(err) and err.line is not None
    err = error_of(write(tmp_path, GEN + "seed: 1\nseed: 2\n"))
    assert "duplicate key" in str(err) and err.line == 3


def test_extends_deep_merges_relative_to_the_file(tmp_path):
    (tmp_path / "lib").mkdir()
    write(tmp_path, GEN + "scheduler: {max_num_seqs: 32, policy: priority, max_model_len: 8192}\n"
          "cache: {num_gpu_blocks: 4000}\n",
          "lib/base.yaml")
    child = write(tmp_path, "extends: lib/base.yaml\nscheduler: {max_num_seqs: 64}\n")
    cfg = load_scenario(child).variants[0].cfg
    assert cfg.scheduler.max_num_seqs == 64 and cfg.scheduler.policy == "priority"  # merged, not replaced
    assert cfg.cache.num_gpu_blocks == 4000 and not cfg.derive_num_gpu_blocks
    # a workload naming its source replaces the inherited one instead of merging into it
    child = write(tmp_path, "extends: lib/base.yaml\nworkload: {trace: sharegpt-300, max_requests: 4}\n", "c2.yaml")
    assert load_scenario(child).variants[0].workload.trace == "sharegpt-300"
    # an error in the parent names the parent's file and line
    write(tmp_path, GEN + "cache: {block_sise: 16}\n", "lib/bad.yaml")
    err = error_of(write(tmp_path, "extends: lib/bad.yaml\n", "c3.yaml"))
    assert err.path.endswith("lib/bad.yaml") and err.line == 2


def test_extends_cycle_and_missing_parent(tmp_path):
    write(tmp_path, "extends: b.yaml\n" + GEN, "a.yaml")
    write(tmp_path, "extends: a.yaml\n", "b.yaml")
    assert "cycle" in str(error_of(tmp_path / "a.yaml"))
    assert "not found" in str(error_of(write(tmp_path, "extends: gone.yaml\n", "c.yaml")))


def test_grid_and_zip_expansion(tmp_path):
    path = write(tmp_path, GEN + textwrap.dedent("""\
        sweep:
          cache.block_size: [16, 32]
          zip:
            scheduler.num_spec_tokens: [0, 2, 3]
            spec_decode.acceptance: [[], [0.8, 0.5], [0.9, 0.8, 0.7]]
        """))
    sc = load_scenario(path)
    assert len(sc.variants) == 6 and not sc.failed
    pairs = {(v.cfg.cache.block_size, v.cfg.scheduler.num_spec_tokens, len(v.cfg.spec_decode.acceptance))
             for v in sc.variants}
    assert pairs == {(b, k, k) for b in (16, 32) for k in (0, 2, 3)}  # zip keeps the pairs together
    assert len({v.key for v in sc.variants}) == 6 and len({v.name for v in sc.variants}) == 6
    bad = write(tmp_path, GEN + "sweep:\n  zip:\n    seed: [1, 2]\n    cache.block_size: [16]\n", "z.yaml")
    assert "differ in length" in str(error_of(bad))
    twice = write(tmp_path, GEN + "sweep:\n  seed: [1, 2, 1]\n", "twice.yaml")
    err = error_of(twice)
    assert "listed twice" in str(err) and err.line == 3


def test_an_impossible_sweep_value_fails_only_its_variant(tmp_path):
    path = write(tmp_path, GEN + "sweep:\n  cache.block_size: [16, 0]\n")
    sc = load_scenario(path)
    assert [v.error is None for v in sc.variants] == [True, False]
    assert "line 3" in sc.variants[1].error and "block_size must be >= 1" in sc.variants[1].error
    assert "sweep point: cache.block_size=0" in sc.variants[1].error
    with pytest.raises(InputError):  # every variant impossible: that is the scenario's error
        load_scenario(write(tmp_path, GEN + "sweep:\n  cache.block_size: [0, -1]\n", "all_bad.yaml"))


def test_set_overrides_pin_or_replace_axes(tmp_path):
    path = write(tmp_path, GEN + "sweep:\n  cache.block_size: [16, 32]\n  seed: [1, 2]\n")
    sc = load_scenario(path, sets=["scheduler.max_num_seqs=8", "scheduler.max_num_batched_tokens=64",
                                   "cache.block_size=64"])
    assert len(sc.variants) == 2 and sc.notes  # block_size pinned: its axis is gone
    assert {v.cfg.cache.block_size for v in sc.variants} == {64}
    assert {v.cfg.scheduler.max_num_seqs for v in sc.variants} == {8}
    sc = load_scenario(path, sets=["sweep.cache.block_size=[16, 32, 128]"])
    assert len(sc.variants) == 6 and [a.keys for a in sc.axes][0] == ("cache.block_size",)
    err = error_of(path, sets=["scheduler.max_num_seq=8"])
    assert err.path == "--set" and "did you mean max_num_seqs" in str(err)


def test_dict_scenarios_and_variant_yaml_round_trip(tmp_path):
    sc = load_scenario({"workload": {"generator": "poisson", "num_requests": 5}, "sweep": {"seed": [1, 2]}})
    assert [v.cfg.seed for v in sc.variants] == [1, 2]
    assert [v.workload.seed for v in sc.variants] == [1, 2]  # the generator follows the top-level seed
    import yaml

    for v in sc.variants:  # variant.yaml reloads to the same configuration (same hash)
        path = write(tmp_path, yaml.safe_dump(v.resolved(sc)), f"{v.name}.yaml")
        assert load_scenario(path).variants[0].key == v.key


def test_smoke_caps_requests_and_changes_the_hash(tmp_path):
    path = write(tmp_path, "workload: {generator: sessions, num_requests: 400}\nsmoke: {seed: 3}\n")
    full, smoke = load_scenario(path), load_scenario(path, smoke=True)
    assert smoke.variants[0].workload.params["num_requests"] <= 16 and smoke.variants[0].cfg.seed == 3
    assert full.variants[0].key != smoke.variants[0].key


def test_shipped_scenarios_validate():
    root = Path(__file__).resolve().parents[1] / "scenarios"
    files = sorted(root.glob("*.yaml"))
    assert len([f for f in files if not f.name.startswith("_")]) >= 9
    for f in files:
        sc = load_scenario(f)
        head = f.read_text().lstrip()
        assert head.startswith("#"), f"{f.name}: the header comment says what it answers"
        if not f.name.startswith("_"):
            assert "QUESTION" in head and "HOW TO READ" in head, f.name
            assert len(sc.variants) >= 2, f.name


def test_a_model_config_json_is_found_next_to_the_file_that_names_it(tmp_path, monkeypatch):
    """hardware.model: a config.json (or its folder) relative to the scenario that wrote it, as a
    trace is; from a parent scenario, relative to the parent. Names stay names."""
    import json

    (tmp_path / "lib" / "m").mkdir(parents=True)
    (tmp_path / "lib" / "m" / "config.json").write_text(json.dumps({
        "model_type": "llama", "num_hidden_layers": 4, "hidden_size": 256, "num_attention_heads": 4,
        "num_key_value_heads": 2, "intermediate_size": 512, "vocab_size": 1000, "max_position_embeddings": 4096}))
    write(tmp_path, GEN + "hardware: {model: m/config.json}\n", "lib/base.yaml")
    child = write(tmp_path, "extends: lib/base.yaml\n")
    direct = write(tmp_path, GEN + "hardware: {model: lib/m}\n", "d.yaml")
    monkeypatch.chdir(tmp_path / "lib" / "m")  # anywhere but the scenarios' folders
    want = str((tmp_path / "lib" / "m" / "config.json").resolve())
    assert load_scenario(child).variants[0].cfg.hardware.model == want
    assert load_scenario(direct).variants[0].cfg.hardware.model == str((tmp_path / "lib" / "m").resolve())
    named = write(tmp_path, GEN + "hardware: {model: llama-3.1-8b}\n", "n.yaml")
    assert load_scenario(named).variants[0].cfg.hardware.model == "llama-3.1-8b"


def test_a_fitted_cost_model_file_is_found_next_to_the_scenario(tmp_path, monkeypatch):
    """cost_model.params.path (a `servesim fit` file) relative to the scenario, like a trace."""
    import gzip

    from servesim.simulator.cost_model.calibrated import __file__ as calibrated_init

    fit = Path(calibrated_init).parent / "llama-3.1-8b__h100__tp1.json.gz"
    (tmp_path / "fits").mkdir()
    (tmp_path / "fits" / "m.json").write_bytes(gzip.decompress(fit.read_bytes()))
    scenario = write(tmp_path, GEN + "cost_model: {name: profiled, params: {path: fits/m.json}}\n")
    monkeypatch.chdir(Path(calibrated_init).parent)  # anywhere but the scenario's folder
    cfg = load_scenario(scenario).variants[0].cfg
    assert cfg.cost_model.params["path"] == str((tmp_path / "fits" / "m.json").resolve())


def test_a_host_collectives_profile_is_found_next_to_the_scenario_and_the_cluster(tmp_path, monkeypatch):
    """cost_model.params.collectives_profile / allreduce_profile relative to the YAML naming them."""
    from servesim.simulator.cluster import ClusterConfig
    from servesim.simulator.cost_model.profile_schema import make_profile, write_profile

    rows = [{"source": "servesim", "gpu": "h100", "op": op, "tp": 2, "bytes": b, "latency_s": 1e-5 * b / 1024}
            for op in ("allreduce", "alltoall", "sendrecv") for b in (1024, 4096, 65536)]
    (tmp_path / "host").mkdir()
    write_profile(make_profile(rows), tmp_path / "host" / "coll.csv")
    want = str((tmp_path / "host" / "coll.csv").resolve())
    scenario = write(tmp_path, GEN + "hardware: {tp: 2}\n"
                     "cost_model: {name: roofline, params: {collectives_profile: host/coll.csv}}\n")
    monkeypatch.chdir(Path(__file__).parent)  # anywhere but the YAML's folder
    cfg = load_scenario(scenario).variants[0].cfg
    assert cfg.cost_model.params["collectives_profile"] == want
    cluster = tmp_path / "cluster.yaml"
    cluster.write_text("base: {hardware: {tp: 2}, cost_model: {name: roofline, params: "
                       "{allreduce_profile: host/coll.csv}}}\nreplicas: [{count: 1}]\n")
    (group,) = ClusterConfig.from_yaml(cluster).replicas
    assert group.sim.cost_model.params["allreduce_profile"] == want
