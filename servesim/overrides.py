"""`--set a.b=c`: override any field of the configuration tree by its dotted path.

The implementation lives with the config-tree builder (simulator/config_values.py), so the
simulator's own loaders (validate's replay config) apply `--set` the same way."""

from servesim.simulator.config_values import apply_overrides, split_set_items

__all__ = ["apply_overrides", "split_set_items"]
