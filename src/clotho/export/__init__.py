"""Exports of scored trajectories for other tools: SFT training files (`clotho.export.sft`)."""

from clotho.export.sft import SftFormat, SftOptions, Trajectory
from clotho.export.writer import SftExporter, SftStats, export_sft

__all__ = ["SftExporter", "SftFormat", "SftOptions", "SftStats", "Trajectory", "export_sft"]
