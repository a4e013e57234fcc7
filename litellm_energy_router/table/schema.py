"""Schema of the tournament table (SQLAlchemy Core). Same DDL on SQLite and PostgreSQL.

``er_meta`` holds the ``schema_version`` row; a store refuses a database written by a newer schema.
A nullable column (and its index) added within a schema version is added to an older table when a store
opens it: such additions are backward compatible (an older release neither reads nor needs them), so they
do not bump ``SCHEMA_VERSION`` and older and newer proxies can share one table during a rolling upgrade.
``er_runs.router_version`` (the checkpoint version whose decision served a production run; ``NULL`` for
tournament, shadow and import rows and for rows written before the column existed) is one such addition;
so are ``energy_estimate_j`` (the router's decision-time estimate for the served candidate, J),
``energy_reference_j`` (its estimate for the reference deployment, J), ``co2e_g`` (grams CO2e of the settled
energy), ``site`` (the deployment's site), ``context`` (a production run's hashed context keys,
``router/context.py``) and ``key_hash`` (a production run's ``user_api_key_hash``: the key that made the call, whose
holder alone may label it with a caller key, :mod:`litellm_energy_router.feedback`), and the ``er_ledger`` table
(:mod:`.ledger`).
Energy columns are joules (J), power watts (W), times seconds, ``created``/``updated`` Unix seconds.
"""

from __future__ import annotations

from sqlalchemy import (
    BigInteger,
    Column,
    Float,
    ForeignKey,
    Index,
    Integer,
    MetaData,
    String,
    Table,
    Text,
    UniqueConstraint,
)

SCHEMA_VERSION = 1

metadata = MetaData()

meta = Table(
    "er_meta",
    metadata,
    Column("key", String(64), primary_key=True),
    Column("value", Text, nullable=False),
)

candidates = Table(
    "er_candidates",
    metadata,
    Column("name", String(200), primary_key=True),
    Column("model", String(300)),
    Column("params_b", Float),
    Column("active_params_b", Float),
    Column("hardware", String(200)),
)

queries = Table(
    "er_queries",
    metadata,
    Column("id", String(200), primary_key=True),
    Column("task", String(64), nullable=False),
    Column("text", Text),
    Column("text_hash", String(64), nullable=False),
    Column("reference", Text),
    Column("source", String(16), nullable=False),
    Column("created", Float, nullable=False),
    Index("ix_er_queries_task", "task"),
)

runs = Table(
    "er_runs",
    metadata,
    Column("id", BigInteger().with_variant(Integer, "sqlite"), primary_key=True, autoincrement=True),
    Column("query_id", String(200), ForeignKey("er_queries.id"), nullable=False),
    Column("candidate", String(200), ForeignKey("er_candidates.name"), nullable=False),
    Column("source", String(16), nullable=False),
    Column("score", Float),
    Column("latency_s", Float),
    Column("ttft_s", Float),
    Column("prompt_tokens", Integer),
    Column("completion_tokens", Integer),
    Column("energy_j", Float),
    Column("avg_power_w", Float),
    Column("energy_method", String(16)),
    Column("gpu", String(200)),
    Column("propensity", Float),
    Column("call_id", String(200)),
    Column("status", String(16)),
    Column("grade_note", String(200)),
    Column("created", Float, nullable=False),
    Column("updated", Float, nullable=False),
    Column("router_version", String(100)),
    Column("energy_estimate_j", Float),
    Column("energy_reference_j", Float),
    Column("co2e_g", Float),
    Column("site", String(100)),
    Column("context", String(64)),
    Column("key_hash", String(200)),
    UniqueConstraint("query_id", "candidate", "source", name="uq_er_runs_key"),
    Index("ix_er_runs_candidate", "candidate"),
    Index("ix_er_runs_updated", "updated"),
    Index("ix_er_runs_call_id", "call_id"),
    Index("ix_er_runs_router_version", "router_version"),
)

RUN_KEY = ("query_id", "candidate", "source")
