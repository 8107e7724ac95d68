"""backends/pallas_tpu."""
