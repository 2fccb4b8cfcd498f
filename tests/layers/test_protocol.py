"""The embedding-layer protocol (tf_fusedrec/layers/protocol.py): the layers are EmbeddingLayers, the optional
methods have the defaults of a layer without the feature, a missing required method fails naming the layer, and
fr.train finds embedding layers by the protocol, not by the names of their methods."""

import pytest
import tensorflow as tf

import tf_fusedrec as fr
from tf_fusedrec.bench.strawman import HandFusedTFRAEmbedding
from tf_fusedrec.layers.protocol import EmbeddingLayer
from tf_fusedrec.train.optimizer import embedding_layers

FEATURES = [fr.Feature("a", 4), fr.Feature("b", 4)]


@pytest.mark.parametrize("make", [
    lambda: fr.FusedEmbedding(FEATURES, name="fused"),
    lambda: fr.PerFeatureEmbedding(FEATURES, name="per_feature"),
    lambda: HandFusedTFRAEmbedding(FEATURES, name="hand_fused"),
], ids=["fused", "per_feature", "hand_fused"])
def test_the_layers_are_embedding_layers(make):
    layer = make()
    assert isinstance(layer, EmbeddingLayer)
    assert embedding_layers(tf.keras.Sequential([layer])) == [layer]
    assert len(layer.optimizer_groups()) >= 1


def test_defaults_of_a_layer_without_the_optional_features():
    layer = fr.PerFeatureEmbedding(FEATURES, name="plain")
    assert layer.replicated_tables() == [] and layer.replicated_variables() == []
    assert layer.after_update(None) is None and layer.statistics() == {}
    assert layer.access_tables() == [None, None] == [None] * len(layer.sharded_tables())


def test_a_missing_required_method_names_the_layer():
    class Incomplete(EmbeddingLayer):
        pass

    layer = Incomplete()
    for method in ("optimizer_groups", "native_tables", "sharded_tables"):
        with pytest.raises(NotImplementedError, match=f"Incomplete.{method}"):
            getattr(layer, method)()


def test_a_layer_with_the_method_names_but_not_the_protocol_is_not_an_embedding_layer():
    class LooksLikeOne(tf.keras.layers.Layer):
        comm = None

        def optimizer_groups(self):
            return []

    assert embedding_layers([LooksLikeOne()]) == []
    with pytest.raises(ValueError, match="no FusedEmbedding or PerFeatureEmbedding layer"):
        fr.train.make_optimizer([LooksLikeOne()])
