"""The Dagster code location: assets, checks, jobs, schedules and resources over the ML core."""
