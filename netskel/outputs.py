"""Where commands write: checked before the work (a typo in `-o` must not
cost a whole run and then its answer) and written all or nothing (a
failed run leaves no partial output)."""

from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path
from typing import IO, Any

from netskel.errors import OutputError


def output_file(path: str | Path) -> Path:
    """An output file's place, checked before the work. What no check can
    foresee (a full disk) fails the write itself, in one line."""
    p = Path(path)
    if p.is_dir():
        raise OutputError(f"{p}: is a directory, not a file to write")
    if not p.parent.is_dir():
        raise OutputError(f"{p}: no directory '{p.parent}' to write it in")
    if not os.access(p.parent, os.W_OK):
        raise OutputError(f"{p}: directory '{p.parent}' is not writable")
    return p


def output_dir(path: str | Path) -> Path:
    """An output directory, made if missing; a file in its place is one error."""
    p = Path(path)
    try:
        p.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise OutputError(f"{p}: cannot make the output directory ({e.strerror})") from None
    return p


def write_json_atomic(path: str | Path, doc: Any) -> None:
    """Write all or nothing: a failed run leaves no partial output."""
    p = Path(path)
    try:
        fd, tmp = tempfile.mkstemp(dir=p.parent if str(p.parent) else ".", prefix=f".{p.name}.")
    except OSError as e:
        raise OutputError(f"{p}: cannot write ({e.strerror})") from None
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            _dump(doc, f, "")
            f.write("\n")
        os.replace(tmp, p)
    except OSError as e:
        Path(tmp).unlink(missing_ok=True)
        raise OutputError(f"{p}: cannot write ({e.strerror})") from None
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def _dump(v: Any, f: IO[str], pad: str) -> None:
    """Indented JSON whose innermost lists and objects (scalars only) sit on
    one line: readable, and written by json's C encoder. `indent=` would
    route everything through the pure-Python encoder, three times slower on
    a 32K-endpoint ping list (11 s against 3 s for its 550 MB). A list is
    laid out by its first item (our lists are all scalars or all
    containers): scanning 13 M ping-list ids to learn that took a second."""
    if isinstance(v, dict) and any(isinstance(x, (dict, list)) for x in v.values()):
        inner = pad + " "
        f.write("{")
        for n, (k, x) in enumerate(v.items()):
            f.write(("," if n else "") + "\n" + inner + json.dumps(str(k)) + ": ")
            _dump(x, f, inner)
        f.write("\n" + pad + "}" if v else "}")
    elif isinstance(v, list) and v and isinstance(v[0], (dict, list)):
        inner = pad + " "
        f.write("[")
        for n, x in enumerate(v):
            f.write(("," if n else "") + "\n" + inner)
            _dump(x, f, inner)
        f.write("\n" + pad + "]")
    else:
        f.write(json.dumps(v))
