"""Recommendation models that take a FusedEmbedding or a PerFeatureEmbedding."""

from tf_fusedrec.models.dcn import DCNv2
from tf_fusedrec.models.dlrm import DLRM

__all__ = ["DCNv2", "DLRM", "build_model"]


def build_model(name, embedding, **kwargs):
    """A model by config name: "dlrm" or "dcn" (DCN-v2)."""
    models = {"dlrm": DLRM, "dcn": DCNv2}
    if name not in models:
        raise ValueError(f"model.name must be one of {sorted(models)}, got {name!r}")
    return models[name](embedding, **kwargs)
