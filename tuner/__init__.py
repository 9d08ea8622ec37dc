"""tunefleet's tuner: the coordinator that owns the tuning log and drives measurement agents."""
