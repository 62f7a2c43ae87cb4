"""The model shape of a user's Vidur profile (`flare sim report --profile DIR`).

Vidur's attention.csv and mlp.csv time one layer's operators; the model's layer count, the tensor
parallelism to read from the MLP file and the per-graph overhead are not in them. They come from
flags (`--profile-layers`, `--profile-tp`, `--profile-overhead-ms`), else from a small `model.json`
beside the CSVs, e.g. `{"layers": 28, "tensor_parallel": 1, "overhead_ms": 1.5}`, else the defaults
(80 layers, Llama-2-70B; the smallest TP in the MLP file; no overhead). The chosen shape travels
inside the cost-model name (`DIR#layers=28,tp=1,overhead_ms=1.5,comm_us=0`), so worker processes and
results.json see the same model.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, fields, replace
from pathlib import Path

from helios.errors import ConfigError

MODEL_FILE = "model.json"
_KEYS = {"layers": "layers", "tensor_parallel": "tp", "overhead_ms": "overhead_ms",
         "comm_us_per_token_layer": "comm_us"}


@dataclass(frozen=True)
class ProfileShape:
    layers: int = 80
    tp: int | None = None  # None: the smallest num_tensor_parallel_workers in the MLP file
    overhead_ms: float = 0.0
    comm_us: float = 0.0  # TP communication per token and layer

    def __post_init__(self) -> None:
        if isinstance(self.layers, bool) or not isinstance(self.layers, int) or self.layers < 1:
            raise ConfigError("profile", f"layers must be a positive integer, got {self.layers!r}")
        if self.tp is not None and (isinstance(self.tp, bool) or not isinstance(self.tp, int) or self.tp < 1):
            raise ConfigError("profile", f"tensor_parallel must be a positive integer, got {self.tp!r}")
        for name in ("overhead_ms", "comm_us"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) \
                    or value < 0:
                raise ConfigError("profile", f"{name} must be a finite number >= 0, got {value!r}")


def read_shape(directory: str | Path, **flags) -> tuple[ProfileShape, dict[str, str]]:
    """The shape for `directory`: `flags` (None: not given) over its model.json over the defaults;
    and where each value came from ("flag", "model.json" or "default")."""
    path = Path(directory) / MODEL_FILE
    from_file = {}
    if path.is_file():
        try:
            doc = json.loads(path.read_text())
        except ValueError as exc:
            raise ConfigError("profile", f"{path}: not JSON ({exc})") from None
        if not isinstance(doc, dict):
            raise ConfigError("profile", f"{path}: expected an object with {', '.join(_KEYS)}")
        unknown = sorted(set(doc) - set(_KEYS))
        if unknown:
            raise ConfigError("profile", f"{path}: unknown key(s) {', '.join(unknown)}; use {', '.join(_KEYS)}")
        from_file = {_KEYS[k]: v for k, v in doc.items()}
    given = {k: v for k, v in flags.items() if v is not None}
    source = {f.name: "flag" if f.name in given else MODEL_FILE if f.name in from_file else "default"
              for f in fields(ProfileShape)}
    return replace(ProfileShape(), **{**from_file, **given}), source


def encode(directory: str | Path, shape: ProfileShape) -> str:
    """The cost-model name that carries `shape`."""
    return (f"{directory}#layers={shape.layers},tp={shape.tp or 0},overhead_ms={shape.overhead_ms:g},"
            f"comm_us={shape.comm_us:g}")


def decode(name: str) -> tuple[str, ProfileShape] | None:
    """(directory, shape) of a name made by `encode`; None for any other name."""
    directory, sep, body = name.rpartition("#")
    if not sep or not Path(directory).is_dir():
        return None
    values = dict(item.split("=", 1) for item in body.split(","))
    return directory, ProfileShape(int(values["layers"]), int(values["tp"]) or None, float(values["overhead_ms"]),
                                   float(values["comm_us"]))


def describe(directory: str | Path, shape: ProfileShape, tp: int, source: dict[str, str]) -> str:
    return (f"profile {directory}: {shape.layers} layers ({source['layers']}), tensor parallelism {tp} "
            f"({source['tp'] if shape.tp else 'smallest in the MLP file'}), per-graph overhead "
            f"{shape.overhead_ms:g} ms ({source['overhead_ms']}), TP communication {shape.comm_us:g} us per "
            f"token and layer ({source['comm_us']})")
