"""Which repository folders are installed under the `servesim` import name (read by setup.py too).

Stdlib only and import-free: setup.py runs this file by path before anything is installed.
"""

MAPPED_FOLDERS: tuple[str, ...] = ("scheduler", "simulator", "gpu_runner", "traces")
# Folders of data only, installed as servesim.<folder> too (no __init__.py: namespace packages whose
# files are package data): the shipped what-if library, so `servesim run NAME` and the notebooks find
# it from any folder, from a checkout or a wheel.
DATA_FOLDERS: tuple[str, ...] = ("scenarios",)
