"""Recurring schedules: cron slots, intervals, misfire and jitter (used by the operations)."""
