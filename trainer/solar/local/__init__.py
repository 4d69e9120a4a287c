"""Running SolarRuns on this machine (no cluster)."""
