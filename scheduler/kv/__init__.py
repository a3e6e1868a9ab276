"""Paged KV cache: blocks, the O(1) free queue, the block pool, per-type managers, coordinators."""
