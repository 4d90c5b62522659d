"""Raw assets (placeholder)."""

raw_assets: list = []
