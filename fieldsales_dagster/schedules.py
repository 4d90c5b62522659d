"""The refresh job and its schedule (placeholder)."""

all_jobs: list = []
all_schedules: list = []
