"""Ingest: from a received EPISODES body to training data (see pipeline.py for the stages).

Nothing is imported here: decode workers import ``decode_pool`` and ``record_decode``
from this package, and must not load torch with it.
"""
