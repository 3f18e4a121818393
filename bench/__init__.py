"""Benchmarks for ojs-adapters: ``python -m bench`` prints a table and writes JSON."""
