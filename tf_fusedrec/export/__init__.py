"""Exporting a trained model for serving: the dense part as a SavedModel, the tables as shards of (key, row)."""
