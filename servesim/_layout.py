"""Which repository folders are installed under the `servesim` import name (read by setup.py too).

Stdlib only and import-free: setup.py runs this file by path before anything is installed.
"""

MAPPED_FOLDERS: tuple[str, ...] = ("scheduler", "simulator", "gpu_runner", "traces")
