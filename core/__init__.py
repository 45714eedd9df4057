"""tuneline: fine-tuning stages as a plain library (no Prefect imports here)."""
