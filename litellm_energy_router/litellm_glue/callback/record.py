"""Stage 2 of the table writer: build a row's validated table records (``Query`` + ``Run`` + candidate).

Privacy lives here: unless ``privacy.store_text``, no prompt text leaves this stage — the records, the
spool's pending rows and ``rejected.jsonl`` carry only its SHA-256 salted with the writer's salt. Shadow
sampling happens here too, while the text is at hand.
"""

from __future__ import annotations

import logging
from typing import Any, Callable

from pydantic import ValidationError

from litellm_energy_router.energy.meter import RequestEnergy, is_measured
from litellm_energy_router.errors import one_line
from litellm_energy_router.litellm_glue.callback.accounting import RowAccounting
from litellm_energy_router.litellm_glue.callback.pending_row import (
    CandidateMap,
    PendingRow,
)
from litellm_energy_router.litellm_glue.callback.shadow_queue import ShadowQueue
from litellm_energy_router.litellm_glue.callback.spool import Chunk, Spool
from litellm_energy_router.metrics import (
    CALL_IDS_REASSIGNED,
    REJECTED_ROWS,
    observe_row,
)
from litellm_energy_router.table import Query, Run, text_hash
from litellm_energy_router.table.production import query_id_for, stored_call_id

log = logging.getLogger("litellm_energy_router.litellm_glue.callback")


MAX_MESSAGE = 300  # characters of a rejected row's message (its values are the caller's or a backend's)


class RecordBuilder:
    """Args: ``task`` (the production rows' task), ``privacy`` (``PrivacySettings``), ``salt`` (the text
    hash's salt), ``cmap`` (candidate metadata), ``spool`` (where rejected rows are kept), ``shadow``
    (shadow-sampling queue, or ``None``), ``accounting`` (carbon and ledger figures of each row)."""

    def __init__(
        self,
        task: str,
        privacy: Any,
        salt: str,
        cmap: CandidateMap,
        spool: Spool,
        shadow: ShadowQueue | None = None,
        accounting: RowAccounting | None = None,
    ) -> None:
        self.task, self.privacy, self.salt, self.cmap, self.spool, self.shadow = (
            task,
            privacy,
            salt,
            cmap,
            spool,
            shadow,
        )
        self.accounting = accounting or RowAccounting()

    def record(self, row: PendingRow, e: RequestEnergy, *, h: str | None = None) -> dict[str, Any] | None:
        """The row's table records (``h``: the text's salted hash when the text is not kept); a call id
        too long for the table's key is stored under its SHA-256. ``None``: the row is invalid (kept in
        ``rejected.jsonl``, counted in ``energy_router_rejected_rows_total``)."""
        call_id = stored_call_id(row.call_id)
        if call_id != row.call_id:
            CALL_IDS_REASSIGNED.labels(reason="too_long").inc()
        measured = is_measured(e.method)  # the meter registry's answer, read once for the ledger and the metrics
        try:
            figures, ledger = self.accounting.settle(row, e, measured)  # accounting: run columns + ledger increments
            q = Query(
                id=query_id_for(call_id),
                task=self.task,
                text=_storable(row.text) if self.privacy.store_text else None,
                text_hash=h if row.text is None else text_hash(row.text, self.salt),
                source="production",
                created=row.start_s,
            )
            run = Run(
                query_id=q.id,
                candidate=row.candidate,
                source="production",
                score=None,
                latency_s=row.end_s - row.start_s,
                ttft_s=(row.first_token_s - row.start_s) if row.first_token_s is not None else None,
                prompt_tokens=row.prompt_tokens,
                completion_tokens=row.completion_tokens,
                energy_j=e.energy_j,
                avg_power_w=e.avg_power_w if e.energy_j is not None else None,
                energy_method=e.method,
                gpu=e.gpu,
                propensity=row.propensity,
                call_id=call_id,
                status=row.status,
                created=row.end_s,
                router_version=row.router_version,
                context=row.context,
                key_hash=row.key_hash,
                **figures,
            )
        except Exception as err:  # noqa: BLE001 - a bad value (or a meter's, a carbon provider's) costs this row only
            where = f"row for call {row.call_id[:100]!r}"
            msg = one_line(err, where) if isinstance(err, ValidationError) else f"{where}: {type(err).__name__}: {err}"
            msg = msg.splitlines()[0][:MAX_MESSAGE] if msg else where
            log.warning("energy-router: %s (kept in %s)", msg, self.spool.rejected_path)
            self.spool.reject([self.private_json(row, h)], msg)
            REJECTED_ROWS.inc()
            return None
        observe_row(row.candidate, e.method, e.energy_j, measured)
        cand = {"name": row.candidate, **self.cmap.info.get(row.candidate, {})}
        return {"k": "row", "q": q.model_dump(), "r": run.model_dump(), "c": cand, "l": ledger}

    def private_json(self, row: PendingRow, h: str | None = None) -> dict[str, Any]:
        """The row as JSON for the spool or ``rejected.jsonl``: the text replaced by its salted hash
        ``h`` unless ``privacy.store_text``."""
        d = row.to_json()
        if row.text is not None and not self.privacy.store_text:
            d["text"], h = None, text_hash(row.text, self.salt)
        if h is not None:
            d["h"] = h
        return d

    def pending_record(self, row: PendingRow) -> dict[str, Any]:
        """The spool record of a row spilled before its energy was known (shadow-sampled now, while
        its text is at hand)."""
        self.sample_shadow(row)
        return {"k": "pending", **self.private_json(row)}

    def sample_shadow(self, row: PendingRow) -> None:
        """Offer a served row's query to the shadow queue (a queue that cannot be written is logged)."""
        if self.shadow is None or row.status != "success":
            return
        try:
            cid = stored_call_id(row.call_id)
            self.shadow.maybe_enqueue(
                query_id_for(cid),
                self.task,
                row.text,
                cid,
                row.start_s,
                context=row.context,
                owner=_owner(row),
                secret=self.salt,
            )
        except OSError as e:
            log.warning("energy-router: shadow queue %s not writable: %s", self.shadow.path, e)

    def complete_chunk(self, chunk: Chunk, energy: Callable[[PendingRow], RequestEnergy]) -> None:
        """Rows spilled to the spool before their energy was known get it (``energy``) and their records
        now, once: the chunk keeps the converted records for a retry. They were shadow-sampled when
        spilled; an invalid one goes to ``rejected.jsonl``."""
        if all(isinstance(r, dict) and r.get("k") == "row" and _record_shape(r) for r in chunk.records):
            return
        out = []
        for d in chunk.records:
            try:
                if d.get("k") == "row":
                    if not _record_shape(d):
                        raise ValueError("a 'row' record without its query, run and candidate")
                    out.append(d)
                    continue
                if d.get("k") != "pending":
                    raise ValueError(f"unknown spool record kind {str(d.get('k'))[:20]!r}")
                row = PendingRow.from_json(d)
                rec = self.record(row, energy(row), h=d.get("h"))
            except Exception as e:  # noqa: BLE001 - a malformed line (an edited or damaged spool) is kept aside
                msg = f"malformed spool record: {type(e).__name__}: {str(e).splitlines()[0][:200] if str(e) else ''}"
                log.warning("energy-router: %s (kept in %s)", msg, self.spool.rejected_path)
                self.spool.reject([d], msg)
                REJECTED_ROWS.inc()
                continue
            if rec is not None:
                out.append(rec)
        chunk.records = out


def _record_shape(d: dict[str, Any]) -> bool:
    """Whether a spooled ``row`` record has its query, run and candidate (the table write reads them)."""
    q, r, c = d.get("q"), d.get("r"), d.get("c")
    return isinstance(q, dict) and isinstance(r, dict) and isinstance(c, dict) and isinstance(c.get("name"), str)


def _storable(text: str | None) -> str | None:
    """``text`` as every database stores it: a lone surrogate (valid in JSON, not in UTF-8) becomes ``?``, a NUL
    (PostgreSQL's text refuses it) U+FFFD."""
    return text.encode("utf-8", "replace").decode("utf-8").replace("\x00", "\ufffd") if text is not None else None


def _owner(row: PendingRow) -> str | None:
    """Who a row's new-context shadow slots count against: its authenticated key (hash), else the other identity
    fields LiteLLM attributed it to (alias, team, user: an SDK caller's own metadata), else None (no identity: every
    such request one owner, :data:`.shadow_queue.ANONYMOUS`)."""
    for prefix, v in (("", row.key_hash), ("alias:", row.key_alias), ("team:", row.team), ("user:", row.user_id)):
        if v:
            return prefix + v
    return None
