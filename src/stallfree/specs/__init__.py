"""Model and hardware specs: the numbers the cost model and the engine are built from.

Presets and user files both go through the same validating constructors, so a bad spec is one
clear ``ValueError`` wherever it comes from.
"""

from stallfree.specs.model import ModelSpec, load_model_spec
from stallfree.specs.model_presets import MODEL_PRESETS

__all__ = ["MODEL_PRESETS", "ModelSpec", "load_model_spec"]
