"""Energy and carbon accounting of one settled production row: its run columns, its ledger increments and
the Prometheus counters (docs/accounting.md).

Attribution (API key hash and alias, team, user) comes only from the ``user_api_key_*`` fields of LiteLLM's
standard logging payload, which the proxy fills from the *authenticated* key (it overwrites whatever a
request's metadata says), never from request metadata; in the SDK, where there is no key, they are empty.
"""

from __future__ import annotations

from typing import Any

from litellm_energy_router.energy.carbon import SITE_KEY, CarbonModel
from litellm_energy_router.energy.meter import RequestEnergy, is_measured
from litellm_energy_router.litellm_glue.callback.pending_row import PendingRow
from litellm_energy_router.metrics import observe_accounting
from litellm_energy_router.table import ledger


class RowAccounting:
    """Turns a row and its settled energy into run columns and ledger increments.

    Args:
        carbon: sites, PUE and grid intensity.
        keep_ledger: add ledger increments (``accounting.ledger``).
    """

    def __init__(self, carbon: CarbonModel | None = None, *, keep_ledger: bool = True) -> None:
        self.carbon = carbon or CarbonModel()
        self.keep_ledger = keep_ledger

    def settle(
        self, row: PendingRow, e: RequestEnergy, measured: bool | None = None
    ) -> tuple[dict[str, Any], dict[str, Any] | None]:
        """(extra ``Run`` columns, ledger entry or ``None``) of ``row`` whose energy is ``e``; counts the
        Prometheus accounting counters."""
        site = self.carbon.site_of({SITE_KEY: row.site} if row.site else None)
        co2e = self.carbon.grams(e.energy_j, site, row.end_s)
        if measured is None:  # the meter registry: a simulation or an estimate is not
            measured = is_measured(e.method)
        est, ref = row.estimate_j, row.reference_j
        saved = ref - est if est is not None and ref is not None else None
        observe_accounting(row.team_alias or row.team, row.model_group, measured, e.energy_j, co2e, saved)
        cols = {"energy_estimate_j": est, "energy_reference_j": ref, "co2e_g": co2e, "site": site}
        if not self.keep_ledger:
            return cols, None
        attrs = {
            "key_hash": row.key_hash,
            "team": row.team,
            "user_id": row.user_id,
            "model_group": row.model_group,
            "deployment": row.deployment_id,
            "key_alias": row.key_alias,
            "team_alias": row.team_alias,
        }
        entry = ledger.entry(
            attrs,
            t_s=row.end_s,
            request=True,
            prompt_tokens=row.prompt_tokens,
            completion_tokens=row.completion_tokens,
            joules=e.energy_j,
            measured=measured,
            router_estimate_j=est,
            reference_j=ref,
            co2e_g=co2e,
        )
        return cols, entry
