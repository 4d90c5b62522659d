"""The DuckDB file: the resource, table swaps, and loading pages into ``raw.*``."""
