"""Benchmarks of asynclock against the lock libraries people use instead.

Run ``python -m benchmarks`` (``--quick`` for a smoke run). It starts its own
servers on loopback, measures every subject in the same run, and writes a
Markdown table, a JSON file and a PNG chart into ``benchmarks/results/``.
"""
