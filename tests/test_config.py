import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from netskel.config import load_config
from netskel.errors import InputError


def test_defaults_and_overrides(tmp_path):
    p = tmp_path / "c.toml"
    p.write_text('[controller]\nwindow_seconds = 10\nlisten = ["unix:/x"]\n'
                 '[analyzer]\nloss_alpha = 1\n[agent]\nbusy_poll_us = 50\n')
    cfg = load_config(p)
    assert cfg.agent.busy_poll_us == 50
    assert cfg.controller.window_seconds == 10 and cfg.controller.listen == ("unix:/x",)
    assert cfg.analyzer.loss_alpha == 1.0 and cfg.agent.probe_port == 7100


@pytest.mark.parametrize("text, message", [
    ("[controller]\nwindow_secs = 10\n", "unknown key(s) window_secs"),
    ("[nope]\n", "unknown key(s) nope"),
    ("[controller]\nwindow_seconds = 'ten'\n", "expected int, got str"),
    ("[controller]\nwindow_seconds = true\n", "expected int, got bool"),
    ("[controller\n", "malformed TOML"),
    ("[agent]\nbusy_poll_us = -5\n", "agent.busy_poll_us: -5 is negative"),
    ("[agent]\nflows = 0\n", "agent.flows: 0 is not 1..64"),
    ("[agent]\ntunnel_port = 70000\n", "agent.tunnel_port: 70000 is no UDP port"),
    ("[agent]\nprobe_port = 65536\n", "agent.probe_port: 65536 is no port"),
    ("[controller]\nwindow_seconds = 0\n", "controller.window_seconds: must be positive, got 0"),
    ("[controller]\nheartbeat_timeout_s = nan\n", "controller.heartbeat_timeout_s: must be positive"),
    ("[controller]\nreinfer_seconds = -1\n", "controller.reinfer_seconds: must be at least 0"),
    ("[controller]\nmetrics_port = -1\n", "controller.metrics_port: -1 is no port"),
    ("[analyzer]\nloss_alpha = 0\n", "analyzer.loss_alpha: must be in (0, 1], got 0"),
    ("[analyzer]\ndrift_fdr = 1.5\n", "analyzer.drift_fdr: must be in (0, 1], got 1.5"),
    ("[analyzer]\nclose_windows = 0\n", "analyzer.close_windows: must be positive, got 0"),
    ("[analyzer]\nhistory_seconds = -900.0\n", "analyzer.history_seconds: must be positive"),
    ("[analyzer]\nlatency_min_shift_us = -1.0\n", "analyzer.latency_min_shift_us: must be at least 0"),
    ("[analyzer]\ntail_floor = 1.0\n", "analyzer.tail_floor: must be below 1"),
    ("[analyzer]\nlof_neighbors = 11\n", "analyzer.lof_neighbors: 11 is more than the 10"),
])
def test_bad_config_is_one_clear_error(tmp_path, text, message):
    p = tmp_path / "c.toml"
    p.write_text(text)
    with pytest.raises(InputError, match=message.replace("(", r"\(").replace(")", r"\)")):
        load_config(p)


def test_bad_reload_keeps_last_good(tmp_path):
    """The roles' SIGHUP handler (netskel.settings.reloader), run in-process:
    a good file is handed over, a bad one is not, and flags still win."""
    from prometheus_client import CollectorRegistry

    from netskel.config import AgentConfig
    from netskel.metrics import config_gauges
    from netskel.settings import reloader

    registry = CollectorRegistry()
    gauges = config_gauges(registry)

    def gauge(name: str) -> float | None:
        return registry.get_sample_value(f"netskel_config_last_reload_{name}")

    p = tmp_path / "c.toml"
    p.write_text("[agent]\nvswitch_interval_s = 5.0\n")
    running = [AgentConfig(vswitch_interval_s=5.0, trace_interval_s=30.0)]
    reload = reloader(str(p), "agent", {"trace_interval_s": 30.0}, lambda: running[-1],
                      running.append, gauges)
    assert reload is not None and gauge("successful") == 1
    started = gauge("success_timestamp_seconds")
    assert started
    p.write_text("[agent]\nvswitch_interval_s = 'fast'\n")
    reload()
    assert len(running) == 1 and gauge("successful") == 0
    assert gauge("success_timestamp_seconds") == started
    p.write_text("[agent]\nvswitch_interval_s = 2.0\ntrace_interval_s = 9.0\n")
    reload()
    assert (running[-1].vswitch_interval_s, running[-1].trace_interval_s) == (2.0, 30.0)
    assert gauge("successful") == 1 and (gauge("success_timestamp_seconds") or 0) >= started
    assert reloader(None, "agent", {}, lambda: running[-1], running.append) is None


def test_a_flag_wins_over_the_file_and_the_file_over_the_default(tmp_path):
    from netskel.config import role_config

    p = tmp_path / "c.toml"
    p.write_text('[analyzer]\ntopology = "file.json"\nloss_alpha = 0.05\npersist_windows = 2\n')
    cfg = role_config(load_config(p), "analyzer", {"topology": "flag.json", "db": None,
                                                   "persist_windows": 3})
    assert (cfg.topology, cfg.loss_alpha, cfg.persist_windows, cfg.db) == ("flag.json", 0.05, 3, "")
    with pytest.raises(InputError, match="analyzer.persist_windows: must be positive"):
        role_config(load_config(p), "analyzer", {"persist_windows": 0})


def test_a_reload_takes_thresholds_live_and_leaves_the_rest_for_a_restart():
    from netskel.config import AgentConfig, AnalyzerConfig, take_live

    running = AnalyzerConfig(topology="t.json", listen=("127.0.0.1:7001",))
    new = AnalyzerConfig(topology="other.json", listen=("127.0.0.1:7001",), loss_alpha=0.05,
                         lof_history_windows=12)
    now, later = take_live(running, new, "analyzer")
    assert (now.loss_alpha, now.topology, now.lof_history_windows) == (0.05, "t.json", 10)
    assert later == ["topology", "lof_history_windows"]
    assert take_live(now, now, "analyzer") == (now, [])
    # A live value that only fits beside a restart-only one is refused whole.
    with pytest.raises(InputError, match="lof_neighbors"):
        take_live(running, AnalyzerConfig(lof_neighbors=12, lof_history_windows=12), "analyzer")
    agent, later = take_live(AgentConfig(), AgentConfig(probe_rate_hz=20.0, flows=2,
                                                        vswitch_interval_s=2.0), "agent")
    assert agent == AgentConfig(probe_rate_hz=20.0, vswitch_interval_s=2.0)
    assert later == ["flows"]


def test_the_example_settings_file_reads():
    from pathlib import Path

    cfg = load_config(Path(__file__).resolve().parent.parent / "examples" / "analyzer.toml")
    assert cfg.analyzer.web_listen == "127.0.0.1:8080" and cfg.analyzer.close_windows == 4


def test_show_spells_out_every_setting_and_reads_back_the_same(tmp_path, capsys):
    """`netskel config show` prints what a file amounts to (defaults where
    it is silent) as TOML that `load_config` reads back to equal values;
    `check` names the file and the key that cannot work, in one line."""
    from netskel.cli import main
    from netskel.config import Config

    p = tmp_path / "c.toml"
    p.write_text('[agent]\nendpoints = ["c/e0,h/n0,10.0.0.1"]\nprobe_rate_hz = 2\n'
                 '[analyzer]\ndrift_fdr = 1e-3\nweb_listen = "127.0.0.1:8080"\n'
                 '[controller]\nswitch_addresses = "a \\"quoted\\" path\\\\x"\n')
    for args, expected in (([], Config()), ([str(p)], load_config(p))):
        assert main(["config", "show", *args]) == 0
        shown = tmp_path / "shown.toml"
        shown.write_text(capsys.readouterr().out)
        assert load_config(shown) == expected
    assert main(["config", "show", str(p), "--role", "agent"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("[agent]\n") and "[analyzer]" not in out and "probe_rate_hz = 2" in out
    assert main(["config", "check", str(p)]) == 0
    assert capsys.readouterr().out == f"{p}: ok\n"
    p.write_text("[analyzer]\nloss_alpha = 2\n")
    assert main(["config", "check", str(p)]) == 2
    assert capsys.readouterr().err == (f"netskel: error: {p}: analyzer.loss_alpha: must be in "
                                       "(0, 1], got 2\n")


@settings(max_examples=200, deadline=None)
@given(st.one_of(
    st.text(alphabet=st.characters(blacklist_categories=("Cs",)), max_size=20),
    st.floats(), st.integers(-2**63, 2**63 - 1), st.booleans(),
    st.lists(st.text(alphabet=st.characters(blacklist_categories=("Cs",)), max_size=5),
             max_size=3).map(tuple)))
def test_every_value_a_setting_may_hold_reads_back_from_its_toml(value):
    """What `config show` writes for one value, read by TOML's own parser
    (a file can hold no lone surrogate, so neither do these strings)."""
    import math
    import tomllib

    from netskel.config import _toml_value

    got = tomllib.loads(f"x = {_toml_value(value)}")["x"]
    if isinstance(value, float) and math.isnan(value):
        assert math.isnan(got)
    else:
        assert (tuple(got) if isinstance(got, list) else got) == value
        assert type(got) is (list if isinstance(value, tuple) else type(value))
