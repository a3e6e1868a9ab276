"""Issue 14: every pluggable kind is one Registry whose built-ins are the modules of one plug-in folder
(a new file there is found without a second edit), and one auto-detection rule for the kinds that
recognise input by content (trace formats, measured-run formats, profile importers)."""

from __future__ import annotations

import contextlib
import importlib
import sys

import pytest

from servesim.scheduler.registry import DetectionError, Registry
from servesim.traces.errors import InputError

# (registry, the folder whose every module is imported on the first lookup). docs/ARCHITECTURE.md's
# "Adding a pluggable kind" table names the same folders.
PLUGIN_FOLDERS = [
    ("servesim.scheduler.policies.base:SCHEDULING_POLICIES", "servesim.scheduler.policies"),
    ("servesim.simulator.cost_model.base:COST_MODELS", "servesim.simulator.cost_model"),
    ("servesim.traces.registry:FORMATS", "servesim.traces"),
    ("servesim.traces.synthetic:GENERATORS", "servesim.traces"),
    ("servesim.simulator.cluster.routers:ROUTERS", "servesim.simulator.cluster"),
    ("servesim.simulator.scheduler_kinds:ENGINES", "servesim.simulator.scheduler_kinds"),
    ("servesim.simulator.cost_model.importers:IMPORTERS", "servesim.simulator.cost_model.importers"),
    ("servesim.simulator.validation.runs:RUN_FORMATS", "servesim.simulator.validation"),
    ("servesim.scenario.backends:BACKENDS", "servesim.scenario"),
    ("servesim.simulator.summary_metrics:METRICS", "servesim.simulator.summary_metrics"),
    ("servesim.scheduler.sglang.config:ORDERINGS", "servesim.scheduler.sglang.policy"),
]


def _registry(where: str) -> Registry:
    module, name = where.split(":")
    return getattr(importlib.import_module(module), name)


@pytest.mark.parametrize("where, folder", PLUGIN_FOLDERS)
def test_each_kind_loads_its_plugin_folder(where, folder):
    reg = _registry(where)
    assert isinstance(reg, Registry) and reg.plugins == folder
    assert reg.names(), f"{where}: no built-ins registered from {folder}"


def test_architecture_doc_names_each_plugin_folder():
    from pathlib import Path

    doc = (Path(__file__).parents[1] / "docs" / "ARCHITECTURE.md").read_text()
    table = doc[doc.index("## Adding a pluggable kind"):doc.index("**One auto-detection rule.**")]
    for _where, folder in PLUGIN_FOLDERS:
        path = folder.removeprefix("servesim.").replace(".", "/")
        if path.startswith("scenario"):
            path = "servesim/" + path  # servesim's own modules live in servesim/ itself
        shown = f"`{path}.py`" if path.endswith("/policy") else f"`{path}/`"  # SGLang: one module
        assert shown in table, f"docs/ARCHITECTURE.md's plug-in table does not name {shown}"


def test_a_new_file_in_the_folder_is_found(tmp_path, monkeypatch):
    """The mechanism every kind uses: drop a module into the plug-in package, look a name up."""
    pkg = tmp_path / "toy_plugins"
    pkg.mkdir()
    (pkg / "__init__.py").write_text(
        "from servesim.scheduler.registry import Registry\n"
        "WIDGETS = Registry('widget', plugins='toy_plugins')\n")
    (pkg / "blue.py").write_text("from toy_plugins import WIDGETS\nWIDGETS.add('blue', 1)\n")
    (pkg / "_private.py").write_text("raise RuntimeError('modules starting with _ are not plug-ins')\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    try:
        widgets = importlib.import_module("toy_plugins").WIDGETS
        assert widgets.find("blue") is None  # nothing imported before the first lookup
        (pkg / "green.py").write_text("from toy_plugins import WIDGETS\nWIDGETS.add('green', 2)\n")
        assert widgets.names() == ["blue", "green"] and widgets.get("green") == 2
    finally:
        for name in [m for m in sys.modules if m == "toy_plugins" or m.startswith("toy_plugins.")]:
            del sys.modules[name]


@contextlib.contextmanager
def _restored(reg: Registry):
    """Entries registered inside the block are dropped afterwards (built-ins loaded first)."""
    reg.names()
    saved = dict(reg._entries)
    try:
        yield reg
    finally:
        reg._entries.clear()
        reg._entries.update(saved)


# --- one detection rule ------------------------------------------------------------------------------
def _toys() -> Registry:
    reg: Registry[str] = Registry("widget format")
    for name in ("alpha", "beta", "gamma"):
        reg.add(name, name)
    return reg


def test_detect_exactly_one_match_wins():
    assert _toys().detect(lambda name, _e: name == "beta", subject="x.bin", explicit="--format NAME") == "beta"


def test_detect_several_matches_is_an_error_naming_them():
    with pytest.raises(DetectionError) as e:
        _toys().detect(lambda name, _e: name != "gamma", subject="x.bin", explicit="--format NAME")
    assert str(e.value) == ("ambiguous widget format for x.bin: alpha, beta all match; pass one with "
                            "--format NAME (valid: alpha, beta, gamma)")


def test_detect_no_match_lists_the_formats():
    with pytest.raises(DetectionError) as e:
        _toys().detect(lambda _n, _e: False, subject="x.bin", explicit="--format NAME",
                       tried=lambda name, _e: f"{name} (needs {name}.json)")
    assert str(e.value) == ("cannot tell the widget format of x.bin: none matches; tried alpha (needs alpha.json); "
                            "beta (needs beta.json); gamma (needs gamma.json); pass one with --format NAME "
                            "(valid: alpha, beta, gamma)")


def test_detect_more_specific_match_wins_and_ties_are_ambiguous():
    scores = {"alpha": 2, "beta": 3, "gamma": 0}
    assert _toys().detect(lambda n, _e: scores[n], subject="x", explicit="-f") == "beta"
    scores["alpha"] = 3
    with pytest.raises(DetectionError, match="alpha, beta all match"):
        _toys().detect(lambda n, _e: scores[n], subject="x", explicit="-f")


def test_trace_formats_ambiguous_and_no_match(tmp_path):
    from servesim.traces.formats import sniff_format
    from servesim.traces.registry import FORMATS, register_format

    with _restored(FORMATS):
        for name in ("twin_a", "twin_b"):
            register_format(name, signatures=(("zz_a", "zz_b"),), encodings=("jsonl",))(lambda path: None)
        f = tmp_path / "t.jsonl"
        f.write_text('{"zz_a": 1, "zz_b": 2}\n')
        with pytest.raises(InputError) as e:
            sniff_format(f)
        assert e.value.field == "fmt" and e.value.path == str(f)
        assert "ambiguous trace format for a jsonl file with zz_a, zz_b: twin_a, twin_b all match; " \
               "pass one with --format NAME" in str(e.value)
        g = tmp_path / "u.jsonl"
        g.write_text('{"qq": 1}\n')
        with pytest.raises(InputError) as e:
            sniff_format(g)
        assert "cannot tell the trace format of a jsonl file with qq: none matches; tried " in str(e.value)
        assert "twin_a (needs {zz_a, zz_b})" in str(e.value) and "pass one with --format NAME" in str(e.value)
        assert "canonical" in e.value.allowed and "twin_b" in e.value.allowed


def test_run_formats_ambiguous_and_no_match(tmp_path):
    from servesim.simulator.validation.runs import RUN_FORMATS, detect_run_format, register_run_format

    with _restored(RUN_FORMATS):
        for name in ("lab_a", "lab_b"):
            register_run_format(name, lambda p: (p / "lab.json").is_file())(lambda p: None)
        (tmp_path / "lab.json").write_text("{}")
        with pytest.raises(InputError) as e:
            detect_run_format(tmp_path)
        assert e.value.field == "run_format"
        assert f"ambiguous run format for run folder {tmp_path.name!r}: lab_a, lab_b all match; " \
               "pass one with --run-format NAME" in str(e.value)
        empty = tmp_path / "empty"
        empty.mkdir()
        with pytest.raises(InputError) as e:
            detect_run_format(empty)
        assert "cannot tell the run format of run folder 'empty': none matches; pass one with --run-format NAME" \
            in str(e.value)
        assert e.value.allowed == "lab_a, lab_b, llmservingsim, servesim" and e.value.path == str(empty)


def test_profile_importers_ambiguous_and_no_match(tmp_path):
    from servesim.simulator.cost_model.importers import IMPORTERS, detect_source, register_importer

    with _restored(IMPORTERS):
        f = tmp_path / "x.twin.txt"
        f.write_text("hello\n")
        with pytest.raises(InputError) as e:
            detect_source(f)
        assert e.value.field == "source"
        assert "cannot tell the profile source of x.twin.txt: none matches; pass one with --source NAME" \
            in str(e.value)
        for name in ("twin_a", "twin_b"):
            register_importer(name, lambda p: p.name.endswith(".twin.txt"))(lambda p: None)
        with pytest.raises(InputError) as e:
            detect_source(f)
        assert "ambiguous profile source for x.twin.txt: twin_a, twin_b all match; pass one with --source NAME" \
            in str(e.value)
