"""Grid carbon intensity (energy/carbon.py): the hourly CSV, sites and PUE, stale data, bad input as one
line naming the file and line or the field (exit 2 from the CLI)."""

from __future__ import annotations

import re
from datetime import datetime, timezone

import pytest
import yaml

from litellm_energy_router.energy.carbon import (
    CarbonError,
    CarbonModel,
    CarbonSettings,
    SiteSettings,
    load_intensity_csv,
)
from litellm_energy_router.metrics import CARBON_FALLBACKS
from litellm_energy_router.settings import ConfigError, load_settings


def t_at(hour: int, day: int = 5) -> float:
    return datetime(2026, 12, day, hour, 30, tzinfo=timezone.utc).timestamp()


def write(tmp_path, text, name="intensity.csv"):
    p = tmp_path / name
    p.write_text(text)
    return p


def fallbacks(reason: str) -> float:
    return CARBON_FALLBACKS.labels(reason=reason)._value.get()


def test_daily_profile_and_pue(tmp_path):
    rows = "".join(f"north,{h},{100 + h}\nsouth,{h},{500 - h}\n" for h in range(24))
    csv = write(tmp_path, "region,hour,g_co2e_per_kwh\n" + rows)
    cfg = CarbonSettings(
        intensity_csv=csv,
        default_site="a",
        sites={
            "a": {"pue": 1.2, "region": "north"},
            "b": {"pue": 1.5, "region": "south"},
            "c": {"intensity_g_per_kwh": 300},
        },
    )
    m = CarbonModel(cfg)
    assert m.intensity("a", t_at(14)) == 114 and m.intensity("b", t_at(3)) == 497
    # 3.6e6 J = 1 kWh: 1 kWh x PUE 1.5 x 497 g/kWh
    assert m.grams(3.6e6, "b", t_at(3)) == pytest.approx(1.5 * 497)
    assert m.grams(360.0, "c", t_at(0)) == pytest.approx(360 / 3.6e6 * 300)
    assert m.site_of({"energy_router_site": "b"}) == "b" and m.site_of({}) == "a"
    before = fallbacks("unknown_site")
    assert m.site_of({"energy_router_site": "mars"}) == "a"
    assert fallbacks("unknown_site") == before + 1


def test_timed_series_stale_uses_last_known_value_and_is_counted(tmp_path):
    csv = write(tmp_path, "region,hour,g_co2e_per_kwh\nDE,2026-12-05T10:00:00Z,400\nDE,2026-12-05T11:00Z,380\n")
    m = CarbonModel(CarbonSettings(intensity_csv=csv, sites={"fra": {"pue": 1.1, "region": "DE"}}))
    assert m.intensity("fra", t_at(11)) == 380
    before = fallbacks("stale")
    assert m.intensity("fra", t_at(15)) == 380  # no row for 15:00: the last known value, counted, no error
    assert fallbacks("stale") == before + 1
    assert m.grams(3.6e6, "fra", t_at(15)) == pytest.approx(1.1 * 380)


def test_provider_error_falls_back_to_last_known(tmp_path):
    class Flaky:
        calls = 0

        def intensity(self, region, t_s):
            Flaky.calls += 1
            if Flaky.calls > 1:
                raise TimeoutError("provider down")
            return 250.0

    # a provider passed in directly (a registered one is selected by carbon.provider: <name>)
    cfg = CarbonSettings.model_construct(
        sites={"x": SiteSettings(region="R")}, default_site=None, intensity_csv=None, provider=None, provider_options={}
    )
    m = CarbonModel(cfg, provider=Flaky())
    assert m.intensity("x", t_at(1)) == 250.0
    before = fallbacks("provider_error")
    assert m.intensity("x", t_at(2)) == 250.0
    assert fallbacks("provider_error") == before + 1


def test_a_provider_s_non_number_is_its_error_not_the_request_s(tmp_path):
    """A provider answering the string "412" raised TypeError out of grams(): the writer's whole pass of rows was
    dropped (and a carbon-objective request failed open)."""

    class Stringy:
        def intensity(self, region, t_s):
            return "412" if t_s < t_at(2) else object()

    cfg = CarbonSettings.model_construct(
        sites={"x": SiteSettings(region="R")}, default_site=None, intensity_csv=None, provider=None, provider_options={}
    )
    m = CarbonModel(cfg, provider=Stringy())
    assert m.intensity("x", t_at(1)) == 412.0  # a number in a string: read as one
    before = fallbacks("provider_error")
    assert m.grams(3.6e6, "x", t_at(3)) == pytest.approx(412.0)  # not a number: the last known value, counted
    assert fallbacks("provider_error") == before + 1


def test_no_value_for_now_on_a_fresh_process_is_priced_conservatively(tmp_path):
    """A timed series without the current hour, on a process that never saw a value: grams() was None, so a gCO2e
    budget was charged 0 g for ever (100 x 1 kWh under a 1 g hard cap all admitted). Now the region's largest value in
    the file, else the reference intensity."""
    csv = write(tmp_path, "region,hour,g_co2e_per_kwh\nDE,2026-12-05T10:00:00Z,400\nDE,2026-12-05T11:00Z,380\n")
    m = CarbonModel(CarbonSettings(intensity_csv=csv, sites={"fra": {"pue": 1.1, "region": "DE"}}))
    assert m.intensity("fra", t_at(20)) == 400
    cfg = CarbonSettings.model_construct(
        sites={"x": SiteSettings(region="R")},
        default_site=None,
        intensity_csv=None,
        provider=None,
        provider_options={},
        reference_g_per_kwh=450.0,
    )
    m = CarbonModel(cfg, provider=type("Silent", (), {"intensity": lambda self, r, t: None})())
    assert m.grams(3.6e6, "x", t_at(1)) == pytest.approx(450.0)


@pytest.mark.parametrize(
    "body, needle",
    [
        ("DE,3,-5\n", "line 2: field 'g_co2e_per_kwh' = '-5': must be a finite number >= 0"),
        ("DE,3,nan\n", "line 2: field 'g_co2e_per_kwh' = 'nan': must be a finite number >= 0"),
        ("DE,3,\n", "line 2: field 'g_co2e_per_kwh' is missing"),
        ("DE,1,10\nDE,24,10\n", "line 3: field 'hour' = '24': an hour of the day must be 0-23"),
        ("DE,noon,10\n", "line 2: field 'hour' = 'noon'"),
        ("DE,\u00b2,10\n", "line 2: field 'hour' = '\u00b2'"),  # a digit to isdigit(), not to int(): a ValueError
        (",3,10\n", "line 2: field 'region' is missing"),
        ("DE,2025-06-01T10:00:00Z,300\nDE,2025-06-01T10:30:00Z,280\n", "line 3: region 'DE' has hour"),  # half-hourly
        ("DE,3,10\nDE,3,12\n", "line 3: region 'DE' has hour '3' twice"),
    ],
)
def test_bad_csv_is_one_line_naming_file_and_line(tmp_path, body, needle):
    csv = write(tmp_path, "region,hour,g_co2e_per_kwh\n" + body)
    with pytest.raises(CarbonError) as e:
        load_intensity_csv(csv)
    msg = str(e.value)
    assert "\n" not in msg and msg.startswith(str(csv)) and needle in msg


def test_bad_config_refused_in_one_line(tmp_path):
    csv = write(tmp_path, "region,hour,g_co2e_per_kwh\nDE,3,100\n")
    cases = [
        ({"intensity_csv": str(csv), "sites": {"fra": {"region": "FR"}}}, "carbon.sites.fra.region 'FR': not in"),
        ({"sites": {"fra": {"region": "FR"}}}, "carbon.sites.fra: needs intensity_g_per_kwh"),
        ({"sites": {"fra": {"intensity_g_per_kwh": 10}}, "default_site": "nowhere"}, "carbon.default_site 'nowhere'"),
        ({"sites": {"fra": {"intensity_g_per_kwh": -1}}}, "config key 'carbon.sites.fra.intensity_g_per_kwh' = -1"),
        ({"sites": {"fra": {"intensity_g_per_kwh": 10, "pue": 0.5}}}, "config key 'carbon.sites.fra.pue' = 0.5"),
        (
            {"provider": "electricity-maps", "sites": {"fra": {"region": "FR"}}},
            "carbon.provider 'electricity-maps' is not registered",
        ),
    ]
    for carbon, needle in cases:
        cfg = tmp_path / "c.yaml"
        cfg.write_text(yaml.safe_dump({"energy_router": {"carbon": carbon}}))
        with pytest.raises(ConfigError) as e:
            load_settings(cfg, environ={})
        assert "\n" not in str(e.value) and needle in str(e.value), str(e.value)


def test_cli_exits_2_on_a_bad_intensity_file(tmp_path, capsys):
    from litellm_energy_router.cli import main

    csv = write(tmp_path, "region,hour,g_co2e_per_kwh\nDE,3,NaN\n")
    cfg = tmp_path / "c.yaml"
    cfg.write_text(f"energy_router:\n  carbon:\n    intensity_csv: {csv}\n    sites: {{fra: {{region: DE}}}}\n")
    with pytest.raises(SystemExit) as ei:
        main(["report", "--config", str(cfg), "--by", "team"])
    assert ei.value.code == 2
    lines = [ln for ln in capsys.readouterr().err.splitlines() if ln.strip()]
    assert len(lines) == 1 and f"{csv}: line 2: field 'g_co2e_per_kwh' = 'NaN'" in lines[0], lines


def test_a_csv_saved_with_a_bom_reads_and_one_not_utf8_is_one_line(tmp_path):
    """A spreadsheet's UTF-8 byte order mark is not part of the first column's name; bytes that are not UTF-8 are
    one line naming the file."""
    f = tmp_path / "bom.csv"
    f.write_bytes("\ufeffregion,hour,g_co2e_per_kwh\nDE,3,10\n".encode())
    assert load_intensity_csv(f).daily["DE"][3] == 10.0
    f.write_bytes(b"region,hour,g_co2e_per_kwh\nDE,3,\xff\n")
    with pytest.raises(CarbonError, match=rf"^{re.escape(str(f))}: not UTF-8 text"):
        load_intensity_csv(f)
