"""The values of the ``refresh_mode`` setting, with no dependencies: the warehouse resource (which
never imports the HTTP client) and the run config validate it here."""

from __future__ import annotations

from typing import Literal

REFRESH_MODES = ("auto", "full", "incremental")
RefreshMode = Literal["auto", "full", "incremental"]


def validate_refresh_mode(value: object) -> object:
    """Pydantic ``before`` validator shared by the resource field and the run config."""
    if value is None or type(value).__name__ == "EnvVar":  # resolved and validated at run time
        return value
    if not isinstance(value, str) or value.strip().lower() not in REFRESH_MODES:
        raise ValueError(f"refresh_mode must be one of {', '.join(REFRESH_MODES)}; got {value!r}")
    return value.strip().lower()
