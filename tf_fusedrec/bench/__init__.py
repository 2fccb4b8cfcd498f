"""Benchmarks. They print figures; tests never assert on time."""
