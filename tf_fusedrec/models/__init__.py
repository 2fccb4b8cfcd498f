"""Recommendation models that take a FusedEmbedding or a PerFeatureEmbedding."""

from tf_fusedrec.models.dcn import DCNv2
from tf_fusedrec.models.dlrm import DLRM
from tf_fusedrec.models.grm import GRM

__all__ = ["DCNv2", "DLRM", "GRM", "build_model"]


def build_model(name, embedding, **kwargs):
    """A model by config name: "dlrm", "dcn" (DCN-v2) or "grm" (HSTU blocks and an MMoE head)."""
    models = {"dlrm": DLRM, "dcn": DCNv2, "grm": GRM}
    if name not in models:
        raise ValueError(f"model.name must be one of {sorted(models)}, got {name!r}")
    return models[name](embedding, **kwargs)
