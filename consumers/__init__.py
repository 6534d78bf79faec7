"""consumers: modules that turn a producer stage into MMA work."""
