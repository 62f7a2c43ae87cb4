"""`flare ... --help` text: every flag shows its default."""

from __future__ import annotations

import argparse


class DefaultsHelp(argparse.HelpFormatter):
    """Appends "(default: X)" to a flag's help unless the help already names its default; switches
    (store_true/store_false) say "(off by default)" or "(on by default)"."""

    def __init__(self, prog, **kw):
        kw.setdefault("max_help_position", 34)
        super().__init__(prog, **kw)

    def _get_help_string(self, action: argparse.Action) -> str:
        text = action.help or ""
        if text is argparse.SUPPRESS or "default" in text or not action.option_strings:
            return text
        if isinstance(action, argparse._StoreTrueAction):
            return f"{text} (off by default)"
        if isinstance(action, argparse._StoreFalseAction):
            return text  # a --no-X switch: X is on by default, which its help says
        if action.default is None or action.default is argparse.SUPPRESS:
            return text
        return f"{text} (default: %(default)s)"


def groups_first(parser: argparse.ArgumentParser, *titles: str) -> None:
    """Show the argument groups named `titles` last, in that order (argparse shows groups in
    creation order)."""
    for title in titles:
        group = next(g for g in parser._action_groups if g.title == title)
        parser._action_groups.remove(group)
        parser._action_groups.append(group)
