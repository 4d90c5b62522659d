"""Benchmarks of fieldsales_dagster: floor vs this project vs dlt on the same demo API.

Entry point: ``python -m benchmarks.run`` (or ``make bench``); see ``benchmarks/README.md``.
"""
