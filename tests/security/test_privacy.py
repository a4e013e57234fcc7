"""Privacy of production traffic (issue: trust in production, item 5): the prompt text stays out of every
file the writer leaves on disk unless ``privacy.store_text`` opts in; those files are private to the
proxy's user; the text hash is salted with a secret generated once and kept; a database password never
reaches a log line or an error message."""

from __future__ import annotations

import hashlib
import logging
import os
import stat

import pytest
from sqlalchemy.engine import make_url
from tcp_proxy import TCPProxy

from litellm_energy_router.energy.estimate import EstimateMeter
from litellm_energy_router.litellm_glue.callback import PendingRow, TableWriter
from litellm_energy_router.settings import ConfigError, PrivacySettings, WriterSettings, load_settings
from litellm_energy_router.table import TableError, open_store

SECRET = "my card number is 4111-1111-1111-1111"
CAND = "mistralai/mistral-7b-chat"


def _row(i: int, text: str = SECRET, *, end: float | None = None) -> PendingRow:
    start = 1000.0 + i
    return PendingRow(
        call_id=f"call-{i}",
        candidate=CAND,
        status="success",
        text=f"{text} #{i}",
        start_s=start,
        end_s=start + 1.0 if end is None else end,
        first_token_s=None,
        prompt_tokens=10,
        completion_tokens=5,
        propensity=None,
        deployment_id="d",
        backend_id=None,
    )


def _down_url(tmp_path) -> str:
    """A table that cannot be opened until its directory exists."""
    return f"sqlite:///{tmp_path / 'later' / 't.db'}"


def _files(d):
    return [p for p in d.rglob("*") if p.is_file()]


@pytest.fixture
def umask022():
    old = os.umask(0o022)  # the common default: files 0644, directories 0755
    yield
    os.umask(old)


def test_prompt_text_absent_from_spool_and_rejected_file_by_default(tmp_path):
    """Table down, a full queue (spilled rows) and a row that fails validation: nothing on disk holds
    the prompt text; with ``store_text`` it is there (the opt-in works)."""
    spool = tmp_path / "spool"
    cfg = WriterSettings(spool_dir=spool, queue_size=5, batch_size=5, flush_interval_s=0.05, retry_max_s=0.2)
    w = TableWriter(_down_url(tmp_path), EstimateMeter(), writer=cfg, privacy=PrivacySettings(), start=False)
    w.submit(_row(99, end=500.0))  # ends before it starts: negative latency, rejected
    for i in range(40):  # the writer thread is not running yet: 35 rows spill from the full queue
        w.submit(_row(i))
    w._thread.start()
    assert w.flush(20)
    w.close()
    found = [p.name for p in _files(spool) if b"4111-1111" in p.read_bytes()]
    assert (spool / "rejected.jsonl").exists()
    assert not found, f"prompt text stored in {found}"

    spool2 = tmp_path / "spool2"
    cfg2 = cfg.model_copy(update={"spool_dir": spool2})
    w = TableWriter(_down_url(tmp_path), EstimateMeter(), writer=cfg2, privacy=PrivacySettings(store_text=True))
    for i in range(10):
        w.submit(_row(i))
    assert w.flush(20)
    w.close()
    assert any(b"4111-1111" in p.read_bytes() for p in _files(spool2))


def test_spool_files_are_private(tmp_path, umask022):
    """Spool, offset, rejected and salt files 0600 in a 0700 directory, whatever the umask; a directory
    created by someone else with wider permissions is narrowed."""
    spool = tmp_path / "spool"
    spool.mkdir(mode=0o755)
    cfg = WriterSettings(spool_dir=spool, flush_interval_s=0.05, retry_max_s=0.2)
    w = TableWriter(_down_url(tmp_path), EstimateMeter(), writer=cfg, privacy=PrivacySettings())
    for i in range(20):
        w.submit(_row(i))
    w.submit(_row(99, end=500.0))
    assert w.flush(20)
    (tmp_path / "later").mkdir()  # the table returns: offsets are written
    for i in range(20, 30):
        w.submit(_row(i))
    assert w.flush(20)
    w.close()
    assert stat.S_IMODE(spool.stat().st_mode) == 0o700
    files = _files(spool)
    assert any(p.name == "rejected.jsonl" for p in files)
    wide = {p.name: oct(stat.S_IMODE(p.stat().st_mode)) for p in files if stat.S_IMODE(p.stat().st_mode) != 0o600}
    assert not wide, f"files readable beyond their owner: {wide}"


def test_a_new_sqlite_table_is_private(tmp_path, umask022):
    """The table holds key hashes, aliases, the ledger (and the prompts with ``store_text``): sqlite3 created it 0644."""
    url = f"sqlite:///{tmp_path / 't.db'}"
    store = open_store(url)
    store.write(queries=[], runs=[], candidates=[{"name": "c"}])
    store.close()
    modes = {p.name: oct(stat.S_IMODE(p.stat().st_mode)) for p in tmp_path.iterdir() if p.name.startswith("t.db")}
    assert modes and set(modes.values()) == {"0o600"}, modes


def test_salt_generated_once_and_reused_across_restarts(tmp_path, umask022):
    """No salt configured: a random one is generated on first start, stored 0600, reused after a
    restart (same text -> same hash); a configured salt file is used as given."""
    url = f"sqlite:///{tmp_path / 't.db'}"
    cfg = WriterSettings(spool_dir=tmp_path / "spool", flush_interval_s=0.05)

    def hashes(writer_cfg, privacy, ids):
        w = TableWriter(url, EstimateMeter(), writer=writer_cfg, privacy=privacy)
        for i in ids:
            w.submit(_row(i, text="same text"))
        assert w.flush(20)
        w.close()
        store = open_store(url)
        got = {r["call_id"]: r["text_hash"] for r in store.iter_runs()}
        store.close()
        return [got[f"call-{i}"] for i in ids]

    first = hashes(cfg, PrivacySettings(), [1])[0]
    assert first != hashlib.sha256(b"same text #1").hexdigest()  # not the unsalted hash
    salt_files = [p for p in _files(tmp_path / "spool") if p.read_text().strip() and "salt" in p.name]
    assert len(salt_files) == 1 and len(salt_files[0].read_text().strip()) >= 32
    assert stat.S_IMODE(salt_files[0].stat().st_mode) == 0o600
    salt = salt_files[0].read_text().strip()
    assert first == hashlib.sha256((salt + "same text #1").encode()).hexdigest()
    # restart: the stored salt is reused
    again = hashes(cfg, PrivacySettings(), [2])[0]
    assert again == hashlib.sha256((salt + "same text #2").encode()).hexdigest()
    # a configured salt file: created there when missing, reused
    path = tmp_path / "keys" / "router.salt"
    p = PrivacySettings(salt_file=path)
    h3 = hashes(cfg.model_copy(update={"spool_dir": tmp_path / "spool3"}), p, [3])[0]
    other = path.read_text().strip()
    assert other != salt and h3 == hashlib.sha256((other + "same text #3").encode()).hexdigest()
    assert stat.S_IMODE(path.stat().st_mode) == 0o600


@pytest.mark.postgres
def test_database_password_never_logged(pg_url, tmp_path, caplog):
    """The table URL carries a password: an outage and the recovery are logged, never the password;
    a bad URL's error message hides it too."""
    pw = "S3cret-pa55word"
    u = make_url(pg_url)
    proxy = TCPProxy(u.host or "127.0.0.1", u.port or 5432)
    url = u.set(host="127.0.0.1", port=proxy.port, password=pw).render_as_string(hide_password=False)
    caplog.set_level(logging.DEBUG)
    try:
        proxy.pause()  # the table is down from the start
        cfg = WriterSettings(spool_dir=tmp_path / "spool", flush_interval_s=0.05, retry_max_s=0.2)
        w = TableWriter(url, EstimateMeter(), writer=cfg, privacy=PrivacySettings())
        for i in range(10):
            w.submit(_row(i))
        assert w.flush(20) and w.spooled == 10
        proxy.resume()
        assert w.wait_replayed(30)
        w.close()
    finally:
        proxy.close()
    lines = [r.getMessage() + (caplog.text if r.exc_info else "") for r in caplog.records]
    assert any("unreachable" in x for x in lines) and any("reachable again" in x for x in lines)
    assert not [x for x in lines if pw in x]
    assert pw not in caplog.text


def test_bad_table_url_errors_hide_the_password():
    """The one-line errors for a wrong table URL name it without its password."""
    pw = "S3cret-pa55word"
    # a password with "/", "@" or a space (left unencoded) in an unparsable URL (a typo in the port) was shown
    for bad in (
        f"mysql://root:{pw}@db/x",
        f"postgresql://u:{pw}@db:notaport/x",
        f"postgresql+psycopg://app:{pw}/x@db:54x2/prod",
        f"postgresql+psycopg://app:{pw} x@db:54x2/prod",
        f"postgresql+psycopg://app:{pw}@x@db:54x2/prod",
    ):
        with pytest.raises(TableError) as e:
            open_store(bad)
        assert pw not in str(e.value) and "db" in str(e.value)
        with pytest.raises(ConfigError) as e:
            load_settings(environ={"ENERGY_ROUTER_TABLE__URL": f"mysql://root:{pw}@db/x"})
        assert pw not in str(e.value) and "table.url" in str(e.value)
