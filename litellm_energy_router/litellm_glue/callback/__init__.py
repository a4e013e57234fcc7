"""The LiteLLM callback (:class:`EnergyLogger`) and its non-blocking, spooling table writer."""

from litellm_energy_router.litellm_glue.callback.logger import EnergyLogger
from litellm_energy_router.litellm_glue.callback.pending_row import (
    CandidateMap,
    PendingRow,
    extract_row,
)
from litellm_energy_router.litellm_glue.callback.writer import TableWriter
from litellm_energy_router.table.production import query_id_for

__all__ = ["CandidateMap", "EnergyLogger", "PendingRow", "TableWriter", "extract_row", "query_id_for"]
