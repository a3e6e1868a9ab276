"""Reading the shipped spec files (gpus.yaml, models.yaml), which every run reads at start-up.

PyYAML's pure-Python parser took ~0.09 s for the two files, a third of what the bundled replay
spends outside its simulation on a slow machine; libyaml's parser (PyYAML's C extension, in its
wheels) takes ~0.01 s. The constructor is the same SafeConstructor either way, so the values
are the same (tests/test_specs.py compares them).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

# PyYAML built without libyaml has no C loader: its pure-Python parser gives the same values.
_LOADER = yaml.CSafeLoader if yaml.__with_libyaml__ else yaml.SafeLoader


def load_spec_file(path: Path) -> Any:
    """The YAML document in `path`, as yaml.safe_load would return it."""
    return yaml.load(path.read_text(), Loader=_LOADER)
