"""Fault-suite fixtures: the pipeline tests' spy on what the trainer updates on."""

from tests.pipeline.conftest import trained  # noqa: F401 - re-exported fixture
