"""User-defined tuning spaces (``tune_params`` + restrictions) and :func:`tune_function`."""

from tuner.user_space.api import TuneResult, UserSpace, tune_function
from tuner.user_space.cache_file import CacheFile, CacheFileError, prior_from_cache, read_cache_json
from tuner.user_space.restrictions import Restriction, RestrictionError, parse_restriction

__all__ = [
    "CacheFile", "CacheFileError", "Restriction", "RestrictionError", "TuneResult", "UserSpace",
    "parse_restriction", "prior_from_cache", "read_cache_json", "tune_function",
]
