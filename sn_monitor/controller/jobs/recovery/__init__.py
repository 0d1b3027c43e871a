"""Job recovery: the recovery as data (model), its steps (machine), and who drives it."""
