"""Sensors (placeholder)."""

all_sensors: list = []
