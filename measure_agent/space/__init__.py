"""Schedule spaces: knobs, constraints and configurations."""

from measure_agent.space.knobs import BoolKnob, ChoiceKnob, ConfigError, Knob, SplitKnob, powers_of_two
from measure_agent.space.space import Config, ConfigSpace, Constraint

__all__ = [
    "BoolKnob",
    "ChoiceKnob",
    "Config",
    "ConfigError",
    "ConfigSpace",
    "Constraint",
    "Knob",
    "SplitKnob",
    "powers_of_two",
]
