"""Schedule spaces: knobs, constraints and configurations."""

from measure_agent.space.expressions import Restriction, RestrictionError, parse_restriction, restriction_constraint
from measure_agent.space.knobs import BoolKnob, ChoiceKnob, ConfigError, Knob, SplitKnob, powers_of_two
from measure_agent.space.space import Config, ConfigSpace, Constraint, canonical_config_text, config_digest

__all__ = [
    "BoolKnob",
    "ChoiceKnob",
    "Config",
    "ConfigError",
    "ConfigSpace",
    "Constraint",
    "Knob",
    "Restriction",
    "RestrictionError",
    "SplitKnob",
    "canonical_config_text",
    "config_digest",
    "parse_restriction",
    "powers_of_two",
    "restriction_constraint",
]
