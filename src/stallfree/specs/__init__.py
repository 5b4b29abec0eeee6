"""Model and hardware specs: the numbers the cost model and the engine are built from.

Presets and user files both go through the same validating constructors, so a bad spec is one
clear ``ValueError`` wherever it comes from.
"""

from stallfree.specs.hardware import (
    HARDWARE_PRESETS,
    HardwareSpec,
    hardware_spec_from_dict,
    load_hardware_spec,
)
from stallfree.specs.model import ModelSpec, load_model_spec
from stallfree.specs.model_presets import MODEL_PRESETS

__all__ = [
    "HARDWARE_PRESETS",
    "MODEL_PRESETS",
    "HardwareSpec",
    "ModelSpec",
    "hardware_spec_from_dict",
    "load_hardware_spec",
    "load_model_spec",
]
