"""The LiteLLM callback (:class:`EnergyLogger`) and its non-blocking, spooling table writer."""

from .pending_row import CandidateMap, PendingRow, extract_row
from .logger import EnergyLogger
from ..table.production import query_id_for
from .writer import TableWriter

__all__ = ["CandidateMap", "EnergyLogger", "PendingRow", "TableWriter", "extract_row", "query_id_for"]
