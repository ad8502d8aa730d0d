"""The pipelines scenario's Spark jobs. The plain ones import nothing from twophase."""
