"""One view over several supernodes: each has its own controller, the view merges them."""
