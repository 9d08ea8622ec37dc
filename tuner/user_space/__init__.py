"""User-defined tuning spaces (``tune_params`` + restrictions) and :func:`tune_function`."""

from tuner.user_space.api import TuneResult, UserSpace, tune_function
from tuner.user_space.restrictions import Restriction, RestrictionError, parse_restriction

__all__ = ["Restriction", "RestrictionError", "TuneResult", "UserSpace", "parse_restriction", "tune_function"]
