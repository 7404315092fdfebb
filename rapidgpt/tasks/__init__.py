"""Black-box tasks: `rapidgpt --task NAME` runs them with no user file."""
