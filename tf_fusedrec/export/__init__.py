"""Exporting a trained model for serving: the dense part as a SavedModel, the tables as parts of (key, row) per group
split by routing range, and a manifest (format: tf_fusedrec/export/format.py).

    fr.export.export_model(model, "exports/m1", example=batch)   # a model in one process
    served = fr.export.load_model("exports/m1")                  # every row in this process
    scores = served.predict(batch)                               # == model(batch, training=False)

`python -m tf_fusedrec.export --config C --model-dir DIR --out EXPORT` exports a training checkpoint of any worker
count.
"""

from tf_fusedrec.export.format import ExportError


def __getattr__(name):  # PEP 562: the writer needs TensorFlow, the format (what servers read) does not
    if name == "export_model":
        from tf_fusedrec import _frameworks  # noqa: PLC0415

        _frameworks.import_tensorflow()
        from tf_fusedrec.export.writer import export_model  # noqa: PLC0415

        return export_model
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def load_model(export_dir, backend=None, pooling=True, packed=True):
    """A model rebuilt from an export in this process (see tf_fusedrec.serve.model.ServingModel): predict(batch)
    equals the training model's call with training=False on the same batch."""
    from tf_fusedrec.serve.model import load_model as load  # noqa: PLC0415  (serve imports export)

    return load(export_dir, backend=backend, pooling=pooling, packed=packed)


__all__ = ["ExportError", "export_model", "load_model"]
