"""Errors the API answers with a status code."""

from __future__ import annotations


class ApiError(Exception):
    """An error answer: HTTP status and a message for the caller."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
