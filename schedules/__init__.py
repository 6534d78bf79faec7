"""schedules."""
