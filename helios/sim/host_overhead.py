"""Vidur's measured host time per engine step, kept apart from graph durations (docs/cost-models.md)."""

from __future__ import annotations

from pathlib import Path

from helios.sim.costmodel import NS_PER_MS, data_path
from helios.sim.vidur_tables import HostOverheadTable

CPU_OVERHEAD_FILE = "vidur_a100_cpu_overheads.csv"


def host_overhead_ns(batch: int, model: str = "meta-llama/Llama-2-70b-hf",
                     data_dir: str | Path | None = None) -> int:
    """Host time per engine step (schedule + sampler + prepare inputs + process outputs), Vidur A100.

    `model` selects the file's rows: "meta-llama/Llama-2-70b-hf" (profiled at TP4) or
    "meta-llama/Llama-2-7b-hf" (TP1), among others in vidur_a100_cpu_overheads.csv.

    Kept out of graph durations on purpose: Helios replays prepared graphs, and a simulator decides
    whether host work overlaps the device. The Splitwise-fitted overhead already absorbs what the
    measured systems paid, so adding this to VidurCostModel durations would count it twice.
    """
    return int(round(_host_table(model, data_dir).ms(batch) * NS_PER_MS))


_HOST_TABLES: dict[tuple[str, str], HostOverheadTable] = {}


def _host_table(model: str, data_dir: str | Path | None) -> HostOverheadTable:
    path = data_path(CPU_OVERHEAD_FILE, data_dir)
    key = (model, str(path))
    if key not in _HOST_TABLES:
        _HOST_TABLES[key] = HostOverheadTable.from_csv(path, model)
    return _HOST_TABLES[key]
