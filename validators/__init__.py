"""validators."""
