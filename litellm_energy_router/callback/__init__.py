"""The LiteLLM callback (:class:`EnergyLogger`) and its non-blocking, spooling table writer."""

from .pending_row import CandidateMap, PendingRow, extract_row
from .logger import EnergyLogger
from .writer import TableWriter, query_id_for

__all__ = ["CandidateMap", "EnergyLogger", "PendingRow", "TableWriter", "extract_row", "query_id_for"]
