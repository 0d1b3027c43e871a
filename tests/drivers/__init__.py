"""Stand-ins for the outside systems the action drivers talk to (real local servers)."""
