"""VHL's virtual data: untrained generators for a labeled noise dataset, and SupCon calibration."""
