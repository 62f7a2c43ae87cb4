"""Checked reading of Vidur profile CSVs (issue 42): every timing cell the simulator uses must be a
number, and a layer's time may not fall as its token count grows.

An empty cell used to be read as 0 and a layer with it came out cheaper (a published MLP profile
with 94 empty cells made prefill 6% too cheap); a non-numeric cell gave an error that named
neither the file nor the line. Now either is a ProfileError naming file, line and column. With
`repairs` (a list; `flare sim report --profile-repair`), a row with such a cell is dropped instead
(the tables interpolate across it) and each repair is recorded for the caller to report.

Monotonicity: more tokens never make a layer cheaper. Profiled medians wobble, so a drop counts
only past the tolerance, MONOTONE_REL of the largest time at fewer tokens or MONOTONE_MS,
whichever is larger (timer noise on microsecond operators); the published H100 and A100 profiles
have no drop past it. Smaller drops are pooled by the tables' isotonic fit as before; a larger one is an
error, or with `repairs` the same fit, recorded.
"""

from __future__ import annotations

import csv
import math
from dataclasses import dataclass
from pathlib import Path

MONOTONE_REL = 0.2
MONOTONE_MS = 0.01


class ProfileError(ValueError):
    """A profile cell the simulator cannot use, named by file, line and column."""


@dataclass(frozen=True, slots=True)
class Repair:
    path: str
    line: int
    column: int
    name: str
    what: str

    def __str__(self) -> str:
        return f"{self.path}:{self.line}:{self.column}: {self.name}: {self.what}"


def read_rows(path: Path) -> tuple[list[str], list[tuple[int, dict]]]:
    """The header and (line number, row) of each data row."""
    with open(path, newline="") as fh:
        reader = csv.DictReader(fh)
        rows = [(reader.line_num, r) for r in reader]
        return list(reader.fieldnames or ()), rows


def numbers(path: Path, header: list[str], line: int, row: dict, columns, repairs: list | None) -> list[float] | None:
    """The cells `columns` of one row as floats; a ProfileError for an empty or non-numeric one,
    or with `repairs`, None (drop the row) and the repair recorded."""
    out = []
    for name in columns:
        text = (row.get(name) or "").strip()
        problem = None
        if not text:
            problem = "empty cell"
        else:
            try:
                value = float(text)
            except ValueError:
                problem = f"not a number: {text[:40]!r}"
            else:
                if not math.isfinite(value) or value < 0:
                    problem = f"not a finite nonnegative time: {text[:40]!r}"
        if problem is not None:
            column = header.index(name) + 1 if name in header else 0
            if repairs is None:
                raise ProfileError(f"{path}:{line}:{column}: {name}: {problem} (flare sim report "
                                   f"--profile-repair drops such rows and reports them)")
            repairs.append(Repair(str(path), line, column, name, f"{problem}; row dropped"))
            return None
        out.append(value)
    return out


def check_monotone(path: Path, header: list[str], points: list[tuple[float, int, float, str]],
                   repairs: list | None, what: str) -> None:
    """`points` (work, line, time, column), in increasing work: a drop past the tolerance is a
    ProfileError, or with `repairs` recorded (the table's isotonic fit pools it)."""
    top = 0.0
    for work, line, value, name in points:
        if top - value > max(MONOTONE_REL * top, MONOTONE_MS):
            column = header.index(name) + 1 if name in header else 0
            message = (f"{what} at {work:g} tokens is {value:.4g} ms, below {top:.4g} ms at fewer tokens (more than "
                       f"{MONOTONE_REL:.0%} or {MONOTONE_MS} ms)")
            if repairs is None:
                raise ProfileError(f"{path}:{line}:{column}: {name}: {message} (--profile-repair smooths it)")
            repairs.append(Repair(str(path), line, column, name, message + "; smoothed"))
        top = max(top, value)
