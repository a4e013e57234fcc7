"""The GPU-node agent under hostile input and faults (issue: trust in production, item 4).

Every test is an attack or a fault, run over real HTTP against a running agent: bad progress fields
(NaN, inf, negative, huge, far-off timestamps, odd ids) get 400 naming the field and leave attribution
untouched; oversized or deeply nested bodies are refused; 100k distinct request ids stay under the cap
(drops counted); stale requests expire; a non-loopback bind needs a real token, and missing or wrong
tokens get 401. TLS: test_agent_tls.py.
"""

from __future__ import annotations

import json
import math
import os
import subprocess
import time

import httpx
import pytest
from agent_fixtures import AUTH, EXE, JSON, TOKEN, metric, one_line_error, poll
from aiohttp import web

from litellm_energy_router.agent.server import AgentConfig, BindError, EnergyAgent
from litellm_energy_router.energy.simulated import SimulatedMeter
from litellm_energy_router.threaded_app import ThreadedApp


@pytest.fixture
def agent_url():
    """An agent on 127.0.0.1 with a token, sampling a 300 W simulated meter at 20 Hz."""
    agent = EnergyAgent(SimulatedMeter(power_w=300.0), AgentConfig(token=TOKEN, sample_hz=20))
    with ThreadedApp(agent.app) as srv:
        assert poll(lambda: httpx.get(f"{srv.url}/healthz").json()["last_sample_t"])
        yield srv.url


def settled_reference(url: str) -> tuple[float, float]:
    """A finished request "ref" reported by progress, settled: (its energy J, a time inside its span)."""
    time.sleep(0.6)  # history before ref's start
    now = time.time()
    ev = [
        {"request_id": "ref", "t": now - 0.5, "prompt_tokens": 0, "output_tokens": 0},
        {"request_id": "ref", "t": now - 0.3, "prompt_tokens": 40, "output_tokens": 2},
        {"request_id": "ref", "t": now - 0.1, "prompt_tokens": 40, "output_tokens": 12, "finished": True},
    ]
    assert httpx.post(f"{url}/v1/progress", json={"events": ev}, headers=AUTH).json() == {"accepted": 3}
    d = poll(lambda: (r := httpx.get(f"{url}/v1/energy/ref", headers=AUTH).json())["settled"] and r)
    assert d and d["energy_j"] > 0
    return d["energy_j"], now - 0.3


def energy_final(url: str, rid: str) -> float:
    return httpx.get(f"{url}/v1/energy/{rid}", params={"final": "1"}, headers=AUTH).json()["energy_j"]


# -- /v1/progress fields --------------------------------------------------------------------------
BAD_COUNTS = ["NaN", "Infinity", "-Infinity", "1e400", "-5", "1" + "0" * 30, "12.5", '"12"', "true", "null"]


@pytest.mark.parametrize("field", ["prompt_tokens", "output_tokens"])
@pytest.mark.parametrize("raw", BAD_COUNTS)
def test_bad_token_counts_get_400_and_leave_attribution_alone(agent_url, field, raw):
    ref_j, t = settled_reference(agent_url)  # t inside ref's span: an accepted count would change ref's share
    good = f'{{"request_id": "ok-1", "t": {t!r}, "prompt_tokens": 5, "output_tokens": 5}}'
    other = "output_tokens" if field == "prompt_tokens" else "prompt_tokens"
    bad = f'{{"request_id": "evil", "t": {t!r}, "{other}": 1, "{field}": {raw}}}'
    r = httpx.post(f"{agent_url}/v1/progress", content=f'{{"events": [{good}, {bad}]}}', headers=JSON)
    assert r.status_code == 400
    assert f"events[1].{field}" in one_line_error(r)
    for rid in ("evil", "ok-1"):  # the whole batch is refused
        assert httpx.get(f"{agent_url}/v1/energy/{rid}", headers=AUTH).status_code == 404
    assert energy_final(agent_url, "ref") == pytest.approx(ref_j, rel=1e-12)
    w = httpx.get(f"{agent_url}/v1/energy", headers=AUTH).json()["window"]
    assert all(math.isfinite(v) for k, v in w.items() if k.endswith("_j"))


@pytest.mark.parametrize(
    "field,value",
    [
        ("t", "NaN"),
        ("t", "Infinity"),
        ("t", "0"),
        ("t", "1e12"),
        ("t", "-1"),
        ("t", '"now"'),
        ("t", "null"),
        ("request_id", '""'),
        ("request_id", json.dumps("x" * 300)),
        ("request_id", "7"),
        ("request_id", '"a\\nb"'),
        ("request_id", '["a"]'),
        ("finished", '"yes"'),
        ("finished", "2"),
    ],
)
def test_bad_timestamps_ids_and_flags_get_400_naming_the_field(agent_url, field, value):
    ev = {"request_id": '"evil"', "t": repr(time.time()), "prompt_tokens": "1", "output_tokens": "1", field: value}
    body = '{"events": [{' + ", ".join(f'"{k}": {v}' for k, v in ev.items()) + "}]}"
    r = httpx.post(f"{agent_url}/v1/progress", content=body, headers=JSON)
    assert r.status_code == 400
    assert f"events[0].{field}" in one_line_error(r)
    assert httpx.get(f"{agent_url}/v1/energy/evil", headers=AUTH).status_code == 404
    assert metric(agent_url, "energy_router_agent_requests_tracked") == 0


def test_unknown_progress_fields_are_refused(agent_url):
    ev = {"request_id": "a", "t": time.time(), "output_token": 500}  # a typo would silently attribute nothing
    r = httpx.post(f"{agent_url}/v1/progress", json={"events": [ev]}, headers=AUTH)
    assert r.status_code == 400 and "events[0].output_token" in one_line_error(r)


def test_oversized_bodies_and_batches_are_refused(agent_url):
    ev = {"request_id": "big", "t": time.time(), "prompt_tokens": 1, "output_tokens": 1}
    padded = json.dumps({"events": [ev]}) + " " * 512 * 1024  # valid JSON, under aiohttp's own 1 MiB limit
    r = httpx.post(f"{agent_url}/v1/progress", content=padded, headers=JSON)
    assert r.status_code == 413 and "body" in one_line_error(r)

    def chunks():  # no Content-Length: the limit holds while reading
        yield b'{"events": [' + json.dumps(ev).encode()
        for _ in range(64):
            yield b" " * 32 * 1024
        yield b"]}"

    r = httpx.post(f"{agent_url}/v1/progress", content=chunks(), headers=JSON)
    assert r.status_code == 413 and "body" in one_line_error(r)
    many = [{"request_id": f"m{i}", "t": time.time()} for i in range(2000)]  # small body, too many events
    r = httpx.post(f"{agent_url}/v1/progress", json={"events": many}, headers=AUTH)
    assert r.status_code == 400 and "events" in one_line_error(r)
    assert httpx.get(f"{agent_url}/v1/energy/big", headers=AUTH).status_code == 404
    assert httpx.get(f"{agent_url}/v1/energy/m0", headers=AUTH).status_code == 404


@pytest.mark.parametrize(
    "body", [b"[" * 100_000, b'{"events": ' + b"[" * 50_000, b"\xff\xfe{}", b"[]", b'{"events": {}}']
)
def test_malformed_bodies_get_400_not_500(agent_url, body):
    r = httpx.post(f"{agent_url}/v1/progress", content=body, headers=JSON)
    assert r.status_code == 400
    one_line_error(r)


# -- GET /v1/energy/{id} with timings ---------------------------------------------------------------
@pytest.mark.parametrize(
    "field,value",
    [
        ("prompt_tokens", "1" + "0" * 30),
        ("completion_tokens", "99999999999"),
        ("prompt_tokens", "-1"),
        ("completion_tokens", "2.5"),
        ("start", "0"),
        ("end", "1e12"),
        ("start", "nan"),
        ("first_token", "inf"),
        ("first_token", "1e12"),
        ("final", "maybe"),
        ("end", ""),
    ],
)
def test_bad_timing_queries_get_400_naming_the_field(agent_url, field, value):
    now = time.time()
    q = {
        "start": repr(now - 1.0),
        "end": repr(now - 0.5),
        "prompt_tokens": "10",
        "completion_tokens": "5",
        field: value,
    }
    r = httpx.get(f"{agent_url}/v1/energy/evil", params=q, headers=AUTH)
    assert r.status_code == 400
    assert field in one_line_error(r)
    assert httpx.get(f"{agent_url}/v1/energy/evil", headers=AUTH).status_code == 404


@pytest.mark.parametrize("field", ["start", "completion_tokens"])
def test_a_repeated_query_parameter_gets_400(agent_url, field):
    """Each parameter at most once (docs/security.md): aiohttp's MultiDict lists a repeated key once in ``keys()``,
    so ``?start=5&start=1`` was accepted, the first value winning."""
    now = time.time()
    q = [("start", repr(now - 1.0)), ("end", repr(now - 0.5)), ("prompt_tokens", "10"), ("completion_tokens", "5")]
    q.append((field, dict(q)[field]))
    r = httpx.get(f"{agent_url}/v1/energy/twice", params=q, headers=AUTH)
    assert r.status_code == 400 and f"{field}' given more than once" in one_line_error(r)


@pytest.mark.parametrize("rid", ["x" * 300, "a b", "caf\u00e9"])
def test_bad_request_ids_in_the_path_get_400(agent_url, rid):
    now = time.time()
    q = {"start": repr(now - 1.0), "end": repr(now - 0.5), "prompt_tokens": "10", "completion_tokens": "5"}
    r = httpx.get(f"{agent_url}/v1/energy/{rid}", params=q, headers=AUTH)
    assert r.status_code == 400 and "request_id" in one_line_error(r)
    assert metric(agent_url, "energy_router_agent_requests_tracked") == 0


# -- bounded memory ---------------------------------------------------------------------------------
def test_100k_distinct_in_flight_ids_stay_under_the_cap(agent_url):
    cap = 20_000  # AgentConfig's default max_requests (energy.agent_max_requests)
    n, batch = 100_000, 1000
    with httpx.Client(headers=AUTH, timeout=30) as c:
        for b in range(n // batch):
            t = time.time()
            ev = [{"request_id": f"flood-{b}-{i}", "t": t, "prompt_tokens": 3} for i in range(batch)]
            assert c.post(f"{agent_url}/v1/progress", json={"events": ev}).status_code == 200
    tracked = metric(agent_url, "energy_router_agent_requests_in_flight")
    assert tracked is not None and tracked <= cap
    assert metric(agent_url, "energy_router_agent_requests_tracked") <= cap
    assert metric(agent_url, 'energy_router_agent_requests_dropped_total{reason="cap"}') == n - tracked
    # the newest are kept, the oldest went first
    assert httpx.get(f"{agent_url}/v1/energy/flood-99-999", params={"final": "1"}, headers=AUTH).status_code == 200
    assert httpx.get(f"{agent_url}/v1/energy/flood-0-0", headers=AUTH).status_code == 404
    assert AgentConfig().max_requests == cap


def test_tracked_requests_and_segments_are_capped_in_the_attributor():
    cfg = AgentConfig(max_requests=50, max_segments=400)
    agent = EnergyAgent(SimulatedMeter(), cfg)
    a, t = agent.attributor, time.time()
    for i in range(200):
        a.add_progress(f"r{i}", t, 1, 0)
    assert a.tracked() == 50 and a.dropped_requests["cap"] == 150
    for k in range(1, 2000):  # one id sending endless updates
        a.add_progress("hog", t + k * 1e-3, k, k)
    assert a.tracked_segments() <= 400


def test_stale_requests_expire_and_stop_blocking_settlement():
    agent = EnergyAgent(SimulatedMeter(power_w=300.0), AgentConfig(token=TOKEN, sample_hz=20, stale_s=0.5))
    with ThreadedApp(agent.app) as srv:
        url = srv.url
        time.sleep(0.3)
        now = time.time()
        stuck = {"request_id": "stuck", "t": now - 0.2, "prompt_tokens": 10, "output_tokens": 1}  # its engine died
        done = [
            {"request_id": "done", "t": now - 0.1, "prompt_tokens": 0, "output_tokens": 0},
            {"request_id": "done", "t": now, "prompt_tokens": 20, "output_tokens": 4, "finished": True},
        ]
        assert httpx.post(f"{url}/v1/progress", json={"events": [stuck, *done]}, headers=AUTH).status_code == 200
        assert poll(lambda: metric(url, 'energy_router_agent_requests_dropped_total{reason="stale"}') == 1, timeout=10)
        assert metric(url, "energy_router_agent_requests_in_flight") == 0
        assert poll(lambda: httpx.get(f"{url}/v1/energy/done", headers=AUTH).json()["settled"], timeout=10)
        assert httpx.get(f"{url}/v1/energy/stuck", headers=AUTH).status_code == 404


# -- bind policy and token ---------------------------------------------------------------------------
@pytest.mark.parametrize("token", [None, "", "   ", "\t\n"])
def test_non_loopback_bind_without_a_real_token_is_refused(token):
    env = {k: v for k, v in os.environ.items() if "AGENT_TOKEN" not in k}
    if token is not None:
        env["ENERGY_ROUTER_AGENT_TOKEN"] = token
    with pytest.raises(BindError, match="refusing to bind '0.0.0.0' without a bearer token"):
        EnergyAgent(SimulatedMeter(), AgentConfig(host="0.0.0.0", token=token))
    p = subprocess.Popen(
        [EXE, "agent", "--host", "0.0.0.0", "--port", "0", "--meter", "simulated"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
    )
    try:
        out, err = p.communicate(timeout=60)
    except subprocess.TimeoutExpired:
        p.kill()
        out, err = p.communicate()
        pytest.fail(f"agent started on 0.0.0.0 with token {token!r}: {out.strip()}")
    assert p.returncode == 2
    assert "refusing to bind '0.0.0.0' without a bearer token" in err and len(err.strip().splitlines()) == 1


BAD_AUTH = [
    None,
    "Bearer wrong",
    f"Bearer  {TOKEN}",
    f"Bearer {TOKEN}x",
    f"Basic {TOKEN}",
    TOKEN,
    "Bearer",
    "Bearer " + "A" * 6000,
    b"Bearer \xff\xfe",
    f"Bearer {TOKEN[:-1]}\u00e9".encode(),
]


@pytest.mark.parametrize("auth", BAD_AUTH, ids=[repr(a)[:24] for a in BAD_AUTH])
def test_missing_or_wrong_tokens_get_401_everywhere(agent_url, auth):
    h = {} if auth is None else {"Authorization": auth}
    ev = {"request_id": "sneaky", "t": time.time(), "prompt_tokens": 1, "output_tokens": 1}
    for method, path, kw in [
        ("GET", "/v1/energy", {}),
        ("GET", "/metrics", {}),
        ("GET", "/v1/energy/ref", {}),
        ("POST", "/v1/progress", {"json": {"events": [ev]}}),
    ]:
        r = httpx.request(method, f"{agent_url}{path}", headers=h, **kw)
        assert r.status_code == 401, (path, r.status_code, r.text[:200])
        assert r.headers.get("WWW-Authenticate", "").startswith("Bearer")
        one_line_error(r)
    assert httpx.get(f"{agent_url}/v1/energy/sneaky", headers=AUTH).status_code == 404
    assert httpx.get(f"{agent_url}/healthz").status_code == 200
    assert metric(agent_url, 'energy_router_agent_http_rejected_total{status="401"}') >= 4


# -- vLLM counters ---------------------------------------------------------------------------------------
def test_non_finite_vllm_counters_do_not_poison_the_window():
    def metrics_app() -> web.Application:
        async def metrics(_: web.Request) -> web.Response:
            return web.Response(text="vllm:prompt_tokens_total NaN\nvllm:generation_tokens_total +Inf\n")

        a = web.Application()
        a.router.add_get("/metrics", metrics)
        return a

    with ThreadedApp(metrics_app) as v:
        agent = EnergyAgent(
            SimulatedMeter(power_w=300.0), AgentConfig(token=TOKEN, sample_hz=20, vllm_metrics_url=f"{v.url}/metrics")
        )
        with ThreadedApp(agent.app) as srv:
            time.sleep(0.3)
            now = time.time()
            ev = [
                {"request_id": "r", "t": now - 0.2, "prompt_tokens": 0, "output_tokens": 0},
                {"request_id": "r", "t": now, "prompt_tokens": 10, "output_tokens": 5, "finished": True},
            ]
            httpx.post(f"{srv.url}/v1/progress", json={"events": ev}, headers=AUTH)
            time.sleep(0.3)
            e = httpx.get(f"{srv.url}/v1/energy/r", params={"final": "1"}, headers=AUTH).json()["energy_j"]
            assert e is not None and math.isfinite(e) and e > 0
            w = httpx.get(f"{srv.url}/v1/energy", headers=AUTH).json()["window"]
            assert all(math.isfinite(x) for k, x in w.items() if k.endswith("_j")), w
            assert metric(srv.url, "energy_router_agent_vllm_scrape_errors_total") > 0


@pytest.mark.parametrize(
    "answer",
    [
        '{"energy_j": NaN, "settled": true}',
        '{"energy_j": -50.0, "settled": true}',
        '{"energy_j": 5.0, "avg_power_w": "x", "settled": true}',
        "<html>proxy error</html>",
        "[1, 2]",
    ],
)
def test_the_agent_meter_takes_no_figure_from_a_bad_200(answer):
    """What sits between the proxy and the agent may answer 200 with anything: a non-finite or negative figure, or
    a body that is not the agent's JSON, is no figure (the estimate's fallback), never a settled wrong one."""
    from litellm_energy_router.agent.client import AgentMeter
    from litellm_energy_router.energy.meter import RequestUsage

    async def energy(_):
        return web.Response(text=answer, content_type="application/json")

    def app():
        a = web.Application()
        a.router.add_get("/v1/energy/{rid}", energy)
        return a

    with ThreadedApp(app) as srv:
        m = AgentMeter(srv.url, token=TOKEN)
        usage = RequestUsage(
            request_id="r1", candidate="m", start_s=1.0, end_s=2.0, prompt_tokens=3, completion_tokens=4
        )
        got = m.energy_for_request(usage, final=True)
        m.close()
    assert got is not None and got.energy_j is None


def test_a_hung_agent_costs_the_writer_one_timeout_not_one_per_row():
    """An agent that accepts connections and never answers: each waiting row cost the table writer the full
    ``agent_timeout_s`` on every pass (20 s for 10 rows); after one timeout the meter backs off, the rows wait, and
    final answers take no figure (the estimate's, with ``fallback_to_estimate``)."""
    import socket
    import threading

    from litellm_energy_router.agent.client import AgentMeters
    from litellm_energy_router.energy.meter import RequestUsage

    srv = socket.socket()
    srv.bind(("127.0.0.1", 0))
    srv.listen(64)
    held = []

    def accept():
        while True:
            try:
                held.append(srv.accept()[0])
            except OSError:
                return

    threading.Thread(target=accept, daemon=True).start()
    meter = AgentMeters(f"http://127.0.0.1:{srv.getsockname()[1]}", {}, timeout_s=0.5)
    try:
        now = time.time()
        usages = [RequestUsage(f"c{i}", "small", now - 2, now - 1, None, 10, 10) for i in range(10)]
        t0 = time.monotonic()
        answers = [meter.energy_for_request(u) for u in usages]
        took = time.monotonic() - t0
        assert answers == [None] * 10 and took < 2.5, took  # one timeout (0.5 s), not ten (5 s)
        final = meter.energy_for_request(usages[0], final=True)
        assert final is not None and final.energy_j is None
    finally:
        meter.close()
        srv.close()
        for c in held:
            c.close()
