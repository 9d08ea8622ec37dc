"""The measurement engine: build candidates in isolated workers, time them, check them."""

from measure_agent.engine.engine import MeasureEngine
from measure_agent.engine.types import MeasureInput, MeasureResult, MeasureStatus, TimingConfig

__all__ = ["MeasureEngine", "MeasureInput", "MeasureResult", "MeasureStatus", "TimingConfig"]
