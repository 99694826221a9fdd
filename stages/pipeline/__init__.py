"""The DVC stage commands (prepare, train, score, evaluate) and what they share: the run's
resolved settings and the trained method rebuilt from a saved task."""
