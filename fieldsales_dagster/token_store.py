"""Durable store of the current API token (placeholder until the token-store issue lands).

Interface the API client relies on:
    TokenStore.at(path_or_None).current_token(env_token) -> str
"""

from __future__ import annotations

from pathlib import Path


class TokenStore:
    def __init__(self, path: Path | str):
        self.path = Path(path)

    @classmethod
    def at(cls, path: str | None) -> TokenStore:
        return cls(path or "data/fieldsales_token.json")

    def current_token(self, env_token: str) -> str:
        return env_token
