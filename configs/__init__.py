"""Model shapes, output records and the arch constants: data only, the ground every floor reads."""
