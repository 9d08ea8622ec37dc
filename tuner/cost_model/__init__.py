"""Cost models: learn from measured configs which ones are likely fast."""

from tuner.cost_model.features import FeatureProvider, Featurizer, config_features
from tuner.cost_model.xgb_model import OBJECTIVES, XGBCostModel

__all__ = ["OBJECTIVES", "FeatureProvider", "Featurizer", "XGBCostModel", "config_features"]
