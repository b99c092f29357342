"""Fixtures shared by the kernel and Ascend test files."""

from __future__ import annotations

import ir_version
import pytest
from fake_cann import FakeCann, build

import otfuse

ir_version.install()  # onnx newer than onnxruntime: the models tests build must still load


@pytest.fixture(scope="module")
def library() -> str:
    """The built custom-op library every kernel test loads into its sessions."""
    return otfuse.library_path()


@pytest.fixture
def fake(monkeypatch, tmp_path) -> FakeCann:
    """The CANN test double, built once, logging this test's calls to its own file."""
    return FakeCann(build(), tmp_path / "calls.jsonl", monkeypatch)
