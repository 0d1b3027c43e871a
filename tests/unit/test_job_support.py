"""Shared pieces of the job orchestrator tests (no tests here): a recording submit, jobs."""

from __future__ import annotations


