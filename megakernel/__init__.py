"""megakernel: compile an LLM layer graph into one Pallas TPU decode-step kernel."""
