"""Serving an export (fr.export): embedding servers over gRPC, a ranker over HTTP, an adaptive cache, a load test."""
