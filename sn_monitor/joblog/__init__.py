"""Training-log analysis: what a job's own log lines say about why it failed."""
