"""`netskel <command> --help` is the first page a platform team reads: every
flag says what it does, and every flag with a default names it."""

from __future__ import annotations

import argparse

from netskel.cli import build_parser


def _parsers(p: argparse.ArgumentParser, name: str = "netskel"
             ) -> list[tuple[str, argparse.ArgumentParser]]:
    found = [(name, p)]
    for action in p._actions:
        if isinstance(action, argparse._SubParsersAction):
            for sub_name, sub in action.choices.items():
                found += _parsers(sub, f"{name} {sub_name}")
    return found


def _flags(p: argparse.ArgumentParser) -> list[argparse.Action]:
    return [a for a in p._actions
            if not isinstance(a, (argparse._HelpAction, argparse._SubParsersAction))]


def test_every_flag_of_every_command_says_what_it_does() -> None:
    bare = [f"{name} {'/'.join(a.option_strings) or a.dest}"
            for name, p in _parsers(build_parser()) for a in _flags(p)
            if not (a.help or "").strip()]
    assert not bare, f"flags without help: {bare}"


def test_every_default_is_shown_in_the_help() -> None:
    hidden = []
    for name, p in _parsers(build_parser()):
        formatter = p._get_formatter()  # expands %(default)s as --help does
        for a in _flags(p):
            if a.default is None or a.default is False or a.default == [] or not a.help:
                continue
            shown = formatter._expand_help(a)
            if "default" not in shown:
                hidden.append(f"{name} {'/'.join(a.option_strings)} ({a.default!r})")
    assert not hidden, f"defaults not shown: {hidden}"
