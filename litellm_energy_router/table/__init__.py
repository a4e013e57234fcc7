"""The tournament table: every query x every candidate, with correctness, latency, tokens and joules.

This package knows nothing above it (no profiling, training, router or LiteLLM imports).
"""

from litellm_energy_router.table.rows import (
    ENERGY_METHOD_PATTERN,
    SOURCES,
    BadRowError,
    Candidate,
    Query,
    Run,
    make_query,
    text_hash,
)
from litellm_energy_router.table.store import (
    CandidateStats,
    SQLStore,
    TableError,
    TableStore,
    WriteResult,
    check_table_url,
    open_store,
)

__all__ = [
    "ENERGY_METHOD_PATTERN",
    "SOURCES",
    "BadRowError",
    "Candidate",
    "CandidateStats",
    "Query",
    "Run",
    "SQLStore",
    "TableError",
    "TableStore",
    "WriteResult",
    "make_query",
    "check_table_url",
    "open_store",
    "text_hash",
]
