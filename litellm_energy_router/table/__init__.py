"""The tournament table: every query x every candidate, with correctness, latency, tokens and joules.

This package knows nothing above it (no profiling, training, router or LiteLLM imports).
"""

from .rows import (
    ENERGY_METHODS,
    SOURCES,
    BadRowError,
    Candidate,
    Query,
    Run,
    make_query,
    text_hash,
)
from .store import CandidateStats, SQLStore, TableError, TableStore, WriteResult, check_table_url, open_store

__all__ = [
    "ENERGY_METHODS", "SOURCES", "BadRowError", "Candidate", "CandidateStats", "Query", "Run",
    "SQLStore", "TableError", "TableStore", "WriteResult", "check_table_url", "make_query", "open_store", "text_hash",
]
