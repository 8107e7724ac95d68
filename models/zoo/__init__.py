"""models/zoo."""
