"""Stage 1 of the table writer: settle each row's energy with the per-request meter.

A row waits (up to ``settle_timeout_s``) until the meter can say what the request cost; on a flush, on
close, or when too many rows wait, the meter is asked for its final answer with what it knows.
"""

from __future__ import annotations

import logging
import time

from litellm_energy_router.energy.meter import (
    RequestEnergy,
    RequestEnergyMeter,
    RequestUsage,
)
from litellm_energy_router.litellm_glue.callback.pending_row import PendingRow

log = logging.getLogger("litellm_energy_router.litellm_glue.callback")


class EnergySettler:
    """Args: ``meter`` (the per-request energy meter); ``settle_timeout_s``: max seconds a row waits for
    settled energy, s; ``max_waiting``: rows beyond this many (oldest first) are settled at once."""

    def __init__(self, meter: RequestEnergyMeter, settle_timeout_s: float, max_waiting: int) -> None:
        self.meter = meter
        self.settle_timeout_s = settle_timeout_s
        self.max_waiting = max_waiting

    def energy(self, row: PendingRow, final: bool) -> RequestEnergy | None:
        """The row's energy (J); ``None`` while not settled and not ``final``. A meter that fails gives
        :meth:`RequestEnergy.unavailable` on the final call: a meter bug never loses the row."""
        usage = RequestUsage(
            request_id=row.call_id,
            candidate=row.candidate,
            start_s=row.start_s,
            end_s=row.end_s,
            first_token_s=row.first_token_s,
            prompt_tokens=row.prompt_tokens,
            completion_tokens=row.completion_tokens,
            backend_id=row.backend_id,
        )
        try:
            return self.meter.energy_for_request(usage, final=final)
        except Exception as e:  # noqa: BLE001 - a meter bug must not lose the row
            log.warning("energy-router: meter %s failed for %s: %s", getattr(self.meter, "name", "?"), row.call_id, e)
            return RequestEnergy.unavailable() if final else None

    def settle(
        self,
        pending: list[PendingRow],
        *,
        final: bool,
    ) -> tuple[list[tuple[PendingRow, RequestEnergy]], list[PendingRow]]:
        """Split ``pending`` (oldest first) into (settled rows with their energy, rows still waiting)."""
        now = time.time()
        overflow = len(pending) - self.max_waiting
        settled: list[tuple[PendingRow, RequestEnergy]] = []
        waiting: list[PendingRow] = []
        for i, row in enumerate(pending):
            force = final or i < overflow or now - row.submitted_s > self.settle_timeout_s
            e = self.energy(row, force)
            if e is None:
                waiting.append(row)
            else:
                settled.append((row, e))
        return settled, waiting
