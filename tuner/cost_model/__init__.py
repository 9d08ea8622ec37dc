"""Cost models: learn from measured configs which ones are likely fast."""

from tuner.cost_model.features import config_features
from tuner.cost_model.xgb_model import XGBCostModel

__all__ = ["XGBCostModel", "config_features"]
