import pytest

from netskel.config import Reloadable, load_config
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
])
def test_bad_config_is_one_clear_error(tmp_path, text, message):
    p = tmp_path / "c.toml"
    p.write_text(text)
    with pytest.raises(InputError, match=message.replace("(", r"\(").replace(")", r"\)")):
        load_config(p)


def test_bad_reload_keeps_last_good(tmp_path):
    p = tmp_path / "c.toml"
    p.write_text("[agent]\nprobe_rate_hz = 5\n")
    r = Reloadable(p)
    p.write_text("[agent]\nprobe_rate_hz = 'fast'\n")
    assert not r.reload() and "probe_rate_hz" in (r.last_error or "")
    assert r.current.agent.probe_rate_hz == 5.0
    p.write_text("[agent]\nprobe_rate_hz = 20\n")
    assert r.reload() and r.current.agent.probe_rate_hz == 20.0
