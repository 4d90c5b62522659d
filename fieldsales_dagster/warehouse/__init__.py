"""The lake: attaching it, committing, upkeep and export (lake.py); the resource (warehouse.py)."""
