"""epilogues."""
