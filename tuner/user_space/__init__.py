"""User-defined tuning spaces (``tune_params`` + restrictions) and :func:`tune_function`."""

# The restriction parser lives beside the space (measure_agent.space.expressions); users import it from here too.
from measure_agent.space.expressions import Restriction, RestrictionError, parse_restriction
from tuner.user_space.api import TuneResult, UserSpace, tune_function
from tuner.user_space.cache_file import CacheFile, CacheFileError, prior_from_cache, read_cache_json

__all__ = [
    "CacheFile", "CacheFileError", "Restriction", "RestrictionError", "TuneResult", "UserSpace",
    "parse_restriction", "prior_from_cache", "read_cache_json", "tune_function",
]
