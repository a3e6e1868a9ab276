"""The parts of tools/gpu_check.py (`make gpu-check`); its docstring states what each does and its
time budget. One module per part; part.py holds the per-part record and the time box."""
