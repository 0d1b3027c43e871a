"""The controller: ingest reports, apply rules, open incidents, act safely, record it all."""
