"""What the daemon and the trainer share about engines: backends, builders and the versioned store."""
