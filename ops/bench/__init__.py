"""Benchmarks: the result schema, foreign-result importers, shipped prompt sets and reports."""
