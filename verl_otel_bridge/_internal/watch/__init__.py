"""``verl-otel-bridge watch``: follow captures as they are written and show the newest step (see :mod:`.live`)."""
