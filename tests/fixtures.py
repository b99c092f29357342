"""The committed exported models (models/fixtures) and what their manifest says they contain."""

from __future__ import annotations

import json
from pathlib import Path

FIXTURES = Path(__file__).resolve().parent.parent / "models" / "fixtures"
MANIFEST = json.loads((FIXTURES / "manifest.json").read_text())["fixtures"]


def fixture_entries() -> dict[str, dict]:
    """name (file stem) -> manifest entry."""
    entries = MANIFEST if isinstance(MANIFEST, list) else list(MANIFEST.values())
    return {Path(e["file"]).stem: e for e in entries}


def fixture_path(name: str) -> Path:
    return FIXTURES / f"{name}.onnx"
