"""CuTe DSL kernel shells: each composes device modules and is compiled once per static config."""
