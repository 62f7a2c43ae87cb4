"""Flag combinations checked before the model loads.

The torch engine takes 10-60 s to load a model and prepare its graphs; a combination that cannot
be served (a baseline scheduler with speculation, a prefill chunk longer than the context, mixed
graphs too large for the prefill chunks, ...) must be refused before that, not after. The checks
are the backend's own: the same options are built once on the model-free sim engine (a catalog
of the same kinds and capacities, in milliseconds), so every rule lives in one place.
"""

from __future__ import annotations

import dataclasses
import pathlib

from helios.errors import ConfigError
from helios.server.backend import EngineOptions, build_backend, check_device, weight_format


def preflight(options: EngineOptions) -> None:
    """ConfigError (naming the option) for any combination the engine would refuse after loading."""
    if options.engine != "torch":
        return  # the sim engine builds in milliseconds: its own checks come at once
    weights = weight_format(options)
    if options.tensor_parallel > 1 and weights != "fp32":
        raise ConfigError("weights", "tensor parallelism shards fp32 weights only")
    if weights == "gguf" and options.model is not None and pathlib.Path(options.model).is_dir():
        raise ConfigError("weights", "--weights gguf serves a GGUF file's quantized blocks; a Hugging Face "
                                     "directory is served as fp32 (or bf16, int8)")
    if options.device != "cpu":  # torch loads here only for another device
        check_device(options.device)
    build_backend(dataclasses.replace(options, engine="sim", warmup=False))
