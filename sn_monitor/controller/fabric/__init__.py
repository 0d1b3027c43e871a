"""The fleet's wiring and its live state: node topologies, link rates, the fleet graph."""
