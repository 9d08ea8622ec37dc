"""Measurers: how the tuner gets candidates measured."""

from tuner.measure.base import MeasurementAborted, Measurer, SyncMeasurer
from tuner.measure.local import LocalMeasurer

__all__ = ["LocalMeasurer", "MeasurementAborted", "Measurer", "SyncMeasurer"]
