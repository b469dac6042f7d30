"""A role's settings at start and on SIGHUP: its table of the --config
file, then the flags given (which win), checked as one; on SIGHUP the file
is read again, the role takes what it can live (netskel.config.take_live),
the log names what waits for a restart, and a file that no longer reads
leaves the running settings as they are."""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from netskel.config import Config, load_config, role_config, take_live
from netskel.errors import InputError, NetskelError

if TYPE_CHECKING:
    from netskel.metrics import ConfigGauges

log = logging.getLogger(__name__)


def settings_of(path: str | None, role: str, flags: dict[str, Any]) -> Any:
    """The role's settings: the file's table (defaults without a file),
    then the flags given (None: not given). A server needs a topology from
    one or the other."""
    cfg = role_config(load_config(path) if path else Config(), role, flags)
    if role != "agent" and not cfg.topology:
        raise InputError(f"{role}: no topology: give --topology or `topology` in [{role}] of "
                         "--config")
    return cfg


def reloader(path: str | None, role: str, flags: dict[str, Any],
             running: Callable[[], Any], take: Callable[[Any], None],
             gauges: ConfigGauges | None = None) -> Callable[[], None] | None:
    """What SIGHUP does (None without a file: SIGHUP then stops the role,
    as it always would). `gauges`: the role's
    netskel_config_last_reload_*, set here for the read at start too."""
    if gauges is not None:
        gauges.read(True)
    if not path:
        return None

    def reload() -> None:
        try:
            now, later = take_live(running(), settings_of(path, role, flags), role)
        except NetskelError as e:
            log.error("%s: %s not reloaded, the running settings stay: %s", role, path, e)
            if gauges is not None:
                gauges.read(False)
            return
        take(now)
        if gauges is not None:
            gauges.read(True)
        log.warning("%s: %s reloaded%s", role, path,
                    f"; a restart applies {', '.join(later)}" if later else "")
    return reload
