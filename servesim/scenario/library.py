"""The shipped what-if library: the repository's scenarios/ folder, installed as the data package
`servesim.scenarios` (servesim/_layout.py DATA_FOLDERS), so a scenario is found by name from any
folder, in a checkout or an installed wheel.

    scenario_path("kv_size_preemptions")          # -> .../scenarios/kv_size_preemptions.yaml
    servesim run kv_size_preemptions              # a name where no such file exists
    run_scenario("kv_size_preemptions")            # the same from Python

Names are paths below the folder without `.yaml` ("plan/llama8b_h100_sharegpt"); files starting
with "_" are bases other scenarios extend, not listed. scenarios/cluster/ holds cluster configs
(`servesim cluster`), reached with library_path("cluster/NAME").
"""

from __future__ import annotations

from pathlib import Path

from servesim.scheduler.registry import unknown_name_message
from servesim.traces.errors import InputError


def library_dir() -> Path:
    """The folder the library is installed in (one location: a checkout's or the wheel's)."""
    import servesim.scenarios as package

    return Path(next(iter(package.__path__)))


def library_names() -> list[str]:
    root = library_dir()
    return sorted(p.relative_to(root).with_suffix("").as_posix() for p in root.rglob("*.yaml")
                  if not p.name.startswith("_"))


def library_path(name: str) -> Path:
    """The file of library entry `name` (".yaml" optional); an InputError listing the names otherwise."""
    stem = name[:-5] if name.endswith(".yaml") else name
    names = library_names()
    if stem not in names:
        raise InputError(unknown_name_message("library scenario", stem, names), field="scenario",
                         allowed=", ".join(names))
    return library_dir() / f"{stem}.yaml"


def scenario_names() -> list[str]:
    """The what-if scenarios (top level: cluster/ and plan/ hold `servesim cluster` and `plan` files)."""
    return [n for n in library_names() if "/" not in n]


def scenario_path(name: str) -> Path:
    """A what-if scenario of the library by name (".yaml" optional)."""
    stem = name[:-5] if name.endswith(".yaml") else name
    if stem not in scenario_names():
        kind = "a cluster or plan config, not a scenario" if stem in library_names() else None
        raise InputError(kind or unknown_name_message("library scenario", stem, scenario_names()),
                         field="scenario", allowed=", ".join(scenario_names()))
    return library_dir() / f"{stem}.yaml"


def resolve_scenario(src: str | Path) -> Path:
    """`src` as given when it names a file or has a suffix (the reader names it if it is missing);
    a bare name that is no file: the library scenario of that name, or an error listing them."""
    path = Path(src).expanduser()
    if path.exists() or path.suffix or isinstance(src, Path) and len(path.parts) > 1:
        return path
    try:
        return scenario_path(str(src))
    except InputError as exc:
        raise InputError(f"no file {str(src)!r} here, and {exc.detail}", path=str(path), field="scenario",
                         allowed="a scenario file, or a library name: " + (exc.allowed or "")) from None


SHARED_DATA_ENV = "SERVESIM_SHARED_DATA"


def shared_data_dir() -> Path | None:
    """The shared measurements and traces folder the validation notebooks and benchmarks read:
    $SERVESIM_SHARED_DATA when set, else `shared/data` beside the checkout servesim runs from;
    None when neither exists (never a machine-specific default)."""
    import os

    import servesim

    if os.environ.get(SHARED_DATA_ENV):
        found = Path(os.environ[SHARED_DATA_ENV]).expanduser()
        return found if found.is_dir() else None
    beside = Path(servesim.__file__).resolve().parents[2] / "shared" / "data"
    return beside if beside.is_dir() else None


__all__ = ["shared_data_dir", "library_dir", "library_names", "library_path", "resolve_scenario", "scenario_names", "scenario_path"]
