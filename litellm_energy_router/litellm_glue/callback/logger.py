"""``EnergyLogger``: the LiteLLM callback that feeds production traffic into the tournament table.

Register it with the SDK (``litellm.callbacks = [EnergyLogger()]``) or the proxy
(``litellm_settings.callbacks: ["litellm_energy_router.litellm_glue.callback.proxy_logger.energy_logger"]``).

LiteLLM (1.110) calls ``async_log_success_event`` / ``async_log_failure_event`` on the event loop for
async calls and ``log_success_event`` / ``log_failure_event`` on its logging thread for sync calls,
with keyword arguments ``kwargs, response_obj, start_time, end_time``; ``log_pre_api_call`` runs on the
calling thread before each backend call. Every hook here only extracts fields and hands a row to the
non-blocking :class:`~.writer.TableWriter`; none of them raises into LiteLLM. The router's decision
(candidate, propensity) comes from this process's record of it (:mod:`~litellm_energy_router.litellm_glue.decision`),
never from the request metadata a caller controls.
"""

from __future__ import annotations

import atexit
import logging
import time
import weakref
from typing import Any

from litellm.integrations.custom_logger import CustomLogger

from litellm_energy_router.energy.carbon import CarbonModel
from litellm_energy_router.energy.meter import RequestEnergyMeter
from litellm_energy_router.energy.request_meter import open_request_meter
from litellm_energy_router.errors import REFUSAL_LINES
from litellm_energy_router.litellm_glue.callback.accounting import RowAccounting
from litellm_energy_router.litellm_glue.callback.call_ids import (
    CallIdGuard,
    CallIdTaken,
)
from litellm_energy_router.litellm_glue.callback.pending_row import (
    CandidateMap,
    extract_row,
)
from litellm_energy_router.litellm_glue.callback.shadow_queue import ShadowQueue
from litellm_energy_router.litellm_glue.callback.writer import TableWriter
from litellm_energy_router.litellm_glue.decision import (
    decision_from_kwargs,
    take_decision,
)
from litellm_energy_router.litellm_glue.figures import add_to_logging_payload
from litellm_energy_router.metrics import CALLBACK_ERRORS, RateLimitedWarning
from litellm_energy_router.settings import Settings, load_settings

log = logging.getLogger("litellm_energy_router.litellm_glue.callback")


class EnergyLogger(CustomLogger):
    """Records one production row per served request (success or failure).

    Args:
        settings: the settings tree (default: :func:`load_settings`, i.e. ``$ENERGY_ROUTER_CONFIG``).
        meter: the per-request energy meter (default: built from ``settings.energy``).
        table_url: overrides ``settings.table.url``.
    """

    def __init__(
        self,
        settings: Settings | None = None,
        *,
        meter: RequestEnergyMeter | None = None,
        table_url: str | None = None,
        **writer_kwargs: Any,
    ) -> None:
        super().__init__()
        self.settings = settings or load_settings()
        s = self.settings
        logging.getLogger("litellm_energy_router").setLevel(s.privacy.log_level)
        self.meter = meter if meter is not None else open_request_meter(s.energy)
        self.cmap = CandidateMap(s.candidates)
        shadow = None
        if s.shadow.fraction > 0 or s.shadow.new_context_requests > 0:
            shadow = ShadowQueue(s.shadow.queue_path, s.shadow.fraction, s.shadow.new_context_requests, s.shadow.max_mb)
            if not s.privacy.store_text:
                log.warning(
                    "energy-router: shadow sampling writes query text to %s although privacy.store_text is false",
                    s.shadow.queue_path,
                )
        writer_kwargs.setdefault("accounting", RowAccounting(CarbonModel(s.carbon), keep_ledger=s.accounting.ledger))
        self.writer = TableWriter(
            table_url or s.table.url,
            self.meter,
            writer=s.writer,
            privacy=s.privacy,
            cmap=self.cmap,
            shadow=shadow,
            settle_timeout_s=s.energy.settle_timeout_s,
            **writer_kwargs,
        )
        self.call_ids = CallIdGuard(table_url or s.table.url)
        self._refused = RateLimitedWarning(log, 60.0)
        self._closed = False
        ref = weakref.ref(self)
        atexit.register(lambda: (lambda o: o.close() if o is not None else None)(ref()))

    # -- LiteLLM hooks ----------------------------------------------------------------------------
    async def async_pre_call_hook(self, user_api_key_dict: Any, cache: Any, data: dict, call_type: Any) -> None:
        """Proxy, before any backend call: refuse (HTTP 409) a caller-chosen call id that already names a
        request (:mod:`.call_ids`), so a response's call id is always the one its row is stored under."""
        try:
            await self.call_ids.check(data)
        except CallIdTaken as e:
            self._refused(
                "call_id",
                "energy-router: refused a reused call id with HTTP 409: %s (more in the next minute: not logged)",
                str(e).removeprefix("energy-router: "),
            )
            REFUSAL_LINES.note(e)  # the proxy's ERROR line about it is dropped (litellm_compat.quiet_refusals)
            raise
        return None

    def log_pre_api_call(self, model: Any, messages: Any, kwargs: Any) -> None:
        try:
            call_id = kwargs.get("litellm_call_id")
            if call_id:
                self.meter.request_started(call_id, time.time())
        except Exception:  # noqa: BLE001 - never raise into LiteLLM
            CALLBACK_ERRORS.inc()

    def logging_hook(self, kwargs: Any, result: Any, call_type: Any) -> tuple[Any, Any]:
        """Runs on every callback before any logging integration sends: put the decision-time energy and
        carbon figures into the standard logging payload (``metadata.energy_router``, :mod:`~..figures`)."""
        try:
            add_to_logging_payload(kwargs, decision_from_kwargs(kwargs))
        except Exception:  # noqa: BLE001 - never raise into LiteLLM
            CALLBACK_ERRORS.inc()
        return kwargs, result

    async def async_logging_hook(self, kwargs: Any, result: Any, call_type: Any) -> tuple[Any, Any]:
        return self.logging_hook(kwargs, result, call_type)

    def _handle(self, kwargs: Any, start_time: Any, end_time: Any, status: str) -> None:
        try:
            row = extract_row(kwargs, start_time, end_time, status, self.cmap, take_decision(kwargs))
            if row is not None:
                self.writer.submit(row)
        except Exception as e:  # noqa: BLE001 - never raise into LiteLLM
            CALLBACK_ERRORS.inc()
            log.debug("energy-router: event not recorded: %s", e)

    async def async_log_success_event(self, kwargs: Any, response_obj: Any, start_time: Any, end_time: Any) -> None:
        self._handle(kwargs, start_time, end_time, "success")

    async def async_log_failure_event(self, kwargs: Any, response_obj: Any, start_time: Any, end_time: Any) -> None:
        self._handle(kwargs, start_time, end_time, "failure")

    def log_success_event(self, kwargs: Any, response_obj: Any, start_time: Any, end_time: Any) -> None:
        self._handle(kwargs, start_time, end_time, "success")

    def log_failure_event(self, kwargs: Any, response_obj: Any, start_time: Any, end_time: Any) -> None:
        self._handle(kwargs, start_time, end_time, "failure")

    # -- lifecycle --------------------------------------------------------------------------------
    def flush(self, timeout: float = 30.0) -> bool:
        """Write every row received so far (table or spool)."""
        return self.writer.flush(timeout)

    def close(self, timeout: float = 30.0) -> None:
        """Flush, stop the writer and the meter. Called at interpreter exit too."""
        if self._closed:
            return
        self._closed = True
        self.writer.close(timeout)
        self.call_ids.close()
        try:
            self.meter.close()
        except Exception:  # noqa: BLE001
            pass
