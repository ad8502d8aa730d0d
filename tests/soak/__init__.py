"""The soak: four streaming queries under a seeded schedule of overlapping faults."""
